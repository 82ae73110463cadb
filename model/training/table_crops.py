"""Table crops: a grid of short cells (words and numbers from the text sources, optional
header, merged cells in hard stages) with its ruling, drawn as an ink mask; the target HTML
is derived from the same layout.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from PIL import Image, ImageDraw

from gravityocr.model.training.crop_fonts import bold_variant, font_info, sized_font
from gravityocr.model.training.curriculum import ALNUM, CHARSETS, TOKEN_PX, CurriculumStage
from gravityocr.model.training.text_sources import clean_text, corpus, number_phrase

TABLE_FORBIDDEN = frozenset("<>&")  # would be ambiguous inside HTML targets


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


_WORD = re.compile(r"[A-Za-zÀ-ÿ]+(?:['-][A-Za-zÀ-ÿ]+)?")


def _cell_text(rng: random.Random, column_kind: str, allowed: frozenset[str], header: bool) -> str:
    """1-8 characters: a word or two from the prose, or a number, as table cells hold them."""
    allowed = allowed - TABLE_FORBIDDEN
    for _ in range(50):
        if column_kind == "number" and not header:
            raw = number_phrase(rng) if rng.random() < 0.6 else str(rng.randint(0, 99999))
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


def render_table_mask(rng: random.Random, stage: CurriculumStage) -> tuple[Image.Image, TableLayout]:
    stem = rng.choice(stage.fonts)
    info = font_info(stem)
    allowed = CHARSETS[stage.charset] & info.charset & font_info(bold_variant(stem)).charset
    layout = _table_layout(rng, stage, allowed)
    body, bold = sized_font(stem), sized_font(bold_variant(stem))
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
