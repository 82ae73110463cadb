"""Synthetic training and evaluation crops: rendered text lines, tables and formulas with targets.

No document data set is reachable here, so the small model learns from crops rendered on
the fly. Everything is deterministic by seed, so a training run, a held-out set and a test
can name a crop by (seed, stage, kind) alone.

Scale is chosen for the model, not for looks: one visual token covers 28x28 px, and the
small model learns to read along a line only when one character's advance is about one
token column (see docs/training-the-small-model.md). So text is rendered with an
average advance of ~28 px and a line about two token rows (56 px) tall.

Text comes from material installed on any Debian image (licence and copyright files for
prose, Python sources of installed packages for code) plus generated numbers, dates and
prices. The R, gnuplot and Octave manuals and Python's documentation are reserved for
independent evaluation and are never read here.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import math
import os
import random
import re
import textwrap
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import matplotlib
import numpy as np
from matplotlib.font_manager import FontProperties
from matplotlib.mathtext import MathTextParser
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter, ImageFont

from gravityocr.model.evaluation.scores import canonicalize_latex
from gravityocr.model.network.tokenizer import character_vocabulary

KINDS = ("text", "table", "formula")

TOKEN_PX = 28  # one visual token: 14-px patches merged 2x2
MAX_WIDTH = 1200
MAX_HEIGHT = 400

VOCABULARY = frozenset(character_vocabulary()) | {"\n"}
ASCII_PRINTABLE = frozenset(chr(c) for c in range(32, 127))
ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ")
CHARSETS = {"alnum": ALNUM, "ascii": ASCII_PRINTABLE, "full": VOCABULARY - {"\n"}}
TABLE_FORBIDDEN = frozenset("<>&")  # would be ambiguous inside HTML targets


@dataclass(frozen=True)
class CurriculumStage:
    """How hard the crops of one training stage are. Fonts are file stems of matplotlib's fonts."""

    name: str
    min_chars: int = 2
    max_chars: int = 5
    max_lines: int = 1  # 1: single lines; >1: short paragraphs joined by "\n"
    fonts: tuple[str, ...] = ("DejaVuSansMono",)
    charset: str = "alnum"  # "alnum" | "ascii" | "full" (the whole vocabulary)
    noise: float = 0.0  # 0..1: scanner-like degradation
    table_max_rows: int = 4
    table_max_cols: int = 4
    merged_cells: bool = False
    formula_complexity: int = 0  # 0..3
    formula_fonts: tuple[str, ...] = ("dejavusans", "cm", "stix", "dejavuserif", "stixsans")
    type_weights: dict[str, float] = field(default_factory=lambda: {"text": 1.0})


_MONO = ("DejaVuSansMono",)
_REGULAR = ("DejaVuSansMono", "DejaVuSans", "DejaVuSerif", "cmtt10")
_ALL_FONTS = (
    "DejaVuSansMono", "DejaVuSansMono-Bold", "DejaVuSans", "DejaVuSans-Bold", "DejaVuSans-Oblique",
    "DejaVuSerif", "DejaVuSerif-Bold", "DejaVuSerif-Italic", "STIXGeneral", "STIXGeneralItalic",
    "STIXGeneralBol", "cmr10", "cmtt10", "cmss10",
)

CURRICULUM: list[CurriculumStage] = [
    CurriculumStage("mono-2-5", 2, 5),
    CurriculumStage("mono-3-11", 3, 11),
    CurriculumStage("mono-3-11-punct", 3, 11, charset="ascii"),
    CurriculumStage("fonts-3-11", 3, 11, fonts=_REGULAR, charset="ascii", noise=0.05),
    CurriculumStage("fonts-8-20", 8, 20, fonts=_REGULAR, charset="ascii", noise=0.1),
    CurriculumStage("fonts-20-40", 20, 40, fonts=_ALL_FONTS, charset="full", noise=0.2),
    CurriculumStage("paragraphs", 20, 40, max_lines=3, fonts=_ALL_FONTS, charset="full", noise=0.25),
    CurriculumStage(
        "tables-formulas-intro", 20, 40, max_lines=3, fonts=_ALL_FONTS, charset="full", noise=0.25,
        table_max_rows=2, table_max_cols=3, formula_complexity=1,
        type_weights={"text": 0.6, "table": 0.2, "formula": 0.2},
    ),
    CurriculumStage(
        "tables-formulas", 20, 40, max_lines=4, fonts=_ALL_FONTS, charset="full", noise=0.35,
        table_max_rows=3, table_max_cols=4, formula_complexity=2,
        type_weights={"text": 0.5, "table": 0.25, "formula": 0.25},
    ),
    CurriculumStage(
        "hard", 20, 40, max_lines=4, fonts=_ALL_FONTS, charset="full", noise=0.5,
        table_max_rows=4, table_max_cols=4, merged_cells=True, formula_complexity=3,
        type_weights={"text": 0.5, "table": 0.25, "formula": 0.25},
    ),
]


@dataclass(frozen=True)
class TableCell:
    row: int
    col: int
    text: str
    rowspan: int = 1
    colspan: int = 1


@dataclass(frozen=True)
class TableLayout:
    """The grid a table crop was drawn from; the target HTML is derived from it."""

    n_rows: int
    n_cols: int
    cells: tuple[TableCell, ...]  # in HTML order: row by row, left to right
    ruling: str  # "grid" | "horizontal" | "none"
    header: bool

    def to_html(self) -> str:
        rows = []
        for r in range(self.n_rows):
            tds = []
            for cell in self.cells:
                if cell.row != r:
                    continue
                attrs = ""
                if cell.colspan > 1:
                    attrs += f' colspan="{cell.colspan}"'
                if cell.rowspan > 1:
                    attrs += f' rowspan="{cell.rowspan}"'
                tds.append(f"<td{attrs}>{cell.text}</td>")
            rows.append("<tr>" + "".join(tds) + "</tr>")
        return "<table>" + "".join(rows) + "</table>"


@dataclass
class SyntheticCrop:
    image: Image.Image  # RGB
    type: str  # "text" | "table" | "formula"
    text: str  # the target the recogniser must write
    table: TableLayout | None = None  # the rendered grid, for tables


# ---------------------------------------------------------------- fonts


_OT1_FONTS = {"cmr10", "cmss10", "cmb10", "cmti10"}
_OT1_WRONG_GLYPHS = set("\"<>\\_{|}`'")  # these code points hold other glyphs in OT1 fonts


@dataclass(frozen=True)
class FontInfo:
    path: str
    charset: frozenset[str]
    size: int  # px, so the average advance is ~TOKEN_PX and a line ~2 token rows
    line_top: int  # offset that puts the tallest reference glyph at y=0
    line_height: int


def _font_dir() -> Path:
    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


_ADVANCE_SAMPLE = "The quick brown fox jumps over the lazy dog, 1234567890. Licence terms: (c) 2019 holders."
_HEIGHT_SAMPLE = "ÁÉÖbdfhklgjpqy()[]|"


@functools.cache
def font_info(stem: str) -> FontInfo:
    from fontTools.ttLib import TTFont  # a matplotlib dependency

    path = str(_font_dir() / f"{stem}.ttf")
    cmap = TTFont(path, lazy=True).getBestCmap()
    charset = frozenset(c for c in CHARSETS["full"] if ord(c) in cmap)
    if stem in _OT1_FONTS:
        charset -= _OT1_WRONG_GLYPHS
    probe = ImageFont.truetype(path, 100)
    advance = probe.getlength(_ADVANCE_SAMPLE) / len(_ADVANCE_SAMPLE) / 100
    core = probe.getbbox("Hgjy()")
    size = int(round(min(TOKEN_PX / advance, 58 / ((core[3] - core[1]) / 100))))
    font = ImageFont.truetype(path, size)
    top, bottom = font.getbbox(_HEIGHT_SAMPLE)[1::2]
    return FontInfo(path, charset, size, top, bottom - top)


def _font(stem: str) -> ImageFont.FreeTypeFont:
    return _truetype(font_info(stem).path, font_info(stem).size)


@functools.cache
def _truetype(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, size)


def _bold_variant(stem: str) -> str:
    for candidate in (stem.split("-")[0] + "-Bold", {"STIXGeneral": "STIXGeneralBol"}.get(stem, "")):
        if candidate and (_font_dir() / f"{candidate}.ttf").exists():
            return candidate
    return stem


# ---------------------------------------------------------------- corpus

_RESERVED_PACKAGES = re.compile(r"^(r-|gnuplot|octave|python[0-9.]*-doc)")
_CODE_PACKAGES = ("numpy", "matplotlib", "PIL", "rapidfuzz", "apted", "yaml", "tqdm", "safetensors")
_FALLBACK_PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this software.",
    "This program is distributed in the hope that it will be useful, but without any warranty.",
    "Redistribution and use in source and binary forms, with or without modification, are permitted.",
    "All rights reserved. Copyright notices must be retained in all copies of the work.",
    "The results were recorded on 12 March 2021 and checked twice by the team.",
    "Please read the following terms carefully before using the service.",
    "A short summary of the changes is given in the table below.",
]
_FALLBACK_CODE = [
    "def main(argv=None):",
    "    return sum(x * x for x in values)",
    "if __name__ == \"__main__\":",
    "result = {key: value for key, value in items.items()}",
    "for i in range(len(data) - 1):",
    "raise ValueError(f\"unknown option {name!r}\")",
]
_TYPOGRAPHIC = str.maketrans({"‘": "'", "’": "'", "“": '"', "”": '"', "–": "-", "—": "-", "…": "...",
                              "\t": " ", "•": "*", "·": ".", "×": "x", "÷": "/"})


@dataclass(frozen=True)
class Corpus:
    prose: tuple[str, ...]
    code: tuple[str, ...]


def _read_lines(path: Path, limit_bytes: int) -> list[str]:
    try:
        raw = path.read_bytes()[:limit_bytes].decode("utf-8", errors="ignore")
    except OSError:
        return []
    return [" ".join(line.split()) for line in raw.splitlines()]


CORPUS_FILE_VARIABLE = "GRAVITYOCR_CORPUS"


def write_corpus(path: str | Path) -> None:
    """Save this machine's corpus, so another machine (a leased GPU) renders the same text."""
    found = corpus()
    Path(path).write_text(json.dumps({"prose": found.prose, "code": found.code}))


@functools.cache
def corpus() -> Corpus:
    """Prose and code lines found on this machine, read once; a built-in list where none are.
    A file written by `write_corpus`, named in $GRAVITYOCR_CORPUS, replaces them."""
    if os.environ.get(CORPUS_FILE_VARIABLE):
        saved = json.loads(Path(os.environ[CORPUS_FILE_VARIABLE]).read_text())
        return Corpus(tuple(saved["prose"]), tuple(saved["code"]))
    prose: dict[str, None] = {}
    paths = sorted(Path("/usr/share/common-licenses").glob("*")) + sorted(Path("/usr/share/doc").glob("*/copyright"))
    for path in paths:
        if path.parent.name != "common-licenses" and _RESERVED_PACKAGES.match(path.parent.name):
            continue
        for line in _read_lines(path, 32_000):
            if 12 <= len(line) <= 200 and sum(c.isalpha() for c in line) > len(line) // 2:
                prose.setdefault(line)
    code: dict[str, None] = {}
    for package in _CODE_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        for path in sorted(root.rglob("*.py"))[:40]:
            for line in _read_lines(path, 16_000):
                if 8 <= len(line) <= 120 and not line.startswith(('"""', "'''")):
                    code.setdefault(line)
    return Corpus(tuple(prose) or tuple(_FALLBACK_PROSE), tuple(code) or tuple(_FALLBACK_CODE))


def clean_text(text: str, allowed: frozenset[str]) -> str:
    """Map text onto `allowed`: typographic forms to ASCII, accents stripped, the rest dropped."""
    out = []
    for char in text:
        if char in allowed:
            out.append(char)
            continue
        char = char.translate(_TYPOGRAPHIC)
        if all(c in allowed for c in char):
            out.append(char)
            continue
        base = "".join(c for c in unicodedata.normalize("NFKD", char) if c in allowed)
        out.append(base)
    return " ".join("".join(out).split())


_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December"]


def _number_phrase(rng: random.Random) -> str:
    """A number as documents print them: amounts, prices, dates, times, percentages, versions."""
    form = rng.randrange(10)
    if form == 0:
        return str(rng.randint(0, 9999))
    if form == 1:
        return f"{rng.randint(1000, 9_999_999):,}"
    if form == 2:
        return f"{rng.choice('$€£¥')}{rng.randint(0, 9999)}.{rng.randint(0, 99):02d}"
    if form == 3:
        return f"{rng.uniform(-100, 100):.{rng.randint(1, 3)}f}"
    if form == 4:
        return f"{rng.randint(0, 100)}.{rng.randint(0, 9)}%"
    if form == 5:
        return f"{rng.randint(1990, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if form == 6:
        return f"{rng.randint(1, 28)} {rng.choice(_MONTHS)} {rng.randint(1900, 2030)}"
    if form == 7:
        return f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(1990, 2030)}"
    if form == 8:
        return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    return f"v{rng.randint(0, 12)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}"


_NUMBER_LABELS = ["Total", "Subtotal", "Amount", "Balance", "Date", "Due", "Invoice No.", "Page", "Ref.", "Tel.",
                  "Qty", "Price", "Rate", "Tax", "Net", "Order", "Account", "Version", "Time", "Year"]


def _number_field(rng: random.Random) -> str:
    """A labelled or bare number, as forms, invoices and reports print them."""
    form = rng.randrange(5)
    if form == 0:
        return f"{rng.choice(_NUMBER_LABELS)}: {_number_phrase(rng)}"
    if form == 1:
        return f"{rng.choice(_NUMBER_LABELS)} {_number_phrase(rng)}"
    if form == 2:
        return f"{rng.randint(1, 500)} of {rng.randint(500, 9999)}"
    if form == 3:
        return f"{_number_phrase(rng)} - {_number_phrase(rng)}"
    return _number_phrase(rng)


def _passage(rng: random.Random, source: str, min_length: int) -> list[str]:
    """Consecutive lines of one source, at least `min_length` characters in all."""
    if source == "numbers":
        fields = [_number_field(rng)]
        while sum(len(f) + 2 for f in fields) < min_length:
            fields.append(_number_field(rng))
        return [rng.choice([" ", ", ", "; ", " | "]).join(fields)]
    lines = corpus().prose if source == "prose" else corpus().code
    start = rng.randrange(len(lines))
    out, total = [], 0
    while total < min_length and len(out) < len(lines):
        out.append(lines[(start + len(out)) % len(lines)])
        total += len(out[-1]) + 1
    return out


_SOURCE_WEIGHTS = {"prose": 0.55, "code": 0.2, "numbers": 0.25}


def _window(rng: random.Random, text: str, length: int) -> str:
    """A `length`-character piece of text, starting at a word where it can and not ending mid-word."""
    if len(text) <= length:
        return text
    start = rng.randrange(len(text) - length + 1)
    if length >= 8:
        space = text.rfind(" ", 0, start + 1)
        start = space + 1 if space >= 0 and start - space < length // 2 else start
    piece = text[start:start + length]
    if start + length < len(text) and text[start + length] != " ":
        cut = piece.rfind(" ")
        if cut >= int(length * 0.7):
            piece = piece[:cut]
    return piece.strip()


def sample_line_text(rng: random.Random, stage: CurriculumStage, allowed: frozenset[str]) -> str:
    length = rng.randint(stage.min_chars, stage.max_chars)
    for _ in range(100):
        source = rng.choices(list(_SOURCE_WEIGHTS), list(_SOURCE_WEIGHTS.values()))[0]
        cleaned = clean_text(" ".join(_passage(rng, source, length)), allowed)
        text = _window(rng, cleaned, length)
        if len(text) >= stage.min_chars:
            return text
    return "".join(rng.choice(sorted(allowed - {" "})) for _ in range(length))


def sample_paragraph(rng: random.Random, stage: CurriculumStage, allowed: frozenset[str]) -> list[str]:
    n_lines = rng.randint(1, stage.max_lines)
    if n_lines == 1:
        return [sample_line_text(rng, stage, allowed)]
    width = rng.randint(stage.min_chars, stage.max_chars)
    source = rng.choices(list(_SOURCE_WEIGHTS), list(_SOURCE_WEIGHTS.values()))[0]
    if source == "code":  # code keeps its own line breaks
        lines = [clean_text(x, allowed)[:width].rstrip() for x in _passage(rng, "code", 10_000)[:n_lines]]
        lines = [x for x in lines if x]
    else:
        cleaned = clean_text(" ".join(_passage(rng, source, width * (n_lines + 1))), allowed)
        lines = textwrap.wrap(_window(rng, cleaned, width * (n_lines + 1)), width)[:n_lines]
    return lines or [sample_line_text(rng, stage, allowed)]


# ---------------------------------------------------------------- rendering helpers


def _fit_width(font: ImageFont.FreeTypeFont, text: str, max_px: int, min_chars: int) -> str:
    while len(text) > min_chars and font.getlength(text) > max_px:
        text = text[:-1].rstrip()
    return text


def _render_text_mask(rng: random.Random, stage: CurriculumStage) -> tuple[Image.Image, str]:
    stem = rng.choice(stage.fonts)
    info = font_info(stem)
    allowed = CHARSETS[stage.charset] & info.charset
    font = _font(stem)
    margin = rng.randint(2, 8)
    lines = [_fit_width(font, line, MAX_WIDTH - 2 * margin - 4, 1) for line in sample_paragraph(rng, stage, allowed)]
    leading = rng.randint(0, 6) if len(lines) > 1 else 0
    pitch = info.line_height + leading
    width = int(max(font.getlength(line) for line in lines)) + 2 * margin
    height = pitch * len(lines) - leading + 2 * margin
    mask = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(mask)
    for i, line in enumerate(lines):
        draw.text((margin, margin + i * pitch - info.line_top), line, font=font, fill=255)
    return mask, "\n".join(lines)


_WORD = re.compile(r"[A-Za-zÀ-ÿ]+(?:['-][A-Za-zÀ-ÿ]+)?")


def _cell_text(rng: random.Random, column_kind: str, allowed: frozenset[str], header: bool) -> str:
    """1-8 characters: a word or two from the prose, or a number, as table cells hold them."""
    allowed = allowed - TABLE_FORBIDDEN
    for _ in range(50):
        if column_kind == "number" and not header:
            raw = _number_phrase(rng) if rng.random() < 0.6 else str(rng.randint(0, 99999))
        else:
            words = [w for w in _WORD.findall(rng.choice(corpus().prose)) if len(w) <= 8]
            if not words:
                continue
            i = rng.randrange(len(words))
            raw = " ".join(words[i:i + 2]) if rng.random() < 0.25 else words[i]
            if header:
                raw = raw[:1].upper() + raw[1:]
        text = clean_text(raw, allowed)
        if 1 <= len(text) <= 8:
            return text
    return rng.choice(sorted(allowed & ALNUM - {" "}))


def _table_layout(rng: random.Random, stage: CurriculumStage, allowed: frozenset[str]) -> TableLayout:
    n_rows = rng.randint(min(2, stage.table_max_rows), stage.table_max_rows)
    n_cols = rng.randint(min(2, stage.table_max_cols), stage.table_max_cols)
    header = rng.random() < 0.6
    column_kinds = ["word"] + [rng.choice(["word", "number", "number"]) for _ in range(n_cols - 1)]
    covered: set[tuple[int, int]] = set()
    spans: dict[tuple[int, int], tuple[int, int]] = {}
    if stage.merged_cells and rng.random() < 0.6:
        if n_cols >= 3 and (rng.random() < 0.5 or n_rows < 3):
            r, c = 0, rng.randint(1, n_cols - 2)
            spans[(r, c)] = (1, 2)
            covered.add((r, c + 1))
        elif n_rows >= 3:
            r = rng.randint(1 if header else 0, n_rows - 2)
            spans[(r, 0)] = (2, 1)
            covered.add((r + 1, 0))
    cells = []
    for r in range(n_rows):
        for c in range(n_cols):
            if (r, c) in covered:
                continue
            rowspan, colspan = spans.get((r, c), (1, 1))
            is_header = header and r == 0
            empty = not is_header and c > 0 and rng.random() < 0.04
            text = "" if empty else _cell_text(rng, column_kinds[c], allowed, is_header)
            cells.append(TableCell(r, c, text, rowspan, colspan))
    ruling = rng.choice(["grid", "grid", "horizontal", "none"])
    return TableLayout(n_rows, n_cols, tuple(cells), ruling, header)


def _render_table_mask(rng: random.Random, stage: CurriculumStage) -> tuple[Image.Image, TableLayout]:
    stem = rng.choice(stage.fonts)
    info = font_info(stem)
    allowed = CHARSETS[stage.charset] & info.charset & font_info(_bold_variant(stem)).charset
    layout = _table_layout(rng, stage, allowed)
    body, bold = _font(stem), _font(_bold_variant(stem))
    fonts = {cell: (bold if layout.header and cell.row == 0 else body) for cell in layout.cells}
    pad_x, pad_y, margin = rng.randint(8, 16), rng.randint(3, 8), rng.randint(3, 8)
    line_px = rng.randint(1, 3)
    col_w = [0] * layout.n_cols
    for cell in sorted(layout.cells, key=lambda c: c.colspan):
        need = fonts[cell].getlength(cell.text) + 2 * pad_x
        have = sum(col_w[cell.col:cell.col + cell.colspan])
        for c in range(cell.col, cell.col + cell.colspan):
            col_w[c] += int(math.ceil(max(0, need - have) / cell.colspan))
    col_w = [max(w, 2 * pad_x + TOKEN_PX) for w in col_w]
    row_h = info.line_height + 2 * pad_y
    xs = [margin + sum(col_w[:c]) for c in range(layout.n_cols + 1)]
    ys = [margin + r * row_h for r in range(layout.n_rows + 1)]
    mask = Image.new("L", (xs[-1] + margin + line_px, ys[-1] + margin + line_px), 0)
    draw = ImageDraw.Draw(mask)
    right_aligned = [rng.random() < 0.5 for _ in range(layout.n_cols)]
    for cell in layout.cells:
        x0, x1 = xs[cell.col], xs[cell.col + cell.colspan]
        y0, y1 = ys[cell.row], ys[cell.row + cell.rowspan]
        font = fonts[cell]
        text_w = font.getlength(cell.text)
        if cell.colspan > 1:
            x = (x0 + x1 - text_w) / 2
        elif right_aligned[cell.col] and not (layout.header and cell.row == 0):
            x = x1 - pad_x - text_w
        else:
            x = x0 + pad_x
        y = (y0 + y1 - info.line_height) / 2 - info.line_top
        draw.text((x, y), cell.text, font=font, fill=255)
        if layout.ruling == "grid":
            draw.rectangle((x0, y0, x1 + line_px - 1, y1 + line_px - 1), outline=255, width=line_px)
    if layout.ruling == "horizontal":
        rules = [ys[0], ys[-1]] + ([ys[1]] if layout.header else [])
        for y in rules:
            draw.rectangle((xs[0], y, xs[-1] + line_px - 1, y + line_px - 1), fill=255)
    return mask, layout


# ---------------------------------------------------------------- formulas

_VARIABLES = list("xyzabcnkmtpqrs")
_INDICES = list("ijkn") + ["0", "1", "2"]
_GREEK = [r"\alpha", r"\beta", r"\gamma", r"\delta", r"\theta", r"\lambda", r"\mu", r"\pi", r"\sigma",
          r"\omega", r"\phi", r"\epsilon", r"\Delta", r"\Omega", r"\Sigma"]
_RELATIONS = ["=", "=", "=", r"\leq", r"\geq", r"\neq", r"\approx", "<", ">"]
_UPPER_LIMITS = ["1", "n", "N", "T", r"\infty"]
_FUNCTIONS = ["f", "g", "h", r"\sin", r"\cos", r"\log", r"\exp"]
_OPERATORS = ["+", "-", "+", "-", r"\cdot", r"\times", r"\pm"]


def _symbol(rng: random.Random, complexity: int) -> str:
    if complexity >= 1 and rng.random() < 0.3:
        return rng.choice(_GREEK)
    return rng.choice(_VARIABLES)


def _term(rng: random.Random, complexity: int, depth: int = 0) -> str:
    """One summand; `complexity` bounds which constructs may appear, `depth` bounds nesting."""
    choices = ["symbol", "power", "subscript", "coefficient"]
    if complexity >= 1:
        choices += ["frac", "subsup", "function"]
    if complexity >= 2 and depth < 1:
        choices += ["sqrt", "sum", "integral", "paren"]
    if complexity >= 3 and depth < 2:
        choices += ["nested_frac", "root_n", "limit", "prod"]
    kind = rng.choice(choices)
    s = _symbol(rng, complexity)
    if kind == "symbol":
        return s
    if kind == "power":
        return f"{s}^{{{rng.choice(['2', '3', 'n', '-1', 'k'])}}}"
    if kind == "subscript":
        return f"{s}_{{{rng.choice(_INDICES)}}}"
    if kind == "coefficient":
        return f"{rng.randint(2, 99)}{s}"
    if kind == "frac":
        return rf"\frac{{{_small(rng, complexity)}}}{{{_small(rng, complexity)}}}"
    if kind == "subsup":
        return f"{s}_{{{rng.choice(_INDICES)}}}^{{{rng.choice(['2', '3', 'n'])}}}"
    if kind == "function":
        return f"{rng.choice(_FUNCTIONS)}({s})"
    inner = _expression(rng, complexity, depth + 1, max_terms=2)
    if kind == "sqrt":
        return rf"\sqrt{{{inner}}}"
    if kind == "sum":
        i = rng.choice("ijk")
        upper = rng.choice(_UPPER_LIMITS)
        return rf"\sum_{{{i}={rng.randint(0, 1)}}}^{{{upper}}}{_symbol(rng, 0)}_{{{i}}}"
    if kind == "integral":
        t = rng.choice("xt")
        upper = rng.choice(_UPPER_LIMITS)
        return rf"\int_{{{rng.randint(0, 1)}}}^{{{upper}}}f({t})d{t}"
    if kind == "paren":
        return f"({inner})^{{{rng.choice(['2', 'n'])}}}"
    if kind == "nested_frac":
        return rf"\frac{{{inner}}}{{{_term(rng, complexity, depth + 1)}}}"
    if kind == "root_n":
        return rf"\sqrt[{rng.choice(['3', 'n'])}]{{{inner}}}"
    if kind == "limit":
        return rf"\lim_{{n\to\infty}}{_term(rng, 1, depth + 1)}"
    return rf"\prod_{{k=1}}^{{n}}{_symbol(rng, 0)}_{{k}}"


def _small(rng: random.Random, complexity: int) -> str:
    return rng.choice([str(rng.randint(1, 9)), _symbol(rng, complexity), f"{_symbol(rng, 0)}+{rng.randint(1, 9)}"])


def _concat(*parts: str) -> str:
    """Join LaTeX pieces, with a space where a command name would otherwise run into a letter."""
    out = ""
    for part in parts:
        out += " " + part if re.search(r"\\[a-zA-Z]+$", out) and part[:1].isalpha() else part
    return out


def _expression(rng: random.Random, complexity: int, depth: int = 0, max_terms: int = 3) -> str:
    terms = [_term(rng, complexity, depth) for _ in range(rng.randint(1, max_terms))]
    out = terms[0]
    for term in terms[1:]:
        out = _concat(out, rng.choice(_OPERATORS), term)
    return out


def sample_formula(rng: random.Random, complexity: int) -> str:
    """A random formula in canonical LaTeX (canonicalize_latex leaves it unchanged)."""
    body = _expression(rng, complexity)
    if rng.random() < 0.6:
        body = _concat(_expression(rng, complexity, max_terms=2), rng.choice(_RELATIONS), body)
    return canonicalize_latex(body)


_MATH_PARSER = MathTextParser("agg")


def _render_formula_mask(rng: random.Random, stage: CurriculumStage) -> tuple[Image.Image, str]:
    size = rng.randint(44, 56)
    fontset = rng.choice(stage.formula_fonts)
    margin = rng.randint(3, 10)
    for attempt in range(20):
        latex = sample_formula(rng, max(0, stage.formula_complexity - attempt // 10))
        parsed = _MATH_PARSER.parse(f"${latex}$", dpi=72, prop=FontProperties(size=size, math_fontfamily=fontset))
        ink = np.asarray(parsed.image, dtype=np.uint8)
        if ink.shape[1] + 2 * margin <= MAX_WIDTH and ink.shape[0] + 2 * margin <= MAX_HEIGHT:
            break
    mask = Image.new("L", (ink.shape[1] + 2 * margin, ink.shape[0] + 2 * margin), 0)
    mask.paste(Image.fromarray(ink), (margin, margin))
    return mask, latex


# ---------------------------------------------------------------- degradation


def _degrade(rng: random.Random, mask: Image.Image, noise: float) -> Image.Image:
    """Ink on paper, then scanner-like damage scaled by `noise` in [0, 1]; grayscale throughout."""
    paper = 255 - rng.randint(0, int(40 * noise))
    ink = rng.randint(0, int(90 * noise))
    image = Image.composite(Image.new("L", mask.size, ink), Image.new("L", mask.size, paper), mask)
    if noise <= 0:
        return image.convert("RGB")
    if rng.random() < noise:
        angle = rng.uniform(-2.0, 2.0) * min(1.0, noise * 2)
        image = image.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=paper)
    if rng.random() < noise * 0.6:
        image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 0.3 + noise)))
    if rng.random() < noise * 0.5:
        image = ImageEnhance.Contrast(image).enhance(rng.uniform(1 - 0.5 * noise, 1 + 0.3 * noise))
    if rng.random() < noise * 0.5:  # sensor noise
        pixels = np.asarray(image, dtype=np.float32)
        jitter = np.random.default_rng(rng.getrandbits(64)).normal(0, rng.uniform(1.5, 1.5 + 6 * noise), pixels.shape)
        image = Image.fromarray(np.clip(pixels + jitter, 0, 255).astype(np.uint8))
    if rng.random() < noise * 0.4:  # dust: sparse dark and light specks
        pixels = np.array(image)
        speckle = np.random.default_rng(rng.getrandbits(64))
        hit = speckle.random(pixels.shape) < rng.uniform(0.001, 0.001 + 0.01 * noise)
        pixels[hit] = np.where(speckle.random(int(hit.sum())) < 0.5, ink, paper)
        image = Image.fromarray(pixels)
    if rng.random() < noise * 0.5:
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=rng.randint(int(95 - 60 * noise), 95))
        image = Image.open(io.BytesIO(buffer.getvalue())).convert("L")
    return image.convert("RGB")


def _shrink_to_limits(image: Image.Image) -> Image.Image:
    scale = min(1.0, MAX_WIDTH / image.width, MAX_HEIGHT / image.height)
    if scale >= 1.0:
        return image
    size = (max(1, int(image.width * scale)), max(1, int(image.height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS)


# ---------------------------------------------------------------- public entry points


def generate_crop(seed: int, stage: CurriculumStage, kind: str | None = None) -> SyntheticCrop:
    """The crop named by (seed, stage, kind); kind None draws it from stage.type_weights."""
    if kind is None:
        kinds = [k for k in KINDS if stage.type_weights.get(k, 0) > 0]
        kind = random.Random(f"kind|{seed}|{stage!r}").choices(kinds, [stage.type_weights[k] for k in kinds])[0]
    if kind not in KINDS:
        raise ValueError(f"unknown crop kind {kind!r}; expected one of {KINDS}")
    rng = random.Random(f"{seed}|{kind}|{stage!r}")
    table = None
    if kind == "text":
        mask, target = _render_text_mask(rng, stage)
    elif kind == "table":
        mask, table = _render_table_mask(rng, stage)
        target = table.to_html()
    else:
        mask, target = _render_formula_mask(rng, stage)
    image = _shrink_to_limits(_degrade(rng, mask, stage.noise))
    return SyntheticCrop(image=image, type=kind, text=target, table=table)


def crop_stream(seed: int, stage: CurriculumStage, kind: str | None = None) -> Iterator[SyntheticCrop]:
    """Crops for seeds seed, seed+1, ... forever. Training keeps its seeds below 10**9 (held-out uses the rest)."""
    index = seed
    while True:
        yield generate_crop(index, stage, kind)
        index += 1


def stage_by_name(name: str) -> CurriculumStage:
    for stage in CURRICULUM:
        if stage.name == name:
            return stage
    raise KeyError(f"no curriculum stage {name!r}; stages: {[s.name for s in CURRICULUM]}")
