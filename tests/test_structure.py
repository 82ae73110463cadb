"""A text region's lines as markdown keeps them: listings fenced with their line breaks and
indentation, numbered headings as headings, lists as lists, tables of contents without dot
leaders (pipelines/structure.py); on a rendered page read by the shipped model too."""

from __future__ import annotations

import matplotlib
from PIL import Image, ImageDraw, ImageFont
from rapidfuzz.distance import Levenshtein

from gravityocr.pipelines.assembly import LineResult, RegionResult, page_markdown, PageResult
from gravityocr.pipelines.structure import text_markdown


def _line(x0: int, x1: int, text: str, y: int = 0) -> LineResult:
    return LineResult((x0, y, x1, y + 12), text)


def test_a_listing_is_fenced_with_its_lines_and_indentation():
    lines = [_line(10, 290, "\\begin{tabular}{ll}"), _line(40, 200, "a & b \\\\"), _line(10, 150, "\\end{tabular}")]
    fenced = text_markdown(lines)
    assert fenced.splitlines()[0] == "```" and fenced.splitlines()[-1] == "```"
    body = fenced.splitlines()[1:-1]
    assert [line.strip() for line in body] == ["\\begin{tabular}{ll}", "a & b \\\\", "\\end{tabular}"]
    assert body[1].startswith(" ") and not body[0].startswith(" ")  # its indentation kept


def test_prose_stays_a_paragraph_even_with_brackets_and_slashes():
    lines = [_line(10, 500, "The path /usr/share/doc (see above) names the files"),
             _line(10, 500, "that every package installs; a reader follows it to"),
             _line(10, 220, "its documentation.")]
    assert text_markdown(lines) is None


def test_numbered_headings_lists_and_contents():
    assert text_markdown([_line(10, 300, "4.4 Formatting Error Messages")]) == "### 4.4 Formatting Error Messages"
    assert text_markdown([_line(10, 300, "4 Usage")]) == "## 4 Usage"
    assert text_markdown([_line(10, 300, "3 apples were eaten.")]) is None  # a sentence, not a heading
    assert text_markdown([_line(10, 300, "just one line")]) is None
    items = [_line(10, 500, "• first item of a list"), _line(30, 300, "continued here"), _line(10, 300, "• second")]
    assert text_markdown(items) == "- first item of a list continued here\n- second"
    contents = [_line(10, 500, "1 Introduction . . . . . . . 5"), _line(10, 500, "2 Usage . . . . . . . . . 9")]
    assert text_markdown(contents) == "- 1 Introduction 5\n- 2 Usage 9"


def test_the_page_markdown_uses_the_structure_and_the_page_text_does_not_change():
    listing = RegionResult(1, "text", (0, 0, 300, 40), task="text", text="int x = 1; { y(); }",
                           lines=[_line(10, 200, "int x = 1;"), _line(10, 120, "{ y(); }", 14)])
    page = PageResult("d", 1, 600, 800, 150.0, "projection", [listing])
    assert page_markdown(page) == "```\nint x = 1;\n{ y(); }\n```"
    assert "int x = 1; { y(); }" in page.text()


MONO = f"{matplotlib.get_data_path()}/fonts/ttf/DejaVuSansMono.ttf"
SERIF = f"{matplotlib.get_data_path()}/fonts/ttf/DejaVuSerif.ttf"
SERIF_BOLD = f"{matplotlib.get_data_path()}/fonts/ttf/DejaVuSerif-Bold.ttf"
LISTING = ["\\begin{tabular}{|l|r|}", "  \\hline", "  name & value \\\\", "  \\hline", "\\end{tabular}"]


def test_a_rendered_page_with_a_listing_and_a_numbered_heading_reads_as_fenced_code_and_a_heading():
    from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer
    from gravityocr.pipelines.documents import Page
    from gravityocr.pipelines.page_ocr import PageOcr
    from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig

    image = Image.new("RGB", (1240, 900), "white")
    draw = ImageDraw.Draw(image)
    draw.text((120, 100), "4.4 Formatting Error Messages", font=ImageFont.truetype(SERIF_BOLD, 30), fill="black")
    body = ImageFont.truetype(SERIF, 22)
    prose = ["Error messages are set by the class itself and every package may change",
             "their look. The following table is written by the example below it."]
    for i, line in enumerate(prose):
        draw.text((120, 190 + 34 * i), line, font=body, fill="black")
    mono = ImageFont.truetype(MONO, 22)
    for i, line in enumerate(LISTING):
        draw.text((160, 330 + 34 * i), line, font=mono, fill="black")
    with CropRecognizer(load_recognizer(DEFAULT_MODEL_DIR), RecognizerConfig()) as recognizer:
        [result] = PageOcr(recognizer).read_pages([Page("listing", 1, image, image.width, image.height)])
    markdown = page_markdown(result)
    assert "### 4.4 Formatting Error Messages" in markdown, markdown
    fence = markdown.split("```")
    assert len(fence) == 3, markdown
    read = [line for line in fence[1].strip("\n").splitlines()]
    assert len(read) == len(LISTING), markdown
    for got, want in zip(read, LISTING):
        assert Levenshtein.normalized_distance(got.strip(), want.strip()) < 0.15, (got, want)
    assert read[1].startswith("  ") and not read[0].startswith(" ")  # the indentation kept
