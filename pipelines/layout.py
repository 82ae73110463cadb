"""Page layout: regions with a type and a reading order, and text regions split into lines.

Three parts, each replaceable:
- a `LayoutBackend` finds typed regions on a page image (unordered):
  `ProjectionLayout` (pipelines/projection_layout.py: numpy only: whitespace gaps, ruling
  lines, stroke width) or `RapidLayout` (pipelines/layout_model.py: rapid-layout's bundled
  PP-Layout CDLA ONNX model on onnxruntime, with the ink it misses recovered by the
  projection backend);
- `reading_order` (pipelines/reading_order.py) orders regions: columns left to right, top to
  bottom within a column, and a region spanning the columns (a title, a wide figure) breaks them;
- a `LineSplitter` cuts a text region into lines, because the recogniser reads lines:
  `ProjectionLines` (row profile) or `RapidOcrLines` (PP-OCR text detection from rapidocr's
  bundled models), or `NoLines` (pipelines/line_splitters.py).
What a page is made of (`Region`, the two protocols) and the ink measurements the parts share
are in pipelines/regions.py; figures that hold text, in pipelines/figures.py.
`layout_page` runs the three. `make_layout` / `make_line_splitter` build them by name,
so a stronger layout model plugs in as one more name.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from gravityocr.pipelines.figures import picture_lines, text_in_figures
from gravityocr.pipelines.line_splitters import NoLines, ProjectionLines, RapidOcrLines
from gravityocr.pipelines.projection_layout import ProjectionLayout
from gravityocr.pipelines.layout_model import RapidLayout
from gravityocr.pipelines.reading_order import reading_order
from gravityocr.pipelines.regions import TEXT_TYPES, LayoutBackend, LineSplitter, PageStats, Region, decorations, \
    ink_mask

LAYOUT_BACKENDS = ("projection", "rapid")
LINE_SPLITTERS = ("projection", "rapidocr", "none")


def make_layout(name: str) -> LayoutBackend:
    if name == "projection":
        return ProjectionLayout()
    if name == "rapid":
        return RapidLayout()
    raise ValueError(f"unknown layout backend {name!r}; expected one of {LAYOUT_BACKENDS}")


def make_line_splitter(name: str) -> LineSplitter:
    if name == "projection":
        return ProjectionLines()
    if name == "rapidocr":
        return RapidOcrLines()
    if name == "none":
        return NoLines()
    raise ValueError(f"unknown line splitter {name!r}; expected one of {LINE_SPLITTERS}")


def layout_page(image: Image.Image, backend: LayoutBackend, lines: LineSplitter,
                ink: np.ndarray | None = None) -> list[Region]:
    """Typed regions of a page in reading order, text regions with their lines; frames and
    lone rules (`decorations`) are left out of the ink the layout and lines are found in.
    A figure that holds text is laid out again as what it holds, and a picture's lines of
    words are its lines (pipelines/figures.py). `ink`: the page's `ink_mask` when the caller
    has it."""
    mask = ink_mask(image) if ink is None else ink
    stats = PageStats.of(mask)
    mask = mask & ~decorations(mask, stats.line_height)
    regions = reading_order(text_in_figures(image, mask, backend.detect(image, mask)))
    for region in regions:
        if region.type in TEXT_TYPES:
            region.lines = lines.split(image, mask, region.bbox)
        elif region.type == "figure" and not isinstance(lines, NoLines):
            region.lines = picture_lines(mask, region.bbox, stats.line_height)
    return regions
