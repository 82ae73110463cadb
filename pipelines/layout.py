"""Page layout: regions with a type and a reading order, and text regions split into lines.

Three parts, each replaceable:
- a `LayoutBackend` finds typed regions on a page image (unordered):
  `ProjectionLayout` (numpy only: whitespace gaps, ruling lines, stroke width) or
  `RapidLayout` (rapid-layout's bundled PP-Layout CDLA ONNX model on onnxruntime, with the
  ink it misses recovered by the projection backend);
- `reading_order` orders regions: columns left to right, top to bottom within a column,
  and a region spanning the columns (a title, a wide figure) breaks them;
- a `LineSplitter` cuts a text region into lines, because the recogniser reads lines:
  `ProjectionLines` (row profile) or `RapidOcrLines` (PP-OCR text detection from rapidocr's
  bundled models).
`layout_page` runs the three. `make_layout` / `make_line_splitter` build them by name,
so a stronger layout model plugs in as one more name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from PIL import Image

REGION_TYPES = ("text", "title", "table", "formula", "figure", "header", "footer", "caption", "reference")
TEXT_TYPES = frozenset({"text", "title", "header", "footer", "caption", "reference"})  # read line by line

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in page pixels, x1/y1 exclusive


@dataclass
class Region:
    bbox: Box
    type: str
    order: int = -1  # reading-order position on the page, from 0
    score: float = 1.0  # the backend's confidence (1.0 for rule-based backends)
    lines: list[Box] = field(default_factory=list)  # text lines, in reading order (text types; a picture's words)

    def __post_init__(self):
        if self.type not in REGION_TYPES:
            raise ValueError(f"unknown region type {self.type!r}; expected one of {REGION_TYPES}")
        self.bbox = tuple(int(v) for v in self.bbox)


class LayoutBackend(Protocol):
    name: str

    def detect(self, image: Image.Image, mask: np.ndarray) -> list[Region]:
        """Typed regions of one page, in any order. `mask` is `ink_mask(image)`."""


class LineSplitter(Protocol):
    name: str

    def split(self, image: Image.Image, mask: np.ndarray, box: Box) -> list[Box]:
        """Line boxes inside `box`, top to bottom, in page coordinates."""


# --- ink ------------------------------------------------------------------------------

def ink_mask(image: Image.Image) -> np.ndarray:
    """True where there is ink: grey levels under an Otsu threshold, kept between 100 and
    200 so that a blank page or JPEG noise on white paper never turns into ink."""
    gray = np.asarray(image.convert("L"), dtype=np.uint8)
    histogram = np.bincount(gray.ravel(), minlength=256).astype(np.float64)
    total = histogram.sum()
    levels = np.arange(256)
    weight_below = np.cumsum(histogram)
    mean_below = np.cumsum(histogram * levels)
    weight_above = total - weight_below
    with np.errstate(divide="ignore", invalid="ignore"):
        between = (mean_below[-1] * weight_below / total - mean_below) ** 2 / (weight_below * weight_above)
    threshold = int(np.clip(np.nan_to_num(between).argmax(), 100, 200))
    return gray < threshold


def paper_colour(pixels: np.ndarray, ink: np.ndarray) -> tuple[int, int, int]:
    """The median RGB of the pixels of `pixels` (h, w, 3) that are not `ink`; white without paper."""
    if not (~ink).any():
        return 255, 255, 255
    return tuple(int(v) for v in np.median(pixels[~ink], axis=0))


# A horizontal rule belongs to a table when at least this many rules of about the same
# extent (booktabs' top, middle and bottom rules) lie within TABLE_RULE_REACH line heights.
TABLE_RULES = 3
TABLE_RULE_REACH = 12


def _is_rule(width: int, height: int, area: int, line_height: float) -> bool:
    """A component's box and ink make a horizontal rule: long, thin and solid."""
    return width >= 4 * line_height and height <= max(3.0, 0.3 * line_height) and area >= 0.8 * width * height


def _stacked(rule: Box, other: Box, line_height: float) -> bool:
    """Two rules of one table: about the same extent, within TABLE_RULE_REACH lines."""
    width, other_width = rule[2] - rule[0], other[2] - other[0]
    return (abs(other[1] - rule[1]) <= TABLE_RULE_REACH * line_height
            and _overlap((rule[0], rule[2]), (other[0], other[2])) >= 0.8 * max(width, other_width))


def rule_stacks(mask: np.ndarray, line_height: float) -> list[Box]:
    """The boxes of booktabs-style tables: from the first to the last of TABLE_RULES or more
    horizontal rules of about the same extent, each within TABLE_RULE_REACH lines of the
    next. Whitespace cuts would part such a table at its rules and between its rows (its
    rules then read as lines of dots); found first, it stays one block."""
    import cv2

    _, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    rules = sorted(((x, y, x + width, y + height) for x, y, width, height, area in stats[1:].tolist()
                    if _is_rule(width, height, area, line_height)), key=lambda box: box[1])
    stacks: list[list[Box]] = []  # each rule joins the first stack whose last rule it continues
    for rule in rules:
        for stack in stacks:
            if _stacked(stack[-1], rule, line_height):
                stack.append(rule)
                break
        else:
            stacks.append([rule])
    return [(min(r[0] for r in stack), stack[0][1], max(r[2] for r in stack), stack[-1][3])
            for stack in stacks if len(stack) >= TABLE_RULES]


def decorations(mask: np.ndarray, line_height: float) -> np.ndarray:
    """The ink that frames or underlines text without being part of a table: boxes drawn
    around text (a hollow rectangle: a code listing's frame), horizontal rules that stand
    alone across much of the page (under a running header, over a footer, between sections)
    and vertical rules that stand alone beside two lines or more (a bar down a listing's
    side, a change bar, a rule between columns). Left in, a frame joins the listings and
    paragraphs around it into one block with ruling lines, typed a table, a rule widens a
    header's box to the page's width, and a bar joins the lines beside it into one ink mass,
    typed a figure and never read. A grid table's rules are one component with inner lines,
    not a hollow rectangle nor a lone rule, and booktabs' rules come in stacks (TABLE_RULES):
    both stay."""
    import cv2

    count, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    thin = max(3.0, 0.3 * line_height)
    long = 4 * line_height
    columns = np.flatnonzero(mask.any(axis=0))
    text_width = int(columns[-1] - columns[0] + 1) if columns.size else mask.shape[1]
    frames, rules, bars = [], {}, []
    for label in range(1, count):
        x, y, width, height, area = stats[label].tolist()
        if height >= 2 * line_height and width <= thin and area >= 0.8 * width * height:
            bars.append(label)
            continue
        if width < long:
            continue
        if _is_rule(width, height, area, line_height):
            if width >= 0.4 * text_width:  # a fraction bar or an underlined word is text's own
                rules[label] = (x, y, x + width, y + height)
        elif height >= line_height and area <= 2 * (width + height) * thin:
            edge = int(thin)
            inside = labels[y + edge:y + height - edge, x + edge:x + width - edge]
            if not (inside == label).any():  # hollow: no rule of its own inside (a grid has)
                frames.append(label)
    lone = [label for label, box in rules.items()  # its stack counts itself
            if sum(_stacked(box, other, line_height) for other in rules.values()) < TABLE_RULES]
    return np.isin(labels, frames + lone + bars) if frames or lone or bars else np.zeros_like(mask)


# A crop whose tallest component is under this share of the page's line height holds marks
# alone (a colon, a full stop, `::=`), no letter.
MARKS = 0.45


def marks_only(mask: np.ndarray, box: Box, line_height: float) -> bool:
    """Whether the ink in `box` is marks alone (MARKS): the recogniser scales a crop by its
    own glyphs, so it would blow a full stop up to a letter's size and read it as a run of
    dots or bullets."""
    import cv2

    x0, y0, x1, y1 = box
    count, _, stats, _ = cv2.connectedComponentsWithStats(mask[y0:y1, x0:x1].astype(np.uint8), connectivity=8)
    return count > 1 and int(stats[1:, cv2.CC_STAT_HEIGHT].max()) < MARKS * line_height


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def _runs(profile: np.ndarray, min_gap: int) -> list[tuple[int, int]]:
    """[start, end) spans of True in `profile`, merging spans separated by fewer than
    `min_gap` False entries."""
    padded = np.concatenate([[False], profile, [False]])
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    spans = list(zip(edges[0::2].tolist(), edges[1::2].tolist()))
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start - merged[-1][1] < min_gap:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _trim(mask: np.ndarray, box: Box) -> Box | None:
    x0, y0, x1, y1 = box
    sub = mask[y0:y1, x0:x1]
    rows = np.flatnonzero(sub.any(axis=1))
    cols = np.flatnonzero(sub.any(axis=0))
    if rows.size == 0:
        return None
    return x0 + int(cols[0]), y0 + int(rows[0]), x0 + int(cols[-1]) + 1, y0 + int(rows[-1]) + 1


def _stroke_widths(sub: np.ndarray) -> np.ndarray:
    """Lengths of horizontal ink runs: their median is the stroke width of the text."""
    padded = np.pad(sub, ((0, 0), (1, 1)))
    diff = np.diff(padded.astype(np.int8), axis=1)
    starts = np.flatnonzero(diff.ravel() == 1)
    ends = np.flatnonzero(diff.ravel() == -1)
    return ends - starts


@dataclass
class PageStats:
    """What 'normal' looks like on this page: body line height and stroke width."""

    line_height: float
    line_gap: float  # the usual whitespace between two lines of a paragraph
    stroke: float

    @classmethod
    def of(cls, mask: np.ndarray) -> "PageStats":
        spans = [(start, end) for start, end in _runs(mask.any(axis=1), 1) if end - start >= 4]
        line_height = max(float(np.median([end - start for start, end in spans])) if spans else 20.0, 6.0)
        # between two lines of text: a figure's strokes, rules and formulas' bars space otherwise
        text_like = lambda span: 0.6 * line_height <= span[1] - span[0] <= 1.5 * line_height
        gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])
                if b[0] - a[1] < 2 * line_height and text_like(a) and text_like(b)]
        line_gap = float(np.median(gaps)) if gaps else 0.3 * line_height
        widths = _stroke_widths(mask)
        stroke = float(np.median(widths)) if widths.size else 2.0
        return cls(line_height, line_gap, max(stroke, 1.0))


# --- the projection backend -------------------------------------------------------------

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
            box = _trim(mask, stack.pop())
            if box is None:
                continue
            x0, y0, x1, y1 = box
            sub = mask[y0:y1, x0:x1]
            row_spans = _runs(sub.any(axis=1), min_gap_y)
            if len(row_spans) > 1:
                stack.extend((x0, y0 + a, x1, y0 + b) for a, b in row_spans)
                continue
            col_spans = _runs(sub.any(axis=0), min_gap_x)
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
        bands = [_runs(sub[:, a:b].any(axis=1), gap) for a, b in col_spans]
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
            if not all(any(_overlap(band, other) >= 0.5 * min(band[1] - band[0], other[1] - other[0])
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
            kind = self._shape_type(mask, box, stats)
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

    def _shape_type(self, mask: np.ndarray, box: Box, stats: PageStats) -> str:
        x0, y0, x1, y1 = box
        sub = mask[y0:y1, x0:x1]
        width, height = x1 - x0, y1 - y0
        h_rules = _rules(sub.mean(axis=1), stats.line_height)
        v_rules = _rules(sub.mean(axis=0), stats.line_height)
        if h_rules >= 3 or (h_rules >= 2 and v_rules >= 3):
            return "table"
        tallest = max((b - a for a, b in _runs(sub.any(axis=1), 1)), default=0)
        if sub.mean() > 0.35 and height > 2.5 * stats.line_height and width > 2 * stats.line_height:
            return "figure"
        if tallest > 3.5 * stats.line_height and width > 2 * stats.line_height:
            return "figure"
        return "text"


def _peel_text_bands(mask: np.ndarray, box: Box, stats: PageStats) -> tuple[Box, list[Box]]:
    """A caption set closer to its figure or table than a paragraph gap lands in the same
    block: split text-high bands off the top and bottom of a graphic block."""
    x0, y0, x1, y1 = box
    spans = _runs(mask[y0:y1, x0:x1].any(axis=1), max(3, int(stats.line_gap)))
    peeled: list[Box] = []
    while len(spans) > 1 and spans[-1][1] - spans[-1][0] <= 1.6 * stats.line_height:
        a, b = spans.pop()
        peeled.append((x0, y0 + a, x1, y0 + b))
    while len(spans) > 1 and spans[0][1] - spans[0][0] <= 1.6 * stats.line_height:
        a, b = spans.pop(0)
        peeled.append((x0, y0 + a, x1, y0 + b))
    rest = (x0, y0 + spans[0][0], x1, y0 + spans[-1][1])
    return _trim(mask, rest) or rest, [t for t in (_trim(mask, p) for p in peeled) if t is not None]


def _rules(profile: np.ndarray, line_height: float) -> int:
    """Ruling lines: thin runs of rows (or columns) that are almost all ink."""
    return sum(1 for a, b in _runs(profile >= 0.85, 1) if b - a <= max(3, 0.3 * line_height))


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
    bands = [b - a for a, b in _runs(sub.any(axis=1), max(2, int(0.15 * stats.line_height)))]
    widths = _stroke_widths(sub)
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


# --- the rapid-layout backend -----------------------------------------------------------

# PP-Layout CDLA's labels -> our region types.
CDLA_TYPES = {
    "text": "text", "title": "title", "figure": "figure", "figure_caption": "caption", "table": "table",
    "table_caption": "caption", "header": "header", "footer": "footer", "reference": "reference",
    "equation": "formula",
}


class RapidLayout:
    """rapid-layout's PP-Layout CDLA model (bundled in its wheel, runs offline on onnxruntime).

    The model is coarse: it misses small blocks (page numbers, short lines) and its boxes
    clip ink. With `fill_gaps`, ink that no detected region covers is laid out by the
    projection backend and added, so no text is silently dropped; overlapping detections
    are resolved in favour of the more confident one."""

    name = "rapid"

    def __init__(self, model_type: str = "pp_layout_cdla", conf_thresh: float = 0.5, fill_gaps: bool = True):
        try:
            from rapid_layout import RapidLayout as _RapidLayout
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError("the 'rapid' layout backend needs rapid-layout and onnxruntime: "
                              "pip install -e . (rapidocr, rapid-layout, onnxruntime)") from error
        import logging

        logging.getLogger("rapid_layout").setLevel(logging.WARNING)
        self._engine = _RapidLayout(model_type=model_type, conf_thresh=conf_thresh)
        for name in list(logging.root.manager.loggerDict):
            if name.startswith("rapid_layout"):
                logging.getLogger(name).setLevel(logging.WARNING)
        self.fill_gaps = fill_gaps
        self._fallback = ProjectionLayout()

    def detect(self, image: Image.Image, mask: np.ndarray) -> list[Region]:
        result = self._engine(np.asarray(image.convert("RGB"))[:, :, ::-1])  # the model expects BGR
        height, width = mask.shape
        candidates = []
        for box, label, score in zip(result.boxes or [], result.class_names or [], result.scores or []):
            x0, y0, x1, y1 = (int(round(v)) for v in box)
            x0, y0, x1, y1 = max(0, x0), max(0, y0), min(width, x1), min(height, y1)
            if x1 - x0 < 2 or y1 - y0 < 2:
                continue
            candidates.append(Region((x0, y0, x1, y1), CDLA_TYPES.get(label, "text"), score=float(score)))
        regions = _drop_contained(candidates)
        if self.fill_gaps:
            regions += self._uncovered(mask, regions)
        return regions

    def _uncovered(self, mask: np.ndarray, regions: list[Region]) -> list[Region]:
        rest = mask.copy()
        for region in regions:
            x0, y0, x1, y1 = region.bbox
            rest[y0:y1, x0:x1] = False
        if rest.sum() < 50:
            return []
        stats = PageStats.of(mask)
        new: list[Region] = []
        for extra in self._fallback.detect(Image.fromarray(~rest), rest):
            # Ink a detected box clipped (a line's last word, a descender) grows that box.
            owners = [r for r in regions if _adjacent(r.bbox, extra.bbox, stats.line_height)]
            owner = min(owners, key=lambda r: (_gap(r.bbox, extra.bbox), r.type == "figure"), default=None)
            if owner is not None:
                owner.bbox = (min(owner.bbox[0], extra.bbox[0]), min(owner.bbox[1], extra.bbox[1]),
                              max(owner.bbox[2], extra.bbox[2]), max(owner.bbox[3], extra.bbox[3]))
            elif (extra.bbox[2] - extra.bbox[0]) * (extra.bbox[3] - extra.bbox[1]) > stats.line_height ** 2 / 4:
                new.append(extra)
        return new


def _gap(a: Box, b: Box) -> int:
    return max(a[0] - b[2], b[0] - a[2], 0) + max(a[1] - b[3], b[1] - a[3], 0)


def _adjacent(box: Box, piece: Box, reach: float) -> bool:
    """`piece` overlaps `box` along one axis and is within `reach` of it along the other."""
    overlap_y = min(box[3], piece[3]) - max(box[1], piece[1])
    overlap_x = min(box[2], piece[2]) - max(box[0], piece[0])
    gap_x = max(box[0] - piece[2], piece[0] - box[2], 0)
    gap_y = max(box[1] - piece[3], piece[1] - box[3], 0)
    return ((overlap_y > 0.5 * (piece[3] - piece[1]) and gap_x <= reach)
            or (overlap_x > 0.5 * (piece[2] - piece[0]) and gap_y <= reach / 2))


def _area(box: Box) -> int:
    return max(0, box[2] - box[0]) * max(0, box[3] - box[1])


def _intersection(a: Box, b: Box) -> int:
    return _area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def _drop_contained(regions: list[Region], contained: float = 0.7) -> list[Region]:
    """Keep the more confident of two regions when one lies mostly inside the other."""
    kept: list[Region] = []
    for region in sorted(regions, key=lambda r: -r.score):
        if all(_intersection(region.bbox, k.bbox) < contained * min(_area(region.bbox), _area(k.bbox)) for k in kept):
            kept.append(region)
    return kept


# --- reading order ----------------------------------------------------------------------

def _spans(intervals: list[tuple[int, int]], tolerance: int) -> list[tuple[int, int]]:
    """Union of intervals, those overlapping by at most `tolerance` kept apart."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start < merged[-1][1] - tolerance:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [tuple(m) for m in merged]


def _gaps(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(a[1], b[0]) for a, b in zip(spans, spans[1:])]


def _split(regions: list[Region], axis: int, tolerance: int) -> list[list[Region]]:
    """Group regions into bands along `axis` (0: columns by x, 1: strips by y)."""
    spans = _spans([(r.bbox[axis], r.bbox[axis + 2]) for r in regions], tolerance)
    groups: list[list[Region]] = [[] for _ in spans]
    for region in regions:
        centre = (region.bbox[axis] + region.bbox[axis + 2]) / 2
        index = next((i for i, (a, b) in enumerate(spans) if a - tolerance <= centre <= b + tolerance), len(spans) - 1)
        groups[index].append(region)
    return [g for g in groups if g]


def _column_gaps(regions: list[Region], tolerance: int) -> list[tuple[int, int]]:
    return _gaps(_spans([(r.bbox[0], r.bbox[2]) for r in regions], tolerance))


def _shared(gaps_a: list[tuple[int, int]], gaps_b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(max(a0, b0), min(a1, b1)) for a0, a1 in gaps_a for b0, b1 in gaps_b if min(a1, b1) > max(a0, b0)]


def _starts_a_section(strip: list[Region], below: list[list[Region]], tolerance: int) -> bool:
    """A strip of titles without a gutter of its own, followed by a strip with one."""
    return (all(region.type == "title" for region in strip) and not _column_gaps(strip, tolerance)
            and bool(below) and bool(_column_gaps(below[0], tolerance)))


def _order(regions: list[Region], tolerance: int) -> list[Region]:
    if len(regions) <= 1:
        return list(regions)
    strips = _split(regions, 1, tolerance)
    if len(strips) == 1:
        columns = _split(regions, 0, tolerance)
        if len(columns) == 1:  # overlapping boxes: fall back to top-left first
            return sorted(regions, key=lambda r: (r.bbox[1], r.bbox[0]))
        return [r for column in columns for r in _order(column, tolerance)]
    # A strip with a column gutter starts a multi-column band, and the strips after it join
    # the band while a gutter still runs through all of them (a paragraph alone in a strip,
    # beside the other column's gap, stays in its column); a strip with a region across
    # every gutter (a full-width title or figure) breaks the columns. Strips without a
    # gutter of their own before any band (indented items, a term above its description)
    # are read top to bottom. A strip of titles alone, with columns below it again, is a
    # section heading across the page: the columns above it end there.
    bands: list[tuple[list[Region], list[tuple[int, int]]]] = []
    for index, strip in enumerate(strips):
        if bands and bands[-1][1] and not _starts_a_section(strip, strips[index + 1:], tolerance):
            merged = bands[-1][0] + strip
            gaps = _column_gaps(merged, tolerance)
            if gaps:
                bands[-1] = (merged, gaps)
                continue
        bands.append((list(strip), _column_gaps(strip, tolerance)))
    ordered: list[Region] = []
    for band, gaps in bands:
        if len(band) == len(regions):  # one band holding every strip: cut it into its columns
            columns = _split(band, 0, tolerance)
            if len(columns) == 1:
                return sorted(regions, key=lambda r: (r.bbox[1], r.bbox[0]))
            ordered += [r for column in columns for r in _order(column, tolerance)]
        else:
            ordered += _order(band, tolerance)
    return ordered


def reading_order(regions: list[Region], tolerance: int = 2) -> list[Region]:
    """Regions in reading order, `order` set from 0: headers first and footers last, the
    rest by columns (left to right, each top to bottom), full-width regions breaking columns."""
    headers = sorted((r for r in regions if r.type == "header"), key=lambda r: (r.bbox[1], r.bbox[0]))
    footers = sorted((r for r in regions if r.type == "footer"), key=lambda r: (r.bbox[1], r.bbox[0]))
    body = [r for r in regions if r.type not in ("header", "footer")]
    ordered = headers + _order(body, tolerance) + footers
    for index, region in enumerate(ordered):
        region.order = index
    return ordered


# --- lines ------------------------------------------------------------------------------

@dataclass
class ProjectionLines:
    """Lines from the row profile of the region's ink; slivers (an accent, the dot of an i
    alone on a row band) are merged into the nearest line; a line with a wide blank
    stretch is read as its pieces, left to right."""

    name: str = "projection"
    sliver: float = 0.35  # bands under this fraction of the median band height are merged
    # A line is cut where a blank run is this many times its height wide (a grammar's name
    # and its `::=`, a term and its description): the recogniser reads a line of words, and
    # wide blank stretches inside a crop make it lose its place. Word spaces are a third of that.
    cell_gap: float = 2.5

    def split(self, image: Image.Image, mask: np.ndarray, box: Box) -> list[Box]:
        x0, y0, x1, y1 = box
        sub = mask[y0:y1, x0:x1]
        bands = [list(span) for span in _runs(sub.any(axis=1), 1)]
        if not bands:
            return []
        median = float(np.median([b - a for a, b in bands]))
        i = 0
        while len(bands) > 1 and i < len(bands):
            a, b = bands[i]
            if b - a < self.sliver * median:
                gap_up = a - bands[i - 1][1] if i > 0 else 10**9
                gap_down = bands[i + 1][0] - b if i + 1 < len(bands) else 10**9
                j = i - 1 if gap_up <= gap_down else i + 1
                bands[j] = [min(bands[j][0], a), max(bands[j][1], b)]
                del bands[i]
                i = 0
                continue
            i += 1
        lines = []
        for a, b in bands:
            trimmed = _trim(mask, (x0, y0 + a, x1, y0 + b))
            if trimmed is None:
                continue
            lx0, ly0, lx1, ly1 = trimmed
            gap = max(1, int(self.cell_gap * (ly1 - ly0)))
            for c0, c1 in _runs(mask[ly0:ly1, lx0:lx1].any(axis=0), gap):
                piece = _trim(mask, (lx0 + c0, ly0, lx0 + c1, ly1))
                if piece is not None:
                    lines.append(piece)
        return lines


class RapidOcrLines:
    """PP-OCR text detection (rapidocr's bundled PP-OCRv6 det model, offline), run once per
    page; a region's lines are the detected boxes centred in it, grouped by vertical overlap
    and clipped to the region. A region where nothing was detected falls back to the
    projection splitter, so detection misses never drop text."""

    name = "rapidocr"

    def __init__(self):
        try:
            from rapidocr import RapidOCR
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError("the 'rapidocr' line splitter needs rapidocr and onnxruntime: "
                              "pip install -e . (rapidocr, rapid-layout, onnxruntime)") from error
        self._engine = RapidOCR(params={"Global.log_level": "warning", "Global.use_cls": False,
                                        "Global.use_rec": False})
        self._page: Image.Image | None = None  # the page the cached boxes belong to
        self._boxes: list[Box] = []

    def _detect(self, image: Image.Image) -> list[Box]:
        if self._page is not image:
            result = self._engine(np.asarray(image.convert("RGB"))[:, :, ::-1], use_det=True, use_cls=False,
                                  use_rec=False)
            quads = getattr(result, "boxes", None)
            quads = [] if quads is None else np.asarray(quads)
            self._boxes = [(int(q[:, 0].min()), int(q[:, 1].min()), int(q[:, 0].max()) + 1, int(q[:, 1].max()) + 1)
                           for q in quads]
            self._page = image
        return self._boxes

    def split(self, image: Image.Image, mask: np.ndarray, box: Box) -> list[Box]:
        x0, y0, x1, y1 = box
        inside = [b for b in self._detect(image)
                  if x0 <= (b[0] + b[2]) / 2 <= x1 and y0 <= (b[1] + b[3]) / 2 <= y1]
        if not inside:
            return ProjectionLines().split(image, mask, box)
        lines: list[list[int]] = []
        for bx0, by0, bx1, by1 in sorted(inside, key=lambda b: (b[1] + b[3]) / 2):
            if lines:
                last = lines[-1]
                overlap = min(last[3], by1) - max(last[1], by0)
                if overlap > 0.5 * min(last[3] - last[1], by1 - by0):
                    lines[-1] = [min(last[0], bx0), min(last[1], by0), max(last[2], bx1), max(last[3], by1)]
                    continue
            lines.append([bx0, by0, bx1, by1])
        clipped = [(max(x0, a), max(y0, b), min(x1, c), min(y1, d)) for a, b, c, d in lines]
        return [line for line in clipped if line[2] > line[0] and line[3] > line[1]]


class NoLines:
    """Read each text region whole (for recognisers trained on paragraphs)."""

    name = "none"

    def split(self, image: Image.Image, mask: np.ndarray, box: Box) -> list[Box]:
        return []


# --- the whole page ---------------------------------------------------------------------

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
    from gravityocr.pipelines.figures import picture_lines, text_in_figures  # figures.py builds on this module

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
