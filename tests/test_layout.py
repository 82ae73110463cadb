"""Layout: typed regions, reading order across columns, lines inside text regions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from gravityocr.pipelines.layout import layout_page, make_layout, make_line_splitter
from gravityocr.pipelines.line_splitters import ProjectionLines
from gravityocr.pipelines.projection_layout import ProjectionLayout
from gravityocr.pipelines.reading_order import reading_order
from gravityocr.pipelines.regions import Region, ink_mask
from gravityocr.corpus.synthetic_pages import (
    LINE_PITCH,
    font,
    sectioned_columns_page,
    single_column_page,
    table_formula_page,
    two_column_page,
    wrap,
)


def _iou(a, b) -> float:
    inter = max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


@pytest.mark.parametrize("maker", [single_column_page, two_column_page, table_formula_page])
@pytest.mark.parametrize("seed", [0, 7])
def test_projection_layout_finds_the_regions_in_reading_order(maker, seed):
    page = maker(seed=seed)
    regions = layout_page(page.image, make_layout("projection"), make_line_splitter("projection"))
    assert [r.type for r in regions] == page.types
    assert [r.order for r in regions] == list(range(len(regions)))
    for found, truth in zip(regions, page.regions):
        assert _iou(found.bbox, truth.bbox) > 0.6, (found, truth)


def test_two_column_page_reads_left_column_before_right():
    page = two_column_page(seed=3, paragraphs_per_column=3)
    regions = layout_page(page.image, ProjectionLayout(), ProjectionLines())
    body = [r for r in regions if r.type == "text"]
    lefts = [r.bbox[0] for r in body]
    assert max(lefts[:3]) < page.image.width / 2 <= min(lefts[3:])
    tops = [r.bbox[1] for r in body]
    assert tops[:3] == sorted(tops[:3]) and tops[3:] == sorted(tops[3:])


def test_text_regions_are_split_into_their_lines():
    page = single_column_page(seed=4, paragraphs=2)
    regions = layout_page(page.image, ProjectionLayout(), ProjectionLines())
    face = font(22)
    for found, truth in zip(regions, page.regions):
        if truth.type == "text":
            expected = len(wrap(truth.text, face, page.image.width - 220))
            assert len(found.lines) == expected
            assert all(found.bbox[1] <= line[1] < line[3] <= found.bbox[3] for line in found.lines)
            pitches = np.diff([line[1] for line in found.lines])
            assert all(abs(p - LINE_PITCH) <= 8 for p in pitches)
    assert all(not r.lines for r in regions if r.type in ("table", "formula", "figure"))


def _boxes(*specs):
    return [Region(box, kind) for kind, box in specs]


def test_reading_order_full_width_region_breaks_the_columns():
    # title; two columns; a full-width figure; two more columns; footer
    regions = _boxes(
        ("footer", (500, 1700, 540, 1720)),
        ("text", (620, 300, 1100, 500)),   # right column, upper band
        ("figure", (100, 700, 1100, 1000)),
        ("text", (100, 1100, 580, 1300)),  # left column, lower band
        ("text", (100, 300, 580, 400)),    # left column, upper band
        ("title", (100, 150, 900, 200)),
        ("text", (620, 1100, 1100, 1500)),  # right column, lower band
        ("text", (100, 420, 580, 600)),    # left column, upper band, second paragraph
    )
    ordered = reading_order(regions)
    assert [(r.type, r.bbox[:2]) for r in ordered] == [
        ("title", (100, 150)), ("text", (100, 300)), ("text", (100, 420)), ("text", (620, 300)),
        ("figure", (100, 700)), ("text", (100, 1100)), ("text", (620, 1100)), ("footer", (500, 1700)),
    ]
    assert [r.order for r in ordered] == list(range(8))


def test_reading_order_a_heading_in_one_column_with_text_beside_it_stays_in_its_column():
    # a column's own section heading: the other column has text beside it, so no break
    regions = _boxes(
        ("text", (100, 200, 580, 400)), ("title", (100, 430, 400, 460)), ("text", (100, 480, 580, 700)),
        ("text", (620, 200, 1100, 700)),
    )
    assert [r.bbox[:2] for r in reading_order(list(reversed(regions)))] == [
        (100, 200), (100, 430), (100, 480), (620, 200)]


@pytest.mark.parametrize("backend, lines", [("projection", "projection"), ("rapid", "rapidocr")])
@pytest.mark.parametrize("seed", [0, 3])
def test_rendered_sectioned_page_reads_in_order(backend, lines, seed):
    # two column sections under a heading across the page, a figure with its caption in one
    # column and a table in the other, running header and footer: every truth region is
    # found once and the regions come in the truth's order
    if backend == "rapid":
        pytest.importorskip("rapid_layout")
        pytest.importorskip("rapidocr")
    page = sectioned_columns_page(seed=seed)
    regions = layout_page(page.image, make_layout(backend), make_line_splitter(lines))
    matched = [max(range(len(page.regions)), key=lambda i: _iou(region.bbox, page.regions[i].bbox))
               for region in regions]
    assert matched == list(range(len(page.regions))), [(r.type, r.bbox) for r in regions]
    assert [r.type for r in regions] == page.types


def test_reading_order_aligned_paragraph_gaps_do_not_interleave_columns():
    # Paragraph gaps at the same heights in both columns: rows must not be read across.
    left = [("text", (100, y, 580, y + 100)) for y in (200, 350, 500)]
    right = [("text", (620, y, 1100, y + 100)) for y in (200, 350, 500)]
    ordered = reading_order(_boxes(*(right + left)))
    assert [r.bbox[0] for r in ordered] == [100, 100, 100, 620, 620, 620]


def test_blank_page_has_no_regions():
    image = Image.new("RGB", (600, 800), "white")
    assert layout_page(image, ProjectionLayout(), ProjectionLines()) == []
    assert not ink_mask(image).any()


def test_line_splitter_merges_slivers():
    image = Image.new("RGB", (300, 100), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle([10, 20, 200, 40], fill="black")  # a line
    draw.rectangle([50, 14, 52, 16], fill="black")  # a dot above it, separated by white rows
    draw.rectangle([10, 60, 220, 80], fill="black")  # a second line
    lines = ProjectionLines().split(image, ink_mask(image), (0, 0, 300, 100))
    assert lines == [(10, 14, 201, 41), (10, 60, 221, 81)]


def test_unknown_backend_names():
    with pytest.raises(ValueError):
        make_layout("nope")
    with pytest.raises(ValueError):
        make_line_splitter("nope")
    with pytest.raises(ValueError):
        Region((0, 0, 1, 1), "paragraph")


@pytest.mark.slow
def test_rapid_layout_and_rapidocr_lines_run_offline():
    pytest.importorskip("rapid_layout")
    pytest.importorskip("rapidocr")
    page = table_formula_page(seed=1)
    regions = layout_page(page.image, make_layout("rapid"), make_line_splitter("rapidocr"))
    types = [r.type for r in regions]
    assert all(r.lines for r in regions if r.type in ("text", "title", "header"))
    assert "table" in types and "figure" in types and "title" in types
    assert [r.order for r in regions] == list(range(len(regions)))
    # every truth region's ink is covered by some detected region (missed ink is filled in)
    for truth in page.regions:
        assert any(_iou(r.bbox, truth.bbox) > 0 for r in regions), truth


def test_reading_order_a_paragraph_below_the_other_columns_end_stays_in_its_column():
    # samples/columns.jpg: the left column's last paragraph starts below the right column's
    # end, so a horizontal gap crosses the page above it; it is still the left column's.
    regions = _boxes(
        ("title", (112, 158, 563, 188)),
        ("text", (110, 246, 587, 327)), ("text", (110, 368, 587, 486)),
        ("text", (651, 246, 1114, 300)), ("text", (651, 336, 1112, 422)), ("text", (651, 458, 1112, 512)),
        ("text", (111, 522, 545, 640)),
        ("text", (110, 700, 1110, 760)),  # a full-width paragraph after the columns
    )
    ordered = reading_order(list(reversed(regions)))
    assert [r.bbox[:2] for r in ordered] == [(112, 158), (110, 246), (110, 368), (111, 522), (651, 246),
                                             (651, 336), (651, 458), (110, 700)]


def test_reading_order_of_indented_items_without_columns_is_top_to_bottom():
    # a term above its indented description, twice: no column gutter runs through a strip
    regions = _boxes(("text", (100, 100, 300, 130)), ("text", (400, 150, 900, 180)),
                     ("text", (100, 200, 300, 230)), ("text", (400, 250, 900, 280)))
    assert [r.bbox[1] for r in reading_order(list(reversed(regions)))] == [100, 150, 200, 250]


@pytest.mark.parametrize("backend", ["projection", "rapid"])
def test_the_columns_sample_reads_in_column_order(backend):
    image = Image.open(Path(__file__).parents[1] / "samples" / "columns.jpg").convert("RGB")
    regions = layout_page(image, make_layout(backend), make_line_splitter("projection"))
    body = [r for r in regions if r.type not in ("header", "footer", "title")]
    lefts = [r.bbox[0] < image.width / 2 for r in body]
    assert lefts == sorted(lefts, reverse=True)  # every left-column region before every right-column one
    tops = [r.bbox[1] for r, left in zip(body, lefts) if left]
    assert tops == sorted(tops)


def _manual_page() -> tuple[Image.Image, dict]:
    """A manual's page as Sphinx sets one: a running header over a rule, a paragraph, a code
    listing in a drawn frame, a paragraph, and a grammar whose names, `::=` and rules sit in
    aligned cells (a rule runs on to a second row)."""
    face = font(24)
    image = Image.new("RGB", (1200, 1100), "white")
    draw = ImageDraw.Draw(image)
    draw.text((100, 60), "Why3 Documentation, Release 1.5.1", font=face, fill="black")
    draw.line([(100, 96), (1100, 96)], fill="black", width=2)
    draw.text((100, 160), "For example, applying remove h on the following goal", font=face, fill="black")
    draw.rectangle([(140, 210), (1100, 330)], outline="black", width=2)
    for row, code in enumerate(["axiom h : true", "goal G : true", "constant x : int"]):
        draw.text((150, 220 + 36 * row), code, font=face, fill="black")
    draw.text((100, 370), "produces the following goal:", font=face, fill="black")
    grammar = [("file", "::=", "module*"), ("module", "::=", '"module" uident decl* "end"'),
               ("", "", '| "scope" uident'), ("decl", "::=", '"type" type_decl'), ("type_case", "::=", "uident")]
    rows = []
    for row, (name, symbol, rule) in enumerate(grammar):
        y = 450 + 36 * row
        draw.text((100, y), name, font=face, fill="black")
        draw.text((330, y), symbol, font=face, fill="black")
        draw.text((420, y), rule, font=face, fill="black")
        rows.append(y)
    return image, {"header_right": 100 + face.getlength("Why3 Documentation, Release 1.5.1"), "grammar_rows": rows}


def test_a_framed_listing_and_rules_are_not_a_table_and_a_grammar_reads_across():
    # The frame around a listing and the rule under the header are decorations: without
    # them the page is text, the listing's lines are lines and the header is as wide as its
    # words. The grammar's cells are read row by row, not as three columns.
    image, truth = _manual_page()
    regions = layout_page(image, ProjectionLayout(), ProjectionLines())
    assert "table" not in [r.type for r in regions], [(r.type, r.bbox) for r in regions]
    header = regions[0]
    assert header.bbox[1] < 100 and header.bbox[2] <= truth["header_right"] + 4
    lines = [line for region in regions for line in (region.lines or [])]
    listing = [line for line in lines if 210 < line[1] < 330]
    assert len(listing) == 3 and all(line[0] >= 145 for line in listing)  # inside the frame
    # row by row, each row's cells left to right (a wide blank stretch cuts a line into
    # its pieces), the continuation row with its rule alone
    grammar = [line for line in lines if line[1] >= 440]
    row_of = [min(range(len(truth["grammar_rows"])), key=lambda r: abs(truth["grammar_rows"][r] + 12 - (line[1] + line[3]) / 2))
              for line in grammar]
    assert row_of == sorted(row_of) and sorted(set(row_of)) == list(range(len(truth["grammar_rows"])))
    assert all(a[0] < b[0] for a, b, ra, rb in zip(grammar, grammar[1:], row_of, row_of[1:]) if ra == rb)
    pieces = [[line for line, r in zip(grammar, row_of) if r == row] for row in range(len(truth["grammar_rows"]))]
    assert [len(row) >= 2 for row in pieces] == [True, True, False, True, True]
    assert [row[0][0] < 150 for row in pieces] == [True, True, False, True, True]  # the name first


def test_a_grammar_whose_every_rule_has_a_name_reads_across():
    # As Sphinx sets a grammar: `::=` right after the longest name, so the names and
    # symbols make one column as many lines high as the rules' column, narrow beside it;
    # and a rule alone on its row between headings (name, `::=` and rule one row of pieces).
    face = font(24)
    image = Image.new("RGB", (1300, 700), "white")
    draw = ImageDraw.Draw(image)
    draw.text((100, 60), "Constant definition", font=face, fill="black")
    draw.text((100, 130), "py_constant", font=face, fill="black")
    draw.text((262, 130), "::=", font=face, fill="black")
    draw.text((330, 130), '"#@" "constant" NEWLINE identifier "=" expr NEWLINE', font=face, fill="black")
    draw.text((100, 220), "Function definition", font=face, fill="black")
    grammar = [("py_function", 'logic_def? "def" identifier "(" params? ")" return_type? ":"'),
               ("params", 'param ("," param)*'), ("param", 'identifier (":" py_type)?'),
               ("return_type", '"->" py_type')]
    rows = []
    for row, (name, rule) in enumerate(grammar):
        y = 300 + 36 * row
        draw.text((100, y), name, font=face, fill="black")
        draw.text((262, y), "::=", font=face, fill="black")
        draw.text((330, y), rule, font=face, fill="black")
        rows.append(y)
    regions = layout_page(image, ProjectionLayout(), ProjectionLines())
    lines = [line for region in regions for line in (region.lines or [])]
    # the single row's pieces, then the heading below it, then the grammar row by row,
    # each row's pieces left to right
    centres = [(line[1] + line[3]) / 2 for line in lines]
    for (a, b), (ca, cb) in zip(zip(lines, lines[1:]), zip(centres, centres[1:])):
        assert cb > ca + 20 or (abs(cb - ca) <= 10 and b[0] > a[2]), lines
    row_of = [min(range(len(rows)), key=lambda r: abs(rows[r] + 12 - (line[1] + line[3]) / 2))
              for line in lines if line[1] >= 290]
    assert row_of == sorted(row_of) and sorted(set(row_of)) == list(range(len(rows)))
    assert "formula" not in [r.type for r in regions]


def test_centred_lines_of_text_are_text_and_a_centred_fraction_a_formula():
    # an author and affiliation centred under a title have the page's line pitch and equal
    # bands; the synthetic page's display formula (a fraction) has neither
    face = font(24)
    image = Image.new("RGB", (1200, 700), "white")
    draw = ImageDraw.Draw(image)
    for n, text in enumerate(wrap("the first paragraph of the page runs across the whole width of its column " * 3,
                                  face, 1000)[:3]):
        draw.text((100, 80 + 34 * n), text, font=face, fill="black")
    for n, text in enumerate(["Vishaal Rajani & Cole Zmurchok", "University of Alberta"]):
        draw.text((600 - face.getlength(text) / 2, 260 + 34 * n), text, font=face, fill="black")
    for n, text in enumerate(wrap("and the second paragraph of the page runs across its column as well " * 3,
                                  face, 1000)[:3]):
        draw.text((100, 420 + 34 * n), text, font=face, fill="black")
    regions = layout_page(image, ProjectionLayout(), ProjectionLines())
    centred = [r for r in regions if 250 < r.bbox[1] < 300]
    assert len(centred) == 1 and centred[0].type == "text" and len(centred[0].lines) == 2, regions
    page = table_formula_page(seed=0)
    types = [r.type for r in layout_page(page.image, ProjectionLayout(), ProjectionLines())]
    assert types.count("formula") == page.types.count("formula") == 1


def test_a_booktabs_table_is_one_table_region_between_its_rules():
    """A table set with booktabs rules (top, mid, bottom) and no padding between its rows:
    whitespace cuts alone part it at its rules and rows (the rules then read as lines of
    dots); found by its stacked rules it is one table region, and its grid has a wrapped
    header row and one row a body line."""
    from gravityocr.pipelines.tables import table_grid

    face = font(22)
    image = Image.new("RGB", (1100, 900), "white")
    draw = ImageDraw.Draw(image)
    for n, text in enumerate(wrap("the settings of each language are listed in the table below " * 3, face, 900)[:3]):
        draw.text((100, 80 + 34 * n), text, font=face, fill="black")
    draw.text((330, 230), "Table 1: Default values", font=face, fill="black")
    draw.line([(100, 280), (1000, 280)], fill="black", width=3)
    header = [("language", ""), ("thousand", "sep."), ("decimal", "sign"), ("unit", "sep.")]
    for column, (first, second) in enumerate(header):
        draw.text((110 + 220 * column, 292), first, font=face, fill="black")
        draw.text((110 + 220 * column, 320), second, font=face, fill="black")
    draw.line([(100, 360), (1000, 360)], fill="black", width=2)
    body = [("English", ",", ".", "none"), ("German", "\\,", ",", "none"), ("Dutch", "\\,", ",", "none")]
    for row, cells in enumerate(body):
        for column, cell in enumerate(cells):
            draw.text((110 + 220 * column, 372 + 30 * row), cell, font=face, fill="black")
    draw.line([(100, 470), (1000, 470)], fill="black", width=3)
    for n, text in enumerate(wrap("after the table the text goes on as before with more words " * 3, face, 900)[:3]):
        draw.text((100, 540 + 34 * n), text, font=face, fill="black")

    regions = layout_page(image, ProjectionLayout(), ProjectionLines())
    tables = [r for r in regions if r.type == "table"]
    assert len(tables) == 1, [(r.type, r.bbox) for r in regions]
    x0, y0, x1, y1 = tables[0].bbox
    assert y0 <= 280 and y1 >= 470 and x0 <= 100 and x1 >= 1000
    assert all(r.bbox[3] <= 280 or r.bbox[1] >= 470 for r in regions if r is not tables[0])
    grid, _ = table_grid(ink_mask(image), tables[0].bbox)
    assert (grid.rows, grid.columns) == (4, 4)
    assert [len(cell.lines) for cell in grid.cells if cell.row == 0] == [1, 2, 2, 2]
    assert all(len(cell.lines) == 1 for cell in grid.cells if cell.row > 0)


def test_a_line_of_marks_alone_is_not_read():
    """A piece of a page that holds marks alone (`::=` between a grammar's name and its rule,
    a wide blank on each side: a block of its own) would be blown up to a letter's size by
    the recogniser's normalisation and read as a run of dots: the planner makes no crop of
    it; the words around it are read."""
    from gravityocr.pipelines.documents import Page
    from gravityocr.pipelines.regions import PageStats, marks_only
    from gravityocr.pipelines.page_ocr import PagePlanner

    face = font(22)
    image = Image.new("RGB", (1100, 600), "white")
    draw = ImageDraw.Draw(image)
    for n, text in enumerate(wrap("the grammar of the language is given below in the usual notation " * 3, face, 900)[:3]):
        draw.text((100, 80 + 34 * n), text, font=face, fill="black")
    draw.text((100, 260), "py_import", font=face, fill="black")
    draw.text((480, 260), "::=", font=face, fill="black")
    draw.text((760, 260), "identifier", font=face, fill="black")
    mask = ink_mask(image)
    line_height = PageStats.of(mask).line_height
    marks = (478, 262, 520, 290)
    assert marks_only(mask, marks, line_height) and not marks_only(mask, (98, 258, 230, 292), line_height)

    plan = PagePlanner().plan(Page("grammar", 1, image, image.width, image.height))
    lines = [crop.line for crop in plan.crops]
    assert not any(x0 < 520 and x1 > 478 and y0 < 290 and y1 > 262 for x0, y0, x1, y1 in lines), lines
    row = [line for line in lines if 250 < line[1] < 300]
    assert len(row) == 2 and row[0][0] < 110 and row[1][0] > 750  # the name and the rule
