"""Text lines and whole pages with exact labels from PDF text layers (pypdfium2).

A born-digital PDF knows its own text. pdfium's text page gives every character with its
box, font and size, and the line breaks of the page; a line is cut into segments at
large horizontal gaps (a running header's title and page number are two segments, as a
line detector would find them). A segment becomes an item only when its label is what
the image shows:
- every character maps into the recogniser's vocabulary (ligatures such as "ﬁ" are
  unfolded by NFKC, a soft hyphen at a line end is the hyphen drawn there);
- no character is set in a math or symbol font, whose text layer names other glyphs
  than it draws (CMSY's angle brackets come out as "h" and "i");
- one baseline and one font size, characters left to right (no sub- or superscripts);
- the crop holds ink.
A word space is in the label whether the PDF draws a space character, pdfium infers one, or
neither: some producers (groff's bash manual) move the pen past a space without drawing a
character, and pdfium does not always infer it. So two drawn glyphs whose advance boxes lie
`WORD_GAP_IN_FONT_SIZES` or more apart are read with a space between them: within a word the
advance boxes touch (kerns move them by hundredths of an em), while an interword space of
TeX's and groff's fonts is wider than a fifth of an em (docs/corpus.md).
A page becomes a page item when every one of its segments passes; its text is the
segments in the text layer's order, one per line.
"""

from __future__ import annotations

import ctypes
import random
import re
import statistics
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image

from gravityocr.corpus.debian import UnpackedPackage
from gravityocr.corpus.items import CorpusItem, Source

_MATH_FONT = re.compile(r"CMSY|CMMI|CMEX|CMBSY|MSAM|MSBM|LMMATH|MATH|SYMBOL|EUFM|EUSM|EUEX|RSFS|WASY|STMARY|"
                        r"DINGBAT|ZAPF|MNSYMBOL|ESINT|TXSY|PXSY|TXEX|PXEX", re.IGNORECASE)
_SOFT_HYPHENS = {"\u00ad", "\u0002", "\u2010", "\u2011"}
WORD_GAP_IN_FONT_SIZES = 0.2


@lru_cache(maxsize=1)
def vocabulary() -> frozenset[str]:
    """The characters the recogniser can write in a line (its tokenizer's, less the newline)."""
    from gravityocr.model.network.tokenizer import character_vocabulary

    return frozenset(c for c in character_vocabulary() if c != "\n")


@dataclass(frozen=True)
class Glyph:
    char: str
    box: tuple[float, float, float, float]  # left, bottom, right, top in PDF points
    advance: tuple[float, float]  # left and right of the glyph's advance (pdfium's loose box)
    font: str
    size: float
    generated: bool  # a space or line break pdfium inferred, not drawn

    @property
    def drawn(self) -> bool:
        """Ink on the page: neither a space nor a character pdfium inferred."""
        return not self.generated and not self.char.isspace()


@dataclass(frozen=True)
class Segment:
    """A run of one line between large gaps: its label and its box in PDF points."""

    text: str
    box: tuple[float, float, float, float]  # left, bottom, right, top
    size: float  # font size in points
    baseline: float  # in PDF points
    clean: bool  # the label is what the image shows (see the module docstring)


@dataclass(frozen=True)
class TextConfig:
    dpi_range: tuple[int, int] = (100, 300)
    lines_per_page: int = 12  # at most this many segments sampled from one page
    pages_per_file: int = 40  # at most this many pages sampled from one PDF
    min_chars: int = 2
    max_chars: int = 200
    paragraphs_per_page: int = 2  # at most this many multi-line blocks sampled from one page
    paragraph_lines: tuple[int, int] = (2, 6)  # lines in a paragraph item
    gap_in_font_sizes: float = 1.6  # a gap wider than this splits a line into segments


def _glyphs(text_page: pdfium.PdfTextPage) -> list[Glyph]:
    buffer = ctypes.create_string_buffer(128)
    flags = ctypes.c_int()
    loose = pdfium_c.FS_RECTF()
    glyphs = []
    for index in range(text_page.count_chars()):
        code = pdfium_c.FPDFText_GetUnicode(text_page, index)
        pdfium_c.FPDFText_GetFontInfo(text_page, index, buffer, len(buffer), ctypes.byref(flags))
        font = buffer.value.decode("latin-1").split("+")[-1]
        pdfium_c.FPDFText_GetLooseCharBox(text_page, index, loose)
        glyphs.append(Glyph(chr(code), tuple(text_page.get_charbox(index)), (loose.left, loose.right), font,
                            float(pdfium_c.FPDFText_GetFontSize(text_page, index)),
                            bool(pdfium_c.FPDFText_IsGenerated(text_page, index))))
    return glyphs


def _lines(glyphs: list[Glyph]) -> list[list[Glyph]]:
    lines, current = [], []
    for glyph in glyphs:
        if glyph.char in "\r\n":
            if current:
                lines.append(current)
            current = []
        else:
            current.append(glyph)
    if current:
        lines.append(current)
    return lines


def _split_at_gaps(line: list[Glyph], gap_in_font_sizes: float) -> list[list[Glyph]]:
    # A ligature's characters share one box, so "backwards" is measured from the last left edge.
    segments, current, last = [], [], None
    for glyph in line:
        if glyph.drawn and last is not None:
            size = max(glyph.size, 1.0)
            if glyph.box[0] - last.box[2] > gap_in_font_sizes * size or glyph.box[0] < last.box[0] - 0.3 * size:
                segments.append(current)
                current = []
        current.append(glyph)
        if glyph.drawn:
            last = glyph
    if current:
        segments.append(current)
    return segments


def _label(glyphs: list[Glyph]) -> tuple[str, bool]:
    """The segment's text and whether every character is in the vocabulary."""
    chars = []
    previous = None  # the last glyph drawn, when no space has come since
    for glyph in glyphs:
        char = glyph.char
        if not glyph.drawn:
            previous = None
        else:
            if previous is not None and glyph.advance[0] - previous.advance[1] >= WORD_GAP_IN_FONT_SIZES * max(glyph.size, 1.0):
                chars.append(" ")
            previous = glyph
        if char in _SOFT_HYPHENS:
            char = "-"
        elif char in "\u00a0\u2002\u2003\u2009\u202f":
            char = " "
        chars.append(unicodedata.normalize("NFKC", char) if char not in vocabulary() else char)
    text = " ".join("".join(chars).split())
    return text, all(c in vocabulary() for c in text)


def _segment(glyphs: list[Glyph]) -> Segment | None:
    drawn = [g for g in glyphs if g.drawn]
    if not drawn:
        return None
    text, in_vocabulary = _label(glyphs)
    sizes = [g.size for g in drawn]
    size = statistics.median(sizes)
    bottoms = [g.box[1] for g in drawn]
    # Letters and digits sit on the baseline (descenders drop ~0.25 em below it); a sub- or
    # superscript moves them further. Punctuation such as "-" or "*" floats by design.
    on_baseline = [g.box[1] for g in drawn if g.char.isalnum()] or bottoms
    baseline = statistics.median(on_baseline)
    one_size = max(sizes) - min(sizes) <= 0.05 * size
    one_baseline = all(baseline - 0.35 * size <= b <= baseline + 0.2 * size for b in on_baseline)
    left_to_right = all(b.box[0] >= a.box[0] - 0.1 * size for a, b in zip(drawn, drawn[1:]))
    no_math_font = not any(_MATH_FONT.search(g.font) for g in drawn)
    box = (min(g.box[0] for g in drawn), min(bottoms), max(g.box[2] for g in drawn), max(g.box[3] for g in drawn))
    return Segment(text, box, size, baseline, in_vocabulary and one_size and one_baseline and left_to_right and no_math_font)


def page_segments(page: pdfium.PdfPage, config: TextConfig = TextConfig()) -> list[Segment]:
    """Every segment of the page's text layer, in its order."""
    text_page = page.get_textpage()
    try:
        glyphs = _glyphs(text_page)
    finally:
        text_page.close()
    segments = []
    for line in _lines(glyphs):
        for run in _split_at_gaps(line, config.gap_in_font_sizes):
            segment = _segment(run)
            if segment is not None and segment.text:
                segments.append(segment)
    return segments


def render_page(page: pdfium.PdfPage, dpi: int) -> Image.Image:
    return page.render(scale=dpi / 72.0).to_pil().convert("RGB")


def crop_lines(image: Image.Image, page_box: tuple[float, float, float, float], dpi: int, lines: list[Segment],
               rng: random.Random) -> Image.Image | None:
    """The lines' box (widened to the font's ascent above the first line and descent below the
    last) with a random margin, from tight (a tenth of the font size) to loose (over one font
    size sideways). `page_box` is the area `image` shows, in PDF points: `page.get_bbox()`,
    which follows a box inherited from the page tree (`get_cropbox()` does not: it falls back
    to US Letter, and crops of an A4 page would miss their lines)."""
    scale = dpi / 72.0
    left, right = min(s.box[0] for s in lines), max(s.box[2] for s in lines)
    size = lines[0].size
    # The font's own extent around the baseline, whatever the run's letters: ascenders and
    # descenders of neighbouring lines stay out, these lines' own stay in.
    bottom = lines[-1].baseline - 0.27 * size
    top = lines[0].baseline + 0.78 * size
    vertical = rng.uniform(0.03, 0.18) * size
    horizontal_left = rng.uniform(0.1, 1.2) * size
    horizontal_right = rng.uniform(0.1, 1.2) * size
    page_left, _, _, page_top = page_box
    x0 = max(0, int((left - horizontal_left - page_left) * scale))
    x1 = min(image.width, int(round((right + horizontal_right - page_left) * scale)))
    y0 = max(0, int((page_top - top - vertical) * scale))
    y1 = min(image.height, int(round((page_top - bottom + vertical) * scale)))
    if x1 - x0 < 8 or y1 - y0 < 8:
        return None  # off the rendered page
    return image.crop((x0, y0, x1, y1))


def has_ink(image: Image.Image, threshold: int = 128, min_share: float = 0.002) -> bool:
    gray = np.asarray(image.convert("L"))
    return gray.size > 0 and float((gray < threshold).mean()) >= min_share


def _sampled_pages(package: UnpackedPackage, seed: int, purpose: str,
                   config: TextConfig) -> Iterator[tuple[str, int, pdfium.PdfPage, random.Random]]:
    """(file, 0-based page number, page, the file's generator) for up to `pages_per_file`
    upright pages of every PDF, in an order drawn from the seed; one generator per file and
    purpose, so lines and pages of one build are drawn independently."""
    for path in package.files(".pdf"):
        relative = package.relative(path)
        rng = random.Random(f"{seed}:{package.name}:{relative}:{purpose}")
        try:
            document = pdfium.PdfDocument(UnpackedPackage.read_bytes(path))
        except pdfium.PdfiumError:
            continue
        try:
            page_numbers = list(range(len(document)))
            rng.shuffle(page_numbers)
            for number in page_numbers[:config.pages_per_file]:
                page = document[number]
                if page.get_rotation() == 0:
                    yield relative, number, page, rng
        finally:
            document.close()


def line_items(package: UnpackedPackage, seed: int, limit: int | None = None,
               config: TextConfig = TextConfig()) -> Iterator[CorpusItem]:
    """Text-line items from every PDF of the package, deterministic for a seed."""
    count = 0
    for relative, number, page, rng in _sampled_pages(package, seed, "lines", config):
        segments = [s for s in page_segments(page, config)
                    if s.clean and config.min_chars <= len(s.text) <= config.max_chars]
        if not segments:
            continue
        chosen = rng.sample(segments, min(config.lines_per_page, len(segments)))
        dpi = rng.randint(*config.dpi_range)
        image = render_page(page, dpi)
        for segment in chosen:
            crop = crop_lines(image, page.get_bbox(), dpi, [segment], rng)
            if crop is None or not has_ink(crop):
                continue
            source = Source(package.name, relative, package.licence, page=number + 1, renderer=f"pdfium@{dpi}dpi")
            yield CorpusItem("text", crop, segment.text, source)
            count += 1
            if limit is not None and count >= limit:
                return


def paragraphs(segments: list[Segment], config: TextConfig = TextConfig()) -> list[list[Segment]]:
    """Runs of consecutive clean lines that form one block: the same left edge and size, each
    baseline one regular line step below the last (no heading, no gap, no column change)."""
    blocks: list[list[Segment]] = []
    current: list[Segment] = []
    for segment in segments:
        if current:
            last = current[-1]
            step = last.baseline - segment.baseline
            joins = (segment.clean and abs(segment.box[0] - current[0].box[0]) <= 0.5 * segment.size
                     and abs(segment.size - last.size) <= 0.05 * last.size
                     and 1.0 * last.size <= step <= 1.6 * last.size
                     and (len(current) < 2 or abs(step - (current[-2].baseline - last.baseline)) <= 0.1 * last.size))
            if joins and len(current) < config.paragraph_lines[1]:
                current.append(segment)
                continue
            if len(current) >= config.paragraph_lines[0]:
                blocks.append(current)
        current = [segment] if segment.clean else []
    if len(current) >= config.paragraph_lines[0]:
        blocks.append(current)
    return blocks


def paragraph_items(package: UnpackedPackage, seed: int, limit: int | None = None,
                    config: TextConfig = TextConfig()) -> Iterator[CorpusItem]:
    """Multi-line text items (a paragraph's lines, one per target line), deterministic for a seed."""
    count = 0
    for relative, number, page, rng in _sampled_pages(package, seed, "paragraphs", config):
        blocks = paragraphs(page_segments(page, config), config)
        if not blocks:
            continue
        dpi = rng.randint(*config.dpi_range)
        image = render_page(page, dpi)
        for block in rng.sample(blocks, min(config.paragraphs_per_page, len(blocks))):
            crop = crop_lines(image, page.get_bbox(), dpi, block, rng)
            if crop is None or not has_ink(crop):
                continue
            source = Source(package.name, relative, package.licence, page=number + 1, renderer=f"pdfium@{dpi}dpi")
            yield CorpusItem("text", crop, "\n".join(s.text for s in block), source)
            count += 1
            if limit is not None and count >= limit:
                return


def page_items(package: UnpackedPackage, seed: int, limit: int | None = None, min_lines: int = 8,
               config: TextConfig = TextConfig()) -> Iterator[CorpusItem]:
    """Whole-page items (every segment clean) with their text in reading order."""
    count = 0
    for relative, number, page, rng in _sampled_pages(package, seed, "pages", config):
        segments = page_segments(page, config)
        if len(segments) < min_lines or not all(s.clean for s in segments):
            continue
        dpi = rng.randint(150, 200)
        source = Source(package.name, relative, package.licence, page=number + 1, renderer=f"pdfium@{dpi}dpi")
        yield CorpusItem("page", render_page(page, dpi), "\n".join(s.text for s in segments), source)
        count += 1
        if limit is not None and count >= limit:
            return
