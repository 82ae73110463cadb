"""Figures that hold text: no text region is dropped for looking like a picture.

The projection layout types a block a figure by its shape: dense ink, or ink rows running on
for several line heights. Text takes that shape too: a code listing with a rule down its side,
an example table whose vertical rules join its rows, prose set too close to them to be parted,
lines blurred into each other in a photograph. A figure is not read, so such a block's text
was lost. Two steps keep it:

- `text_in_figures`: a figure region whose ink is mostly glyphs (`glyph_share`: components
  no taller than a text line, rules left out) is laid out again by the projection layout's
  own typing, the bands taller than a text line cut off and typed on their own (a
  ruled table stays a table). What comes back a figure and is
  still mostly glyphs is text whose lines touch: it is typed text.
- `picture_lines`: a figure that is a picture keeps its type, and the lines of glyphs in it
  (a diagram's labels, a screenshot's words) are its lines, read as its text (the figure's
  alt text in markdown, its `text` in the JSON).
"""

from __future__ import annotations

import numpy as np

from gravityocr.pipelines.line_splitters import ProjectionLines
from gravityocr.pipelines.projection_layout import ProjectionLayout
from gravityocr.pipelines.regions import Box, PageStats, Region, is_rule, runs, trim

GLYPH = 1.5  # a component no taller than this many line heights is a glyph (or glyphs joined along a line)
TEXT_SHARE = 0.8  # a figure whose non-rule ink is at least this share glyphs holds text
MIN_GLYPHS = 3


def _components(mask: np.ndarray, box: Box):
    import cv2

    x0, y0, x1, y1 = box
    return cv2.connectedComponentsWithStats(mask[y0:y1, x0:x1].astype(np.uint8), connectivity=8)


def _kinds(stats: np.ndarray, line_height: float) -> tuple[np.ndarray, np.ndarray]:
    """For each component (row of cv2's stats, background first): whether it is a rule (a
    thin, long, solid line across or down) and whether it is a glyph (no taller than GLYPH
    line heights, and narrow or not solid: a word's letters, not a filled bar)."""
    width, height, area = stats[:, 2], stats[:, 3], stats[:, 4]
    rule = np.array([is_rule(w, h, a, line_height) or is_rule(h, w, a, line_height)
                     for w, h, a in zip(width.tolist(), height.tolist(), area.tolist())])
    glyph = (height <= GLYPH * line_height) & ((width <= GLYPH * line_height) | (area <= 0.6 * width * height))
    rule[0] = glyph[0] = False  # the background
    return rule, glyph & ~rule


def glyph_share(mask: np.ndarray, box: Box, line_height: float) -> tuple[float, int]:
    """The share of the ink in `box` that lies in glyphs, rules not counted, and how many
    glyphs there are."""
    _, _, stats, _ = _components(mask, box)
    rule, glyph = _kinds(stats, line_height)
    area = stats[:, 4]
    counted = int(area[~rule][1:].sum()) if len(area) > 1 else 0
    return (float(area[glyph].sum()) / counted if counted else 0.0), int(glyph.sum())


def holds_text(mask: np.ndarray, box: Box, line_height: float) -> bool:
    """Whether the ink in `box` is text: MIN_GLYPHS glyphs or more, TEXT_SHARE of it or more."""
    share, glyphs = glyph_share(mask, box, line_height)
    return glyphs >= MIN_GLYPHS and share >= TEXT_SHARE


def _relayout(image, mask: np.ndarray, box: Box, stats: PageStats) -> list[Region]:
    """`box`'s ink laid out on its own: bands taller than a text line (a ruled table, lines
    that touch) cut off and typed alone, the rest by the projection layout."""
    projection = ProjectionLayout()
    x0, y0, x1, y1 = box
    rest = np.zeros_like(mask)
    rest[y0:y1, x0:x1] = mask[y0:y1, x0:x1]
    regions = []
    for a, b in runs(rest[y0:y1, x0:x1].any(axis=1), 1):
        if b - a > GLYPH * stats.line_height:
            band = trim(rest, (x0, y0 + a, x1, y0 + b))
            kind = projection.shape_type(mask, band, stats)
            regions.append(Region(band, kind))
            rest[band[1]:band[3], band[0]:band[2]] = False
    if rest.any():
        regions += projection.detect(image, rest)
    for region in regions:
        if region.type == "figure" and holds_text(mask, region.bbox, stats.line_height):
            region.type = "text"  # glyphs whose lines touch
    return regions


def text_in_figures(image, mask: np.ndarray, regions: list[Region]) -> list[Region]:
    """`regions` with every figure that holds text (`holds_text`) replaced by the regions
    its ink is laid out as; the others as they are. `mask`: the ink the layout saw."""
    stats = PageStats.of(mask)
    out = []
    for region in regions:
        if region.type == "figure" and holds_text(mask, region.bbox, stats.line_height):
            out += _relayout(image, mask, region.bbox, stats)
        else:
            out.append(region)
    return out


def picture_lines(mask: np.ndarray, box: Box, line_height: float) -> list[Box]:
    """The lines of glyphs inside a picture, top to bottom: the projection line splitter on
    its glyphs alone, each line kept when it holds two glyphs or more, is no taller than a
    text line, and most of the ink in its box is glyphs (not a curve or a shaded area
    crossing it)."""
    _, labels, stats, _ = _components(mask, box)
    _, glyph = _kinds(stats, line_height)
    if glyph.sum() < 2:
        return []
    x0, y0, x1, y1 = box
    glyphs = np.zeros_like(mask)
    glyphs[y0:y1, x0:x1] = glyph[labels]
    lines = []
    for line in ProjectionLines().split(None, glyphs, box):
        lx0, ly0, lx1, ly1 = line
        inside = labels[ly0 - y0:ly1 - y0, lx0 - x0:lx1 - x0]
        ink = inside > 0
        glyph_ink = glyph[inside] & ink
        if (ly1 - ly0 <= GLYPH * line_height and len(np.unique(inside[glyph_ink])) >= 2
                and glyph_ink.sum() >= 0.8 * ink.sum()):
            lines.append(line)
    return lines
