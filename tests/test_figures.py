"""No text region dropped: text never taken for a figure, light-on-dark text read, a picture's
words kept (pipelines/figures.py, pipelines/inverted.py).

The page is a manual's page as KOMA-Script sets one (a white-on-dark running head; prose; two
LaTeX listings with a rule down their side; two example tables with vertical rules, set close
to the prose around them), written here and set by pdflatex: no reserved package is used.
Before figures were laid out again, its listings, tables and prose were one figure and its
head another, neither read; every character of its text layer must now lie in a crop that is
read.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image, ImageDraw

from gravityocr.corpus.synthetic_pages import font, paragraph_text, wrap
from gravityocr.pipelines.assembly import page_markdown
from gravityocr.pipelines.documents import Page, load_pages
from gravityocr.pipelines.figures import holds_text
from gravityocr.pipelines.inverted import dark_areas, light_on_dark
from gravityocr.pipelines.regions import PageStats, ink_mask
from gravityocr.pipelines.ocr_cli import default_model_path, has_weights
from gravityocr.pipelines.page_ocr import PagePlanner

needs_pdflatex = pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
needs_model = pytest.mark.skipif(not has_weights(default_model_path()), reason="no default model in model/default")

DPI = 150
HEAD = "Chapter 3: Fonts and Headings"
PROSE = (
    "The settings for the heading levels are made with the option described above. Note that a change of the "
    "font for one element does not change the others, so each of them may be set on its own. You may use any "
    "font command that the class accepts in these settings.",
    "The following table lists the default values of the elements for the headings of the document. They can "
    "be changed at any point of the preamble.",
    "If you want a different size for a level, change it with the second command. The first line of the "
    "following example sets the size of the numbers of all chapters at once.",
    "The second example table shows which element is used by which command of the class.",
    "Further settings of the headings are made with the commands described in the next section of this "
    "chapter of the guide.",
)
LISTINGS = (
    ("\\setkomafont{disposition}{\\normalcolor\\bfseries}", "\\addtokomafont{section}{\\large}",
     "\\setkomafont{subsection}{\\normalsize\\itshape}"),
    ("\\addtokomafont{chapterprefix}{\\small}", "\\renewcommand*{\\chapterformat}{%",
     "  \\thechapter\\autodot\\enskip}"),
)
TABLES = (
    (("Element", "Default"), ("part", "\\Huge"), ("chapter", "\\huge"), ("section", "\\Large")),
    (("Command", "Element", "Level"), ("\\part", "part", "-1"), ("\\chapter", "chapter", "0")),
)
PREAMBLE = r"""\documentclass[paper=a4,fontsize=11pt,parskip=false]{scrbook}
\usepackage{xcolor}
\usepackage{listings}
\usepackage{scrlayer-scrpage}
\lstset{basicstyle=\ttfamily\small,columns=fullflexible,keepspaces=true,frame=leftline,framerule=0.8pt,
  xleftmargin=1.5em,aboveskip=4pt,belowskip=4pt}
\pagestyle{scrheadings}
\clearpairofpagestyles
\ohead{\colorbox{black!85}{\parbox[c][1.6\baselineskip]{.5\textwidth}{\color{white}\sffamily\bfseries\centering HEAD}}}
\ofoot{\pagemark}
\hyphenpenalty=10000 \exhyphenpenalty=10000 \sloppy
"""


def _tabular(rows) -> str:
    cell = lambda text: f"\\verb|{text}|" if text.startswith("\\") else text
    body = [" & ".join(cell(text) for text in row) + r" \\" for row in rows]
    columns = "|" + "l|" * len(rows[0])
    return "\n".join([r"\begin{center}", rf"\begin{{tabular}}{{{columns}}}", r"\hline", body[0], r"\hline",
                      *body[1:], r"\hline", r"\end{tabular}", r"\end{center}"])


def manual_page_source() -> tuple[str, str]:
    """The page's LaTeX and its text in reading order (the head first, the page number last)."""
    parts, truth = [PROSE[0]], [HEAD, PROSE[0]]
    for n in range(2):
        parts += [r"\begin{lstlisting}", *LISTINGS[n], r"\end{lstlisting}", PROSE[2 * n + 1], _tabular(TABLES[n]),
                  PROSE[2 * n + 2]]
        truth += [*LISTINGS[n], PROSE[2 * n + 1], " ".join(" ".join(row) for row in TABLES[n]), PROSE[2 * n + 2]]
    source = PREAMBLE.replace("HEAD", HEAD) + "\\begin{document}\n\\setcounter{page}{131}\n" + "\n".join(parts) \
        + "\n\\end{document}\n"
    return source, "\n".join(truth + ["131"])


@pytest.fixture(scope="module")
def manual_page(tmp_path_factory) -> tuple[bytes, str]:
    """The page's PDF and its true text."""
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed")
    source, truth = manual_page_source()
    folder = tmp_path_factory.mktemp("manual")
    (folder / "page.tex").write_text(source)
    subprocess.run(["pdflatex", "-interaction=batchmode", "-halt-on-error", "-no-shell-escape", "page.tex"],
                   cwd=folder, check=True, capture_output=True, timeout=300)
    return (folder / "page.pdf").read_bytes(), truth


def _character_boxes(pdf: bytes) -> list[tuple[str, float, float]]:
    """Every printed character of the PDF's first page and its centre in page pixels at DPI."""
    import pypdfium2 as pdfium

    page = pdfium.PdfDocument(pdf)[0]
    text, height, scale = page.get_textpage(), page.get_height(), DPI / 72
    out = []
    for index in range(text.count_chars()):
        character = text.get_text_range(index, 1)
        if character.strip():
            left, bottom, right, top = text.get_charbox(index)
            out.append((character, (left + right) / 2 * scale, (height - (top + bottom) / 2) * scale))
    return out


@needs_pdflatex
def test_no_figure_of_a_manual_page_swallows_its_text(manual_page):
    pdf, _ = manual_page
    [page] = load_pages("manual.pdf", pdf, DPI)
    plan = PagePlanner().plan(page)
    kinds = [region.type for region in plan.result.regions]
    assert "figure" not in kinds, [(r.type, r.bbox) for r in plan.result.regions]
    assert kinds.count("table") == 2
    pad = PagePlanner().config.padding
    lost = [character for character, x, y in _character_boxes(pdf)
            if not any(x0 - pad <= x <= x1 + pad and y0 - pad <= y <= y1 + pad
                       for x0, y0, x1, y1 in (crop.line or plan.result.regions[crop.region].bbox for crop in plan.crops))]
    assert lost == []  # every character of the text layer lies in a crop that is read
    head = [crop for crop in plan.crops if crop.line[1] < 140]
    assert len(head) == 1 and np.asarray(head[0].image.convert("L")).mean() > 128  # read dark on light


@needs_pdflatex
@needs_model
def test_a_manual_page_reads_whole_with_its_head(manual_page):
    from gravityocr.model.evaluation.scores import page_similarity
    from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer
    from gravityocr.pipelines.page_ocr import PageOcr
    from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig

    pdf, truth = manual_page
    pages = load_pages("manual.pdf", pdf, DPI)
    [result] = PageOcr(CropRecognizer(load_recognizer(DEFAULT_MODEL_DIR), RecognizerConfig())).read_pages(pages)
    text = result.text(include_furniture=True)
    assert page_similarity(text, truth) >= 0.97, text
    assert HEAD in text and "\\setkomafont{subsection}{\\normalsize\\itshape}" in text
    assert result.warnings == []


def _white_on_dark_page() -> tuple[Image.Image, tuple[int, int, int, int]]:
    """A heading set white on a dark band above two paragraphs; the band's box."""
    import random

    image = Image.new("RGB", (1200, 700), "white")
    draw = ImageDraw.Draw(image)
    band = (100, 60, 1100, 130)
    draw.rectangle(band, fill=(40, 40, 60))
    draw.text((130, 75), "Fonts of the headings", font=font(36, bold=True), fill="white")
    face, rng = font(22), random.Random(3)
    for n, line in enumerate(wrap(paragraph_text(rng, 4), face, 1000)):
        draw.text((100, 180 + 34 * n), line, font=face, fill="black")
    return image, band


def test_a_white_on_dark_heading_is_turned_dark_on_light_and_read():
    image, band = _white_on_dark_page()
    [(box, _)] = dark_areas(ink_mask(image))
    assert box == (band[0], band[1], band[2] + 1, band[3] + 1)
    plan = PagePlanner().plan(Page("head", 1, image, image.width, image.height))
    assert "figure" not in [region.type for region in plan.result.regions]
    [heading] = [crop for crop in plan.crops if crop.line[1] < band[3]]
    gray = np.asarray(heading.image.convert("L"))
    assert gray.mean() > 128 and (gray < 100).any()  # dark words on a light ground


def test_dark_areas_without_words_are_left_as_they_are():
    # a solid block, a dark photo-like patch of noise and a bar chart's bars: no light text in them
    image = Image.new("RGB", (1000, 800), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((100, 100, 400, 300), fill="black")
    noise = np.random.default_rng(0).integers(0, 256, (200, 300), dtype=np.uint8)
    image.paste(Image.fromarray(np.where(noise > 60, 20, 230).astype(np.uint8)).convert("RGB"), (500, 100))
    for n in range(5):
        draw.rectangle((120 + 60 * n, 700 - 50 * (n + 1), 160 + 60 * n, 700), fill=(60, 60, 60))
    face = font(22)
    draw.text((100, 720), "A paragraph of text under the chart for the page's line height.", font=face, fill="black")
    assert light_on_dark(image, ink_mask(image)) is image


@needs_model
def test_a_white_on_dark_heading_reads():
    from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer
    from gravityocr.pipelines.page_ocr import PageOcr
    from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig

    image, _ = _white_on_dark_page()
    reader = PageOcr(CropRecognizer(load_recognizer(DEFAULT_MODEL_DIR), RecognizerConfig()))
    [result] = reader.read_pages([Page("head", 1, image, image.width, image.height)])
    assert result.text().startswith("Fonts of the headings\n"), result.text()


def _chart_with_labels() -> tuple[Image.Image, list[str]]:
    """A framed line chart under a paragraph, words above and below it and one inside it: a
    picture with text."""
    import random

    image = Image.new("RGB", (1200, 900), "white")
    draw = ImageDraw.Draw(image)
    face, rng = font(22), random.Random(5)
    for n, line in enumerate(wrap(paragraph_text(rng, 3), face, 1000)):
        draw.text((100, 60 + 34 * n), line, font=face, fill="black")
    draw.rectangle((200, 250, 1000, 700), outline="black", width=3)
    points = [(200 + 40 * n, 650 - int(350 * abs(np.sin(n / 4)))) for n in range(21)]
    draw.line(points, fill="black", width=4)
    labels = ["seconds per page", "pages read at once", "warm cache"]
    draw.text((520, 720), labels[1], font=face, fill="black")
    draw.text((220, 210), labels[0], font=face, fill="black")
    draw.text((290, 650), labels[2], font=face, fill="black")
    return image, labels


def test_a_picture_keeps_its_type_and_its_words_are_its_lines():
    image, labels = _chart_with_labels()
    plan = PagePlanner().plan(Page("chart", 1, image, image.width, image.height))
    [figure] = [index for index, region in enumerate(plan.result.regions) if region.type == "figure"]
    mask = ink_mask(image)
    assert not holds_text(mask, plan.result.regions[figure].bbox, PageStats.of(mask).line_height)  # a picture
    # the words inside it are its one line, read with the text prompt; the curve is no line
    inside = [crop for crop in plan.crops if crop.region == figure]
    assert [crop.task for crop in inside] == ["text"] and plan.result.regions[figure].task == "text"
    x0, y0, x1, y1 = inside[0].line
    assert 285 <= x0 and x1 <= 290 + font(22).getlength(labels[2]) + 4 and 645 <= y0 and y1 <= 680
    # the words above and below it are text of their own
    assert len([crop for crop in plan.crops if crop.region != figure and crop.line[1] > 190]) == 2


def test_a_figures_words_are_its_alt_text_and_its_json_text():
    from gravityocr.pipelines.assembly import PageResult, RegionResult

    figure = RegionResult(0, "figure", (0, 0, 10, 10), task="text", text="seconds [per] page")
    page = PageResult("d", 1, 100, 100, None, "projection", [figure])
    assert page_markdown(page, figure_prefix="d_figures/") == "![seconds \\[per\\] page](d_figures/p1-r0.png)"
    assert page_markdown(page) == "seconds [per] page"  # no folder: the words, not the link
    assert page.text() == "seconds [per] page"
    assert page.to_dict()["regions"][0]["text"] == "seconds [per] page"
    bare = PageResult("d", 1, 100, 100, None, "projection", [RegionResult(0, "figure", (0, 0, 10, 10))])
    assert page_markdown(bare) == "" and page_markdown(bare, figure_prefix="d_figures/") == "![figure](d_figures/p1-r0.png)"
