"""What a page is made of, and the ink measurements every part of the layout shares.

A page is typed regions (`Region`: a box in page pixels, one of REGION_TYPES, its reading-order
position and, for text types, its lines). The layout's replaceable parts meet here:
- a `LayoutBackend` finds typed regions on a page image (unordered);
- a `LineSplitter` cuts a text region into lines, because the recogniser reads lines.
Both, and figures and tables, measure the page the same way: its ink (`ink_mask`), its paper
(`paper_colour`), the rules that make a table or only frame text (`rule_stacks`,
`decorations`), ink that is marks alone (`marks_only`), and what a normal line looks like on
the page (`PageStats`).
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


def is_rule(width: int, height: int, area: int, line_height: float) -> bool:
    """A component's box and ink make a horizontal rule: long, thin and solid."""
    return width >= 4 * line_height and height <= max(3.0, 0.3 * line_height) and area >= 0.8 * width * height


def _stacked(rule: Box, other: Box, line_height: float) -> bool:
    """Two rules of one table: about the same extent, within TABLE_RULE_REACH lines."""
    width, other_width = rule[2] - rule[0], other[2] - other[0]
    return (abs(other[1] - rule[1]) <= TABLE_RULE_REACH * line_height
            and overlap((rule[0], rule[2]), (other[0], other[2])) >= 0.8 * max(width, other_width))


def rule_stacks(mask: np.ndarray, line_height: float) -> list[Box]:
    """The boxes of booktabs-style tables: from the first to the last of TABLE_RULES or more
    horizontal rules of about the same extent, each within TABLE_RULE_REACH lines of the
    next. Whitespace cuts would part such a table at its rules and between its rows (its
    rules then read as lines of dots); found first, it stays one block."""
    import cv2

    _, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    rules = sorted(((x, y, x + width, y + height) for x, y, width, height, area in stats[1:].tolist()
                    if is_rule(width, height, area, line_height)), key=lambda box: box[1])
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
        if is_rule(width, height, area, line_height):
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


def overlap(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def runs(profile: np.ndarray, min_gap: int) -> list[tuple[int, int]]:
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


def trim(mask: np.ndarray, box: Box) -> Box | None:
    x0, y0, x1, y1 = box
    sub = mask[y0:y1, x0:x1]
    rows = np.flatnonzero(sub.any(axis=1))
    cols = np.flatnonzero(sub.any(axis=0))
    if rows.size == 0:
        return None
    return x0 + int(cols[0]), y0 + int(rows[0]), x0 + int(cols[-1]) + 1, y0 + int(rows[-1]) + 1


def stroke_widths(sub: np.ndarray) -> np.ndarray:
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
        spans = [(start, end) for start, end in runs(mask.any(axis=1), 1) if end - start >= 4]
        line_height = max(float(np.median([end - start for start, end in spans])) if spans else 20.0, 6.0)
        # between two lines of text: a figure's strokes, rules and formulas' bars space otherwise
        text_like = lambda span: 0.6 * line_height <= span[1] - span[0] <= 1.5 * line_height
        gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])
                if b[0] - a[1] < 2 * line_height and text_like(a) and text_like(b)]
        line_gap = float(np.median(gaps)) if gaps else 0.3 * line_height
        widths = stroke_widths(mask)
        stroke = float(np.median(widths)) if widths.size else 2.0
        return cls(line_height, line_gap, max(stroke, 1.0))
