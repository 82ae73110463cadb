"""The projection layout backend: `ProjectionLayout` finds typed regions on a page image
(unordered) from whitespace gaps, ruling lines and stroke width, numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from gravityocr.pipelines.regions import Box, PageStats, Region, overlap, rule_stacks, runs, stroke_widths, trim


@dataclass
class ProjectionLayout:
    """Rule-based layout from whitespace: recursive XY cuts on the ink mask give blocks;
    each block is typed by what it looks like (ruling lines: table; dense or one tall ink
    mass: figure; large or heavy strokes: title; narrow and centred: formula; small text
    next to a figure or table: caption; a line in the top/bottom margin: header/footer).

    Deterministic and dependency-free; good on clean born-digital and synthetic pages,
    blind to what needs reading (it never says `reference`)."""

    name: str = "projection"
    # A vertical gap wider than the page's typical line gap plus this many line heights splits
    # blocks: two lines with neither descenders nor ascenders sit further apart than usual.
    paragraph_gap: float = 0.75
    column_gap: float = 1.5  # a horizontal gap of this many line heights splits blocks
    margin_fraction: float = 0.06  # header/footer band at the top/bottom of the page

    def blocks(self, mask: np.ndarray, stats: PageStats) -> list[Box]:
        min_gap_y = max(4, int(round(stats.line_gap + self.paragraph_gap * stats.line_height)))
        min_gap_x = max(8, int(round(self.column_gap * stats.line_height)))
        out: list[Box] = []
        stack = [(0, 0, mask.shape[1], mask.shape[0])]
        while stack:
            box = trim(mask, stack.pop())
            if box is None:
                continue
            x0, y0, x1, y1 = box
            sub = mask[y0:y1, x0:x1]
            row_spans = runs(sub.any(axis=1), min_gap_y)
            if len(row_spans) > 1:
                stack.extend((x0, y0 + a, x1, y0 + b) for a, b in row_spans)
                continue
            col_spans = runs(sub.any(axis=0), min_gap_x)
            if len(col_spans) > 1 and not self._rows_across(sub, col_spans, stats):
                stack.extend((x0 + a, y0, x0 + b, y1) for a, b in col_spans)
                continue
            if (x1 - x0) * (y1 - y0) >= 12:  # specks are not blocks
                out.append(box)
        return out

    def _rows_across(self, sub: np.ndarray, col_spans: list[tuple[int, int]], stats: PageStats) -> bool:
        """Whether the pieces a column gap would cut `sub` into are the cells of rows, read
        across (a grammar's names, `::=` and rules; a listing of terms and their
        descriptions), not columns read one after the other: next to a neighbour, a piece
        with fewer lines (or a narrow one: a few line heights wide, or a third of the widest
        piece) has each line beside one of the neighbour's and spans its height; a single
        row is read across where one piece is wide and the others narrow (a name and `::=`
        before their rule). Two columns of running text have about as many lines each, are
        about as wide, and the shorter one ends early."""
        gap = max(2, int(0.3 * stats.line_height))  # a colon's dots are one line, two lines are not
        bands = [runs(sub[:, a:b].any(axis=1), gap) for a, b in col_spans]
        widest = max(b - a for a, b in col_spans)
        # a piece is narrow beside its neighbour by its own measure or beside the widest: a
        # grammar's names or a listing's terms, never a column of running text
        narrow_piece = lambda a, b: b - a <= 3 * stats.line_height or b - a <= 0.35 * widest
        if all(len(piece) == 1 for piece in bands):  # one row: read across where one piece is wide, the rest narrow
            return sum(not narrow_piece(a, b) for a, b in col_spans) == 1
        if min(len(piece) for piece in bands) < 2:  # one line beside a block says nothing of rows
            return False
        for (left, right), (a, b) in zip(zip(bands, bands[1:]), zip(col_spans, col_spans[1:])):
            sparse, dense = (left, right) if len(left) <= len(right) else (right, left)
            narrow = narrow_piece(*a) or narrow_piece(*b)
            if not (len(sparse) <= 0.75 * len(dense) or narrow):
                return False
            if (sparse[-1][1] - sparse[0][0]) < 0.8 * (dense[-1][1] - dense[0][0]):
                return False
            if not all(any(overlap(band, other) >= 0.5 * min(band[1] - band[0], other[1] - other[0])
                           for other in dense) for band in sparse):
                return False
        return True

    def detect(self, image: Image.Image, mask: np.ndarray) -> list[Region]:
        stats = PageStats.of(mask)
        types: dict[Box, str] = {}
        # a booktabs-style table's rules and rows would be cut apart, and its rows peeled off:
        # it is a block of its own, taken out of the page before the page is cut
        ruled = rule_stacks(mask, stats.line_height)
        types.update((box, "table") for box in ruled)
        rest = mask.copy() if ruled else mask
        for x0, y0, x1, y1 in ruled:
            rest[y0:y1, x0:x1] = False
        for box in self.blocks(rest, stats):
            kind = self.shape_type(mask, box, stats)
            if kind in ("figure", "table"):
                box, peeled = _peel_text_bands(mask, box, stats)
                types.update((line, "text") for line in peeled)
            types[box] = kind
        boxes = list(types)
        height = mask.shape[0]
        for box in boxes:
            if types[box] != "text":
                continue
            features = _text_features(mask, box, stats)
            if features.bands <= 2 and box[3] <= height * self.margin_fraction:
                types[box] = "header"
            elif features.bands <= 2 and box[1] >= height * (1 - self.margin_fraction):
                types[box] = "footer"
            elif features.bands <= 3 and (features.stroke_ratio >= 1.35
                                          or (features.band_ratio >= 1.4 and features.stroke_ratio >= 1.15)):
                types[box] = "title"
        for box in boxes:  # captions and formulas depend on their neighbours
            if types[box] != "text":
                continue
            features = _text_features(mask, box, stats)
            if features.bands <= 3 and _touches_graphic(box, boxes, types, stats.line_height):
                types[box] = "caption"
            elif (features.bands <= 4 and _narrow_and_centred(box, boxes, types, mask.shape[1])
                  and not features.lines_of_text(stats.line_height)):
                types[box] = "formula"
        return [Region(box, types[box]) for box in boxes]

    def shape_type(self, mask: np.ndarray, box: Box, stats: PageStats) -> str:
        x0, y0, x1, y1 = box
        sub = mask[y0:y1, x0:x1]
        width, height = x1 - x0, y1 - y0
        h_rules = _rules(sub.mean(axis=1), stats.line_height)
        v_rules = _rules(sub.mean(axis=0), stats.line_height)
        if h_rules >= 3 or (h_rules >= 2 and v_rules >= 3):
            return "table"
        tallest = max((b - a for a, b in runs(sub.any(axis=1), 1)), default=0)
        if sub.mean() > 0.35 and height > 2.5 * stats.line_height and width > 2 * stats.line_height:
            return "figure"
        if tallest > 3.5 * stats.line_height and width > 2 * stats.line_height:
            return "figure"
        return "text"


def _peel_text_bands(mask: np.ndarray, box: Box, stats: PageStats) -> tuple[Box, list[Box]]:
    """A caption set closer to its figure or table than a paragraph gap lands in the same
    block: split text-high bands off the top and bottom of a graphic block."""
    x0, y0, x1, y1 = box
    spans = runs(mask[y0:y1, x0:x1].any(axis=1), max(3, int(stats.line_gap)))
    peeled: list[Box] = []
    while len(spans) > 1 and spans[-1][1] - spans[-1][0] <= 1.6 * stats.line_height:
        a, b = spans.pop()
        peeled.append((x0, y0 + a, x1, y0 + b))
    while len(spans) > 1 and spans[0][1] - spans[0][0] <= 1.6 * stats.line_height:
        a, b = spans.pop(0)
        peeled.append((x0, y0 + a, x1, y0 + b))
    rest = (x0, y0 + spans[0][0], x1, y0 + spans[-1][1])
    return trim(mask, rest) or rest, [t for t in (trim(mask, p) for p in peeled) if t is not None]


def _rules(profile: np.ndarray, line_height: float) -> int:
    """Ruling lines: thin runs of rows (or columns) that are almost all ink."""
    return sum(1 for a, b in runs(profile >= 0.85, 1) if b - a <= max(3, 0.3 * line_height))


@dataclass
class _TextFeatures:
    band_heights: list[int]  # the block's bands of ink, top to bottom
    band_ratio: float  # median band height / page line height
    stroke_ratio: float  # stroke width / page stroke width

    @property
    def bands(self) -> int:
        return len(self.band_heights)

    def lines_of_text(self, line_height: float) -> bool:
        """Two or more bands, each a text line high and about as high as the others: centred
        lines of text (an author and affiliation, an address), not a display formula, whose
        fraction bars, limits and scripts make bands of unequal heights or run its rows together."""
        heights = self.band_heights
        return (len(heights) >= 2 and max(heights) <= 1.3 * min(heights)
                and all(0.6 * line_height <= height <= 1.8 * line_height for height in heights))


def _text_features(mask: np.ndarray, box: Box, stats: PageStats) -> _TextFeatures:
    x0, y0, x1, y1 = box
    sub = mask[y0:y1, x0:x1]
    bands = [b - a for a, b in runs(sub.any(axis=1), max(2, int(0.15 * stats.line_height)))]
    widths = stroke_widths(sub)
    stroke = float(np.median(widths)) if widths.size else stats.stroke
    return _TextFeatures(bands, float(np.median(bands)) / stats.line_height if bands else 0.0,
                         stroke / stats.stroke)


def _touches_graphic(box: Box, boxes: list[Box], types: dict, line_height: float) -> bool:
    """Right below a figure or table (within its width, or centred on it), or right above
    a table and within its width: where captions sit. A paragraph that merely precedes a
    table is wider than it, or not centred on it."""
    for other in boxes:
        if types[other] not in ("figure", "table") or other == box:
            continue
        inside = box[0] >= other[0] - line_height and box[2] <= other[2] + line_height
        centred = abs((box[0] + box[2]) - (other[0] + other[2])) / 2 <= 0.1 * (other[2] - other[0])
        below = 0 <= box[1] - other[3] <= 2 * line_height and (inside or centred)
        above = types[other] == "table" and 0 <= other[1] - box[3] <= 2 * line_height and inside
        if below or above:
            return True
    return False


def _column_of(box: Box, boxes: list[Box], types: dict) -> tuple[float, float]:
    """x-extent of the column `box` sits in: that of the text blocks above or below it
    (their union, since ragged right edges make any one paragraph narrower than its column)."""
    neighbours = [o for o in boxes if o != box and types[o] == "text"
                  and min(box[2], o[2]) - max(box[0], o[0]) > 0]
    if not neighbours:
        neighbours = [o for o in boxes if o != box] or [box]
    return float(min(o[0] for o in neighbours)), float(max(o[2] for o in neighbours))


def _narrow_and_centred(box: Box, boxes: list[Box], types: dict, page_width: int) -> bool:
    """Narrow for its column and centred on the column or on the page: a display formula.
    (The column is estimated from ragged paragraphs; the page centre catches what that misses.)"""
    left, right = _column_of(box, boxes, types)
    width = right - left
    if width <= 0 or (box[2] - box[0]) > 0.6 * width:
        return False
    centre = (box[0] + box[2]) / 2
    return abs(centre - (left + right) / 2) <= 0.06 * width or abs(centre - page_width / 2) <= 0.03 * page_width

