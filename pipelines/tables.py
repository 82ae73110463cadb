"""A table's grid from its ink: rows, columns and cells, each cell with its text lines.

The recogniser reads text lines well and whole tables poorly (it loses its place in a long
HTML sequence), so a table region is read the way PP-Structure-style pipelines read one: its
structure from the image, its cells' lines through the recogniser with the text task, and
the HTML assembled from the two (`table_html`).

The structure comes from ruling lines where the table has them and from whitespace where it
does not (distances are measured in letter heights of the table's own text):
- rules (long thin horizontal and vertical strokes) are taken out of the ink, and their
  ink is returned so that cells are cut without them;
- rows are the table's ink bands (a cell whose text wraps beside a one-line cell centred on
  it is one band); a band that follows the previous one at a line's spacing rather than a
  row's is the previous row's wrapped text; a horizontal rule always parts rows, and in a
  ruled grid only rules do;
- columns are bounded by inner vertical rules where there are some, else by the blank
  stretches that run down through nearly every row; a phrase that crosses such a boundary
  (a header over two columns) is one cell spanning them.
Row spans are not detected: a cell spanning rows is read in its first row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

import numpy as np

from gravityocr.pipelines.regions import Box, runs, trim

# A blank stretch between columns is at least this many letter heights wide (wider than a
# monospace font's word space), and may be crossed by phrases in at most this share of the
# rows (headers spanning columns) and never in more than three.
COLUMN_GAP = 1.3
COLUMN_CROSSINGS = 0.34
# Inside a phrase that crosses a column's blank stretch, a blank of this many letter
# heights (a word space) is where the columns part.
WORD_GAP = 0.35
# Rows (`_rows`): two kinds of blanks between bands when the larger are on average this many
# times the smaller, and the smaller are a cell's line spacing when under this many letter
# heights; this many rules between bands make a ruled grid.
ROW_GAP_JUMP = 1.8
ROW_GAP_WITHIN = 1.2
GRID_RULES = 2
# Text covers less than this share of its line's box (and of a table's); more is a solid block.
SOLID = 0.6
# A rule is a run of ink at least this many glyph heights long and at most this fraction of
# a glyph height thick (glyph: the median glyph, before the letter height is known).
RULE_LENGTH = 3.0
RULE_THICKNESS = 0.35


@dataclass
class TableCell:
    row: int
    column: int
    colspan: int = 1
    lines: list[Box] = field(default_factory=list)  # the cell's text lines, page coordinates


@dataclass
class TableGrid:
    """A table's cells row by row, left to right; a row's cells cover its columns once."""

    rows: int
    columns: int
    cells: list[TableCell]

    def to_dict(self) -> dict:
        return {"rows": self.rows, "columns": self.columns,
                "cells": [[c.row, c.column, c.colspan, [list(line) for line in c.lines]] for c in self.cells]}

    @classmethod
    def from_dict(cls, data: dict) -> "TableGrid":
        cells = [TableCell(row, column, colspan, [tuple(line) for line in lines])
                 for row, column, colspan, lines in data["cells"]]
        return cls(data["rows"], data["columns"], cells)


def _rule_masks(sub: np.ndarray, glyph: float) -> tuple[np.ndarray, np.ndarray]:
    """(horizontal, vertical) rule ink inside a table's mask, by morphological opening with
    long thin kernels."""
    import cv2

    length = max(8, int(RULE_LENGTH * glyph))
    ink = sub.astype(np.uint8)
    horizontal = cv2.morphologyEx(ink, cv2.MORPH_OPEN, np.ones((1, length), np.uint8)).astype(bool)
    vertical = cv2.morphologyEx(ink, cv2.MORPH_OPEN, np.ones((length, 1), np.uint8)).astype(bool)
    thick = max(2, int(RULE_THICKNESS * glyph) + 1)
    # a bold stroke of a big glyph is not a rule: keep only runs thin across their length
    horizontal &= ~cv2.morphologyEx(horizontal.astype(np.uint8), cv2.MORPH_OPEN,
                                    np.ones((thick + 1, 1), np.uint8)).astype(bool)
    vertical &= ~cv2.morphologyEx(vertical.astype(np.uint8), cv2.MORPH_OPEN,
                                  np.ones((1, thick + 1), np.uint8)).astype(bool)
    return horizontal, vertical


def _glyph_heights(ink: np.ndarray) -> np.ndarray:
    """Heights of the components that look like glyphs (not rules, not specks)."""
    import cv2

    count, _, stats, _ = cv2.connectedComponentsWithStats(ink.astype(np.uint8), connectivity=8)
    heights = stats[1:, cv2.CC_STAT_HEIGHT]
    widths = stats[1:, cv2.CC_STAT_WIDTH]
    return heights[(heights >= 4) & (widths < 6 * np.maximum(heights, 1))]


def _without_specks(ink: np.ndarray, largest: int) -> np.ndarray:
    """`ink` less the components of at most `largest` pixels (noise, JPEG dust)."""
    import cv2

    count, labels, stats, _ = cv2.connectedComponentsWithStats(ink.astype(np.uint8), connectivity=8)
    small = np.flatnonzero(stats[:, cv2.CC_STAT_AREA] <= largest)
    small = small[small > 0]
    return ink & ~np.isin(labels, small) if small.size else ink


def _letter_height(text: np.ndarray) -> float:
    """The height of a capital or an ascender in the table's text (the 80th percentile of
    its glyphs' heights): the unit blank stretches are measured in. The median would say
    x-height in a lower-case monospace table, where a word space is as wide."""
    heights = _glyph_heights(text)
    return float(np.percentile(heights, 80)) if heights.size else 12.0


def _rule_positions(rules: np.ndarray, axis: int, reach: float) -> list[int]:
    """Centres of the rules that run across at least `reach` of the table (axis 1: rows of
    horizontal rules; axis 0: columns of vertical rules)."""
    lines = rules.sum(axis=axis) >= reach * rules.shape[axis]
    return [(start + end) // 2 for start, end in runs(lines, 2)]


def _bands(text: np.ndarray) -> list[tuple[int, int]]:
    return runs(text.any(axis=1), 1)


def _rows(bands: list[tuple[int, int]], filled: list[set[int]], columns: int, letter: float,
          rules: list[int]) -> list[tuple[int, int]]:
    """Rows as groups of ink bands (`filled`: the columns each band has ink in). The blanks
    between bands are of two kinds when cells wrap: a line's spacing inside a cell and a
    row's padding between rows. Where the blanks fall into two kinds (`_smaller_kind`) and
    the smaller are under ROW_GAP_WITHIN letter heights, a band after a small blank joins
    the row above unless both fill every column (two rows of a table set without padding);
    a horizontal rule always parts them. Where GRID_RULES or more rules lie between bands
    (a ruled grid, not booktabs' one mid rule), the rules alone part rows: a cell's lines
    may be spaced as widely as rows elsewhere."""
    if len(bands) < 2:
        return bands
    gaps = [b[0] - a[1] for a, b in zip(bands, bands[1:])]
    within = _smaller_kind(gaps)
    if within is None or within >= ROW_GAP_WITHIN * letter:
        within = -1
    ruled = lambda upper, lower: any(upper[1] <= y <= lower[0] for y in rules)
    full = lambda cells: columns > 1 and len(cells) == columns
    rows = [[*bands[0], set(filled[0])]]
    for band, cells, gap in zip(bands[1:], filled[1:], gaps):
        row = rows[-1]
        if gap <= within and not ruled(row, band) and not (full(row[2]) and full(cells)):
            row[1] = band[1]
            row[2] |= cells
        else:
            rows.append([*band, set(cells)])
    if sum(ruled(upper, lower) for upper, lower in zip(bands, bands[1:])) >= GRID_RULES:
        grid = [rows[0]]
        for row in rows[1:]:
            if ruled(grid[-1], row):
                grid.append(row)
            else:
                grid[-1][1] = row[1]
        rows = grid
    return [(row[0], row[1]) for row in rows]


def _smaller_kind(gaps: list[int]) -> int | None:
    """The largest of the smaller kind of gaps, where the gaps are two kinds: Otsu's split of
    their values, kept when the larger kind's mean is ROW_GAP_JUMP times the smaller's."""
    values = np.sort(np.asarray(gaps, dtype=float))
    best, split = -1.0, None
    for k in range(1, len(values)):
        if values[k] == values[k - 1]:
            continue
        low, high = values[:k], values[k:]
        between = len(low) * len(high) * (high.mean() - low.mean()) ** 2
        if between > best:
            best, split = between, k
    if split is None or values[split:].mean() < ROW_GAP_JUMP * max(values[:split].mean(), 1.0):
        return None
    return int(values[split - 1])


def _segments(text: np.ndarray, y0: int, y1: int, letter: float) -> list[tuple[int, int]]:
    """Horizontal stretches of one row's ink, words joined (blanks under COLUMN_GAP letters)."""
    return runs(text[y0:y1].any(axis=0), max(1, int(COLUMN_GAP * letter)))


def _column_gaps(bands_segments: list[list[tuple[int, int]]], width: int, letter: float) -> list[tuple[int, int]]:
    """Blank stretches at least COLUMN_GAP letters wide that nearly every band's phrases
    leave blank (a header may span them)."""
    crossed = np.zeros(width, dtype=int)
    for segments in bands_segments:
        for start, end in segments:
            crossed[start:end] += 1
    allowed = min(3, int(COLUMN_CROSSINGS * len(bands_segments)))
    ink = crossed > allowed
    columns = np.flatnonzero(ink)
    if columns.size == 0:
        return []
    return [(start, end) for start, end in runs(~ink, 1)
            if start > columns[0] and end <= columns[-1] and end - start >= COLUMN_GAP * letter]


def table_grid(mask: np.ndarray, box: Box) -> tuple[TableGrid, np.ndarray]:
    """The grid of the table in `box` of a page's ink `mask`, and the mask of its rules in
    the box's coordinates (for cropping cells without them)."""
    x0, y0, x1, y1 = box
    sub = mask[y0:y1, x0:x1]
    if sub.size == 0 or sub.mean() > SOLID:  # a solid block (a badge, a filled box) holds no table
        return TableGrid(0, 0, []), np.zeros_like(sub)
    heights = _glyph_heights(sub)
    glyph = float(np.median(heights)) if heights.size else 12.0
    speck = max(2, int(0.02 * glyph ** 2))  # noise: specks far smaller than a full stop
    sub = _without_specks(sub, speck)
    horizontal, vertical = _rule_masks(sub, glyph)
    rules = _grow(horizontal | vertical)
    text = _without_specks(sub & ~rules, speck)
    letter = _letter_height(text)
    width = text.shape[1]

    row_rules = _rule_positions(horizontal, 1, 0.5)
    column_rules = _rule_positions(vertical, 0, 0.5)
    bands = [band for band in _bands(text) if band[1] - band[0] >= 0.3 * letter]
    bands_segments = [_segments(text, top, bottom, letter) for top, bottom in bands]
    if column_rules:
        gaps = [(b, b + 1) for b in column_rules]
    else:
        gaps = _column_gaps(bands_segments, width, letter)
    edges = [0] + [_boundary(gap, bands_segments) for gap in gaps] + [width]
    # a rule at the table's edge bounds an empty column
    edges = [edges[0]] + [right for left, right in zip(edges, edges[1:]) if text[:, left:right].any()]
    edges[-1] = width
    columns = len(edges) - 1

    def column_of(x: float) -> int:
        return max(0, min(columns - 1, int(np.searchsorted(edges, x, side="right")) - 1))

    filled = [{c for start, end in segments for c in range(column_of(start), column_of(end - 1) + 1)}
              for segments in bands_segments]
    rows = _rows(bands, filled, columns, letter, row_rules)
    rows_segments = [_segments(text, top, bottom, letter) for top, bottom in rows]

    cells: list[TableCell] = []
    for r, ((top, bottom), segments) in enumerate(zip(rows, rows_segments)):
        if column_rules:  # a phrase never crosses a rule: cut the row's ink where one runs through it
            present = [edge for edge in edges[1:-1]
                       if vertical[top:bottom, max(0, edge - 2):edge + 3].any(axis=1).mean() > 0.5]
            segments = [piece for start, end in segments for piece in _cut(start, end, present)]
        elif gaps:  # a phrase parts at a word space inside a column's blank stretch
            segments = _phrases(text, top, bottom, letter, gaps)
        row_cells: list[tuple[TableCell, list[int]]] = []  # cells left to right, with their x extents
        for start, end in sorted(segments):
            first, last = column_of(start), column_of(end - 1)
            if row_cells and first < row_cells[-1][0].column + row_cells[-1][0].colspan:
                cell, xs = row_cells[-1]  # reaches into the cell before it: one cell
            else:
                cell, xs = TableCell(r, first), []
                row_cells.append((cell, xs))
            cell.colspan = max(cell.column + cell.colspan, last + 1) - cell.column
            xs += [start, end]
        column = 0
        for cell, xs in row_cells:
            cells += [TableCell(r, empty) for empty in range(column, cell.column)]
            cell.lines = _cell_lines(text, (min(xs), top, max(xs), bottom), x0, y0, letter)
            cells.append(cell)
            column = cell.column + cell.colspan
        cells += [TableCell(r, empty) for empty in range(column, columns)]
    if not any(cell.lines for cell in cells):  # no text: nothing to read
        return TableGrid(0, 0, []), rules
    return TableGrid(len(rows), columns, cells), rules


def _phrases(text: np.ndarray, top: int, bottom: int, letter: float,
             gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A row's ink as phrases: words joined unless the blank between them is a column gap's
    width or lies in one of the table's column gaps."""
    words = runs(text[top:bottom].any(axis=0), max(1, int(WORD_GAP * letter)))
    phrases = [list(words[0])] if words else []
    for start, end in words[1:]:
        blank = (phrases[-1][1], start)
        parts = start - blank[0] >= COLUMN_GAP * letter or any(
            min(blank[1], b) > max(blank[0], a) for a, b in gaps)
        if parts:
            phrases.append([start, end])
        else:
            phrases[-1][1] = end
    return [tuple(p) for p in phrases]


def _boundary(gap: tuple[int, int], bands_segments: list[list[tuple[int, int]]]) -> int:
    """Where inside a blank stretch the column boundary goes: the middle of its widest part
    that no band crosses (a long cell reaching into the stretch stays in its column)."""
    start, end = gap
    crossed = np.zeros(end - start, dtype=bool)
    for segments in bands_segments:
        for a, b in segments:
            crossed[max(a, start) - start:max(min(b, end) - start, 0)] = True
    free = runs(~crossed, 1)
    if not free:
        return (start + end) // 2
    a, b = max(free, key=lambda run: run[1] - run[0])
    return start + (a + b) // 2


def _grow(rules: np.ndarray) -> np.ndarray:
    """Rules and the pixel around them (a blurred or anti-aliased rule's fringe)."""
    import cv2

    return cv2.dilate(rules.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool) & True


def _cut(start: int, end: int, cuts: list[int]) -> list[tuple[int, int]]:
    pieces, left = [], start
    for cut in cuts:
        if left < cut < end:
            pieces.append((left, cut))
            left = cut
    pieces.append((left, end))
    return pieces


def _cell_lines(text: np.ndarray, box: Box, x0: int, y0: int, letter: float) -> list[Box]:
    """A cell's text lines, top to bottom, in page coordinates. A band under a third of a
    letter high (the dots of an "i", an accent) joins the nearer line; a solid block of ink
    (a filled box, a badge's background) is not a line of text and is left out."""
    left, top, right, bottom = box
    bands = [list(band) for band in runs(text[top:bottom, left:right].any(axis=1), 1)]
    lines = [band for band in bands if band[1] - band[0] >= 0.3 * letter] or bands
    for band in bands:
        if band not in lines and lines:
            nearest = min(lines, key=lambda line: max(line[0] - band[1], band[0] - line[1]))
            nearest[0], nearest[1] = min(nearest[0], band[0]), max(nearest[1], band[1])
    boxes = []
    for a, b in lines:
        trimmed = trim(text, (left, top + a, right, top + b))
        if trimmed is None:
            continue
        tx0, ty0, tx1, ty1 = trimmed
        if ty1 - ty0 < 0.5 * letter or text[ty0:ty1, tx0:tx1].mean() <= SOLID:  # a full stop is solid too
            boxes.append((x0 + tx0, y0 + ty0, x0 + tx1, y0 + ty1))
    return boxes


def table_html(grid: TableGrid, cell_texts: list[str]) -> str:
    """`<table><tr><td>…` of the grid, `cell_texts` in the order of `grid.cells`; the empty
    string for a grid without cells (a region typed a table that holds no text)."""
    if not grid.cells:
        return ""
    rows: list[list[str]] = [[] for _ in range(grid.rows)]
    for cell, text in zip(grid.cells, cell_texts):
        span = f' colspan="{cell.colspan}"' if cell.colspan > 1 else ""
        rows[cell.row].append(f"<td{span}>{escape(text, quote=False)}</td>")
    return "<table>" + "".join(f"<tr>{''.join(row)}</tr>" for row in rows) + "</table>"
