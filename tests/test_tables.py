"""A table's grid from its ink (pipelines/tables.py), on tables drawn with known structure:
ruled grids, booktabs rules, no rules at all; cells that wrap, centred or at the top; a
header spanning columns; empty cells."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

from gravityocr.corpus.synthetic_pages import font
from gravityocr.model.evaluation.scores import parse_table
from gravityocr.pipelines.regions import ink_mask
from gravityocr.pipelines.tables import TableGrid, table_grid, table_html

Row = list[tuple[str, int]]  # (text, lines joined by "\n"; colspan)


def draw_table(rows: list[Row], widths: list[int], rules: str, valign: str = "middle", size: int = 20,
               pad: int = 10) -> tuple[Image.Image, tuple[int, int, int, int]]:
    """A table drawn cell by cell; `rules`: "grid", "booktabs" or "none". The image and the
    table's box."""
    face, pitch = font(size), int(size * 1.25)
    heights = [max(len(text.split("\n")) for text, _ in row) * pitch + 2 * pad for row in rows]
    edges = np.concatenate([[30], 30 + np.cumsum(widths)]).tolist()
    tops = np.concatenate([[30], 30 + np.cumsum(heights)]).tolist()
    image = Image.new("RGB", (edges[-1] + 30, tops[-1] + 30), "white")
    draw = ImageDraw.Draw(image)
    for r, row in enumerate(rows):
        column = 0
        for text, span in row:
            lines = text.split("\n") if text else []
            y = tops[r] + pad if valign == "top" else tops[r] + (heights[r] - len(lines) * pitch) // 2
            for n, line in enumerate(lines):
                draw.text((edges[column] + pad, y + n * pitch), line, font=face, fill="black")
            if rules == "grid" and column > 0:
                draw.line([(edges[column], tops[r]), (edges[column], tops[r + 1])], fill="black", width=1)
            column += span
    if rules == "grid":
        for y in tops:
            draw.line([(edges[0], y), (edges[-1], y)], fill="black", width=1)
        for x in (edges[0], edges[-1]):
            draw.line([(x, tops[0]), (x, tops[-1])], fill="black", width=1)
    elif rules == "booktabs":
        for y, width in ((tops[0], 2), (tops[1], 1), (tops[-1], 2)):
            draw.line([(edges[0], y), (edges[-1], y)], fill="black", width=width)
    return image, (edges[0] - 4, tops[0] - 4, edges[-1] + 5, tops[-1] + 5)


def structure(grid: TableGrid) -> list[tuple[int, int, int, int]]:
    """(row, column, colspan, lines) of every cell."""
    return [(cell.row, cell.column, cell.colspan, len(cell.lines)) for cell in grid.cells]


def expected(rows: list[Row]) -> list[tuple[int, int, int, int]]:
    out = []
    for r, row in enumerate(rows):
        column = 0
        for text, span in row:
            out.append((r, column, span, len(text.split("\n")) if text else 0))
            column += span
    return out


PRICES = [
    [("Item", 1), ("Price", 1), ("Notes", 1)],
    [("apple", 1), ("1.20", 1), ("fresh from\nthe orchard", 1)],
    [("pear", 1), ("", 1), ("out of stock", 1)],
    [("plum", 1), ("0.80", 1), ("ripe", 1)],
]
SPANNED = [
    [("Name", 1), ("Offsets in bytes", 2)],
    [("header", 1), ("0", 1), ("32", 1)],
    [("body", 1), ("32", 1), ("4096", 1)],
    [("trailer", 1), ("4128", 1), ("16", 1)],
]


@pytest.mark.parametrize("rules", ["grid", "booktabs", "none"])
@pytest.mark.parametrize("valign", ["middle", "top"])
def test_rows_columns_and_wrapped_cells(rules, valign):
    """A cell that wraps is one cell of its row, whether its neighbours are centred on it or
    sit at the top (then the lines of a cell are closer than the rows), with rules or without."""
    image, box = draw_table(PRICES, [150, 120, 220], rules, valign)
    grid, _ = table_grid(ink_mask(image), box)
    assert (grid.rows, grid.columns) == (4, 3)
    assert structure(grid) == expected(PRICES)


@pytest.mark.parametrize("rules", ["grid", "booktabs", "none"])
def test_a_header_spanning_two_columns_is_one_cell(rules):
    image, box = draw_table(SPANNED, [150, 120, 120], rules)
    grid, _ = table_grid(ink_mask(image), box)
    assert structure(grid) == expected(SPANNED)
    html = table_html(grid, [f"c{n}" for n in range(len(grid.cells))])
    assert html.startswith('<table><tr><td>c0</td><td colspan="2">c1</td></tr><tr><td>c2</td>')


def test_rules_are_taken_out_of_the_cells():
    """The rules' ink is returned (for cutting cells without it) and no cell line touches a rule."""
    image, box = draw_table(PRICES, [150, 120, 220], "grid")
    grid, rules = table_grid(ink_mask(image), box)
    x0, y0 = box[:2]
    assert rules.shape == (box[3] - box[1], box[2] - box[0])
    for x in (30, 180, 300, 520):  # every column rule is in the mask
        assert rules[:, x - x0].mean() > 0.9
    for cell in grid.cells:
        for lx0, ly0, lx1, ly1 in cell.lines:
            assert not rules[ly0 - y0:ly1 - y0, lx0 - x0:lx1 - x0].any()


def test_html_escapes_text_and_the_grid_round_trips_through_json():
    image, box = draw_table(SPANNED, [150, 120, 120], "booktabs")
    grid, _ = table_grid(ink_mask(image), box)
    texts = ["a<b", "x & y"] + [""] * (len(grid.cells) - 2)
    html = table_html(grid, texts)
    assert "<td>a&lt;b</td>" in html and "x &amp; y" in html
    tree = parse_table(html)
    assert [len(row.children) for row in tree.children] == [2, 3, 3, 3]
    assert tree.children[0].children[0].content == "a<b"
    assert TableGrid.from_dict(grid.to_dict()) == grid


def test_a_box_without_text_is_an_empty_grid():
    """Blank paper, or a solid badge with letters cut out of it: no cell, no HTML."""
    blank = np.zeros((80, 200), dtype=bool)
    grid, rules = table_grid(blank, (0, 0, 200, 80))
    assert grid.cells == [] and grid.rows == 0 and not rules.any()
    assert table_html(grid, []) == ""
    badge = Image.new("RGB", (200, 40), "white")
    draw = ImageDraw.Draw(badge)
    draw.rectangle((10, 8, 190, 32), fill="black")
    draw.text((20, 10), "PDF BY TOOL", font=font(18), fill="white")
    grid, _ = table_grid(ink_mask(badge), (0, 0, 200, 40))
    assert grid.cells == []
