"""Generated document pages whose content is known: title, paragraphs, two columns, a
ruled table, a display formula, a figure with its caption, running header and footer.

Tests and `bench/pages.py` use them as pages with ground truth: every region's type,
box, text and reading-order position. Deterministic for a given seed; the font is
matplotlib's bundled DejaVu Sans, so nothing needs a system font.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

PAGE_WIDTH, PAGE_HEIGHT = 1240, 1754  # A4 at 150 DPI
MARGIN = 110
BODY_SIZE, TITLE_SIZE, SMALL_SIZE = 22, 40, 16
LINE_PITCH = 32  # body line spacing in pixels
PARAGRAPH_GAP = 26

WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an which have not can all "
    "their more one has been were its than also into other these some time when only new two first may "
    "document page layout reading order region column table formula figure caption recognition model "
    "decoding speculative draft verify token batch engine service image crop text line paragraph title "
    "measure result accuracy speed score distance program system method value number section analysis "
    "example paper report data set train test small large quick brown fox jumps over lazy dog"
).split()


@lru_cache(maxsize=None)
def font(size: int, bold: bool = False) -> ImageFont.FreeTypeFont:
    import matplotlib

    name = "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name), size)


@dataclass
class TruthRegion:
    type: str
    bbox: tuple[int, int, int, int]
    text: str  # plain text; HTML for tables; LaTeX for formulas; "" for figures


@dataclass
class SyntheticPage:
    image: Image.Image
    regions: list[TruthRegion] = field(default_factory=list)  # in reading order

    @property
    def types(self) -> list[str]:
        return [region.type for region in self.regions]

    def text(self, include_furniture: bool = False) -> str:
        """The page's text in reading order, figures left out (what a page score compares)."""
        skip = {"figure"} | (set() if include_furniture else {"header", "footer"})
        return "\n".join(region.text for region in self.regions if region.type not in skip)


def sentence(rng: random.Random, words: int) -> str:
    chosen = [rng.choice(WORDS) for _ in range(words)]
    return " ".join(chosen).capitalize() + "."


def paragraph_text(rng: random.Random, sentences: int = 3) -> str:
    return " ".join(sentence(rng, rng.randint(6, 12)) for _ in range(sentences))


def wrap(text: str, face: ImageFont.FreeTypeFont, width: int) -> list[str]:
    lines, current = [], ""
    for word in text.split():
        candidate = f"{current} {word}".strip()
        if current and face.getlength(candidate) > width:
            lines.append(current)
            current = word
        else:
            current = candidate
    if current:
        lines.append(current)
    return lines


class PageCanvas:
    """Draws blocks top to bottom within a column and records each as a TruthRegion."""

    def __init__(self, width: int = PAGE_WIDTH, height: int = PAGE_HEIGHT):
        self.image = Image.new("RGB", (width, height), "white")
        self.draw = ImageDraw.Draw(self.image)
        self.regions: list[TruthRegion] = []

    def _ink_box(self, box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        return tuple(int(v) for v in box)

    def text_block(self, kind: str, text: str, x: int, y: int, width: int, size: int = BODY_SIZE,
                   bold: bool = False, pitch: int = LINE_PITCH, center: bool = False) -> int:
        """Wrapped text; returns the y below it."""
        face = font(size, bold)
        lines = wrap(text, face, width)
        left, top, right, bottom = 10**9, 10**9, 0, 0
        for i, line in enumerate(lines):
            lx = x + (width - face.getlength(line)) / 2 if center else x
            box = self.draw.textbbox((lx, y + i * pitch), line, font=face)
            self.draw.text((lx, y + i * pitch), line, font=face, fill="black")
            left, top, right, bottom = min(left, box[0]), min(top, box[1]), max(right, box[2]), max(bottom, box[3])
        self.regions.append(TruthRegion(kind, self._ink_box((left, top, right, bottom)), " ".join(lines)))
        return y + len(lines) * pitch

    def table(self, rows: list[list[str]], x: int, y: int, width: int) -> int:
        face = font(BODY_SIZE)
        row_height = LINE_PITCH + 14
        cell_width = width // len(rows[0])
        height = row_height * len(rows)
        for r in range(len(rows) + 1):
            self.draw.line([(x, y + r * row_height), (x + cell_width * len(rows[0]), y + r * row_height)], fill="black", width=2)
        for c in range(len(rows[0]) + 1):
            self.draw.line([(x + c * cell_width, y), (x + c * cell_width, y + height)], fill="black", width=2)
        for r, row in enumerate(rows):
            for c, cell in enumerate(row):
                self.draw.text((x + c * cell_width + 10, y + r * row_height + 10), cell, font=face, fill="black")
        html = "<table>" + "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows) + "</table>"
        self.regions.append(TruthRegion("table", (x, y, x + cell_width * len(rows[0]) + 2, y + height + 2), html))
        return y + height

    def formula(self, x: int, y: int, width: int) -> int:
        """A centred display equation with a fraction: x = (a + b^2) / (2c)."""
        face = font(BODY_SIZE + 4)
        lhs, num, den = "x =", "a + b²", "2c"
        num_w, den_w, lhs_w = face.getlength(num), face.getlength(den), face.getlength(lhs)
        bar_w = max(num_w, den_w) + 12
        total = lhs_w + 14 + bar_w
        left = x + (width - total) / 2
        bar_y = y + 36
        self.draw.text((left, bar_y - 14), lhs, font=face, fill="black")
        fx = left + lhs_w + 14
        self.draw.text((fx + (bar_w - num_w) / 2, bar_y - 34), num, font=face, fill="black")
        self.draw.line([(fx, bar_y), (fx + bar_w, bar_y)], fill="black", width=2)
        self.draw.text((fx + (bar_w - den_w) / 2, bar_y + 6), den, font=face, fill="black")
        self.regions.append(TruthRegion("formula", (int(left), y, int(fx + bar_w), bar_y + 40),
                                        r"x=\frac{a+b^{2}}{2c}"))
        return bar_y + 40

    def figure(self, x: int, y: int, width: int, height: int, rng: random.Random) -> int:
        """A framed bar chart: graphics, no text."""
        self.draw.rectangle([x, y, x + width, y + height], outline="black", width=3)
        bars = 6
        slot = (width - 40) / bars
        for i in range(bars):
            bar_h = rng.randint(height // 5, height - 40)
            bx = x + 20 + i * slot
            self.draw.rectangle([bx + 8, y + height - 20 - bar_h, bx + slot - 8, y + height - 20], fill=(90, 90, 90))
        self.regions.append(TruthRegion("figure", (x, y, x + width, y + height), ""))
        return y + height

    def furniture(self, header: str, footer: str) -> None:
        face = font(SMALL_SIZE)
        self.draw.text((MARGIN, 40), header, font=face, fill="black")
        header_box = self.draw.textbbox((MARGIN, 40), header, font=face)
        fx = (self.image.width - face.getlength(footer)) / 2
        fy = self.image.height - 60
        self.draw.text((fx, fy), footer, font=face, fill="black")
        footer_box = self.draw.textbbox((fx, fy), footer, font=face)
        self.regions.insert(0, TruthRegion("header", self._ink_box(header_box), header))
        self.regions.append(TruthRegion("footer", self._ink_box(footer_box), footer))

    def page(self) -> SyntheticPage:
        return SyntheticPage(self.image, self.regions)


def single_column_page(seed: int = 0, paragraphs: int = 3, page_number: int = 1, title: bool = True,
                       furniture: bool = True) -> SyntheticPage:
    rng = random.Random(seed)
    canvas = PageCanvas()
    width = PAGE_WIDTH - 2 * MARGIN
    y = 150
    if title:
        y = canvas.text_block("title", sentence(rng, 4).rstrip("."), MARGIN, y, width, TITLE_SIZE, bold=True,
                              pitch=52) + 40
    for _ in range(paragraphs):
        y = canvas.text_block("text", paragraph_text(rng), MARGIN, y, width) + PARAGRAPH_GAP
    if furniture:
        canvas.furniture(f"GravityOCR sample document {seed}", f"{page_number}")
    return canvas.page()


def two_column_page(seed: int = 0, paragraphs_per_column: int = 3, page_number: int = 1) -> SyntheticPage:
    """Title across both columns, then two columns whose paragraph gaps line up (the case
    that defeats naive top-to-bottom ordering)."""
    rng = random.Random(seed)
    canvas = PageCanvas()
    gutter = 60
    column = (PAGE_WIDTH - 2 * MARGIN - gutter) // 2
    y0 = canvas.text_block("title", sentence(rng, 4).rstrip("."), MARGIN, 150, PAGE_WIDTH - 2 * MARGIN,
                           TITLE_SIZE, bold=True, pitch=52) + 40
    for x in (MARGIN, MARGIN + column + gutter):
        y = y0
        for _ in range(paragraphs_per_column):
            y = canvas.text_block("text", paragraph_text(rng, 2), x, y, column) + PARAGRAPH_GAP
    canvas.furniture(f"GravityOCR two-column sample {seed}", f"{page_number}")
    return canvas.page()


def sectioned_columns_page(seed: int = 0, page_number: int = 1) -> SyntheticPage:
    """Two sections of two columns each, a full-width heading between them; the second
    section has a figure with its caption in the left column and a ruled table in the
    right. Reading order: title, section one's left then right column, the heading, the
    left column (paragraph, figure, caption), the right (paragraph, table), the footer."""
    rng = random.Random(seed)
    canvas = PageCanvas()
    gutter = 60
    column = (PAGE_WIDTH - 2 * MARGIN - gutter) // 2
    right = MARGIN + column + gutter
    y0 = canvas.text_block("title", sentence(rng, 4).rstrip("."), MARGIN, 150, PAGE_WIDTH - 2 * MARGIN,
                           TITLE_SIZE, bold=True, pitch=52) + 40
    ends = []
    for x in (MARGIN, right):
        y = y0
        for _ in range(2):
            y = canvas.text_block("text", paragraph_text(rng, 2), x, y, column) + PARAGRAPH_GAP
        ends.append(y)
    y0 = canvas.text_block("title", f"{page_number}.1 " + sentence(rng, 3).rstrip("."), MARGIN, max(ends) + 20,
                           PAGE_WIDTH - 2 * MARGIN, TITLE_SIZE - 12, bold=True, pitch=40) + 30
    y = canvas.text_block("text", paragraph_text(rng, 2), MARGIN, y0, column) + PARAGRAPH_GAP
    y = canvas.figure(MARGIN + 40, y, column - 80, 260, rng) + 14
    canvas.text_block("caption", f"Figure {page_number}: {sentence(rng, 4)}", MARGIN, y, column, SMALL_SIZE + 2,
                      pitch=26, center=True)
    y = canvas.text_block("text", paragraph_text(rng, 2), right, y0, column) + PARAGRAPH_GAP + 10
    rows = [["name", "value"]] + [[rng.choice(WORDS), str(rng.randint(1, 999))] for _ in range(3)]
    canvas.table(rows, right + 40, y, column - 80)
    canvas.furniture(f"GravityOCR sectioned sample {seed}", f"{page_number}")
    return canvas.page()


def table_formula_page(seed: int = 0, page_number: int = 1) -> SyntheticPage:
    """Title, paragraph, ruled table, paragraph, display formula, figure + caption."""
    rng = random.Random(seed)
    canvas = PageCanvas()
    width = PAGE_WIDTH - 2 * MARGIN
    y = canvas.text_block("title", sentence(rng, 3).rstrip("."), MARGIN, 150, width, TITLE_SIZE, bold=True,
                          pitch=52) + 40
    y = canvas.text_block("text", paragraph_text(rng, 2), MARGIN, y, width) + PARAGRAPH_GAP + 10
    rows = [["name", "value", "unit"]] + [[rng.choice(WORDS), str(rng.randint(1, 999)), rng.choice(["ms", "kg", "px"])]
                                          for _ in range(3)]
    y = canvas.table(rows, MARGIN + 150, y, width - 300) + PARAGRAPH_GAP + 20
    y = canvas.text_block("text", paragraph_text(rng, 2), MARGIN, y, width) + PARAGRAPH_GAP + 10
    y = canvas.formula(MARGIN, y, width) + PARAGRAPH_GAP + 20
    y = canvas.figure(MARGIN + 250, y, width - 500, 330, rng) + 16
    canvas.text_block("caption", f"Figure {page_number}: {sentence(rng, 5)}", MARGIN, y, width, SMALL_SIZE + 2,
                      pitch=26, center=True)
    canvas.furniture(f"GravityOCR table sample {seed}", f"{page_number}")
    return canvas.page()


def sample_pages(count: int, seed: int = 0) -> list[SyntheticPage]:
    """A mix of the three kinds, for benchmarks."""
    makers = (single_column_page, two_column_page, table_formula_page)
    return [makers[i % 3](seed=seed + i, page_number=i + 1) for i in range(count)]


def pdf_bytes(pages: list[SyntheticPage], dpi: float = 150) -> bytes:
    """An image-only PDF (as a scanner writes) of the pages."""
    out = io.BytesIO()
    images = [page.image for page in pages]
    images[0].save(out, "PDF", save_all=True, append_images=images[1:], resolution=dpi)
    return out.getvalue()


def tiff_bytes(pages: list[SyntheticPage], dpi: float = 150) -> bytes:
    out = io.BytesIO()
    images = [page.image for page in pages]
    images[0].save(out, "TIFF", save_all=True, append_images=images[1:], compression="tiff_deflate", dpi=(dpi, dpi))
    return out.getvalue()
