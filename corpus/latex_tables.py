"""Simple LaTeX tabulars found in .tex sources, with the table each shows.

A tabular is kept only when every cell reduces to text through a small allow-list of macros
whose output is known (anything else drops the tabular): the text Computer Modern (OT1) shows,
so a tabular set from its own source shows exactly its target's text.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from gravityocr.corpus.table_form import Cell, Table, TableLimits, accept, clean_text

# Commands whose braced argument is shown as text (font changes only).
_TEXT_ARG = frozenset({"textbf", "textit", "textsl", "textsf", "textrm", "textup", "textmd", "textnormal",
                       "emph", "mbox", "underline", "textsc", "texttt"})
# Declarations that change only the font, size or alignment of what follows.
_DECLARATIONS = frozenset({
    "bfseries", "itshape", "slshape", "upshape", "mdseries", "rmfamily", "sffamily", "normalfont", "em",
    "bf", "it", "sl", "rm", "sf", "tiny", "scriptsize", "footnotesize", "small", "normalsize", "large",
    "Large", "centering", "raggedright", "raggedleft", "hfill", "strut", "relax", "null", "scshape", "sc",
})
_TT_DECLARATIONS = frozenset({"ttfamily", "tt"})
# Commands that print known text (logos as their letters, \ldots as the dots it shows).
_WORDS = {"LaTeX": "LaTeX", "TeX": "TeX", "ldots": "...", "dots": "...", "textellipsis": "...", "ss": "ß",
          "ae": "æ", "o": "ø", "aa": "å", "textendash": "–", "textemdash": "—", "textquoteleft": "‘",
          "textquoteright": "’", "textquotedblleft": "“", "textquotedblright": "”", "newline": " ",
          "space": " ", "S": "§", "copyright": "©", "textbullet": "•", "textbackslash": "\\"}
_SYMBOLS = {"&": "&", "%": "%", "$": "$", "#": "#", "_": "_", "{": "{", "}": "}", " ": " "}
_ACCENTS = {'"': "\u0308", "'": "\u0301", "`": "\u0300", "^": "\u0302", "~": "\u0303", "c": "\u0327"}
# OT1 Computer Modern shows these differently outside typewriter type (¡ ¿ — ”): not transcribable.
_OT1_ODD = frozenset("<>|")


class _Unsupported(Exception):
    pass


class _LatexText:
    """Plain text of a cell's LaTeX, exactly as Computer Modern (OT1) shows it, or _Unsupported."""

    def __init__(self, source: str) -> None:
        self.s = source
        self.i = 0

    def convert(self) -> str:
        return self._group(tt=False, until=None)

    def _group(self, tt: bool, until: str | None) -> str:
        out: list[str] = []
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if until is not None and c == until:
                self.i += 1
                return "".join(out)
            self.i += 1
            if c == "\\":
                text, tt = self._command(tt)
                out.append(text)
            elif c == "{":
                out.append(self._group(tt, "}"))
            elif c == "}":
                raise _Unsupported("unbalanced }")
            elif c in "$^_#&%":
                raise _Unsupported(f"{c} in text")
            elif c == "~":
                out.append(" ")
            elif not tt and c in "-`'!?\"":
                out.append(self._ligature(c))
            elif not tt and c in _OT1_ODD:
                raise _Unsupported(f"{c} in OT1 text")
            else:
                out.append(c)
        if until is not None:
            raise _Unsupported("unclosed {")
        return "".join(out)

    def _ligature(self, c: str) -> str:
        s, i = self.s, self.i
        if c == "-":
            if s.startswith("--", i):
                self.i += 2
                return "—"
            if s.startswith("-", i):
                self.i += 1
                return "–"
            return "-"
        if c in "`'" and s.startswith(c, i):
            self.i += 1
            return "“" if c == "`" else "”"
        if c in "!?" and s.startswith("`", i):
            raise _Unsupported("Spanish ligature")
        return {"`": "‘", "'": "’", '"': "”"}.get(c, c)

    def _argument(self, tt: bool) -> str:
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1
        if self.i >= len(self.s):
            raise _Unsupported("missing argument")
        c = self.s[self.i]
        self.i += 1
        if c == "{":
            return self._group(tt, "}")
        if c in "\\{}$%&#^_~":
            raise _Unsupported("unbraced command argument")
        return c

    def _command(self, tt: bool) -> tuple[str, bool]:
        s = self.s
        match = re.match(r"[A-Za-z]+", s[self.i:])
        if match is None:  # a control symbol
            if self.i >= len(s):
                raise _Unsupported("trailing backslash")
            c = s[self.i]
            self.i += 1
            if c in _SYMBOLS:
                return _SYMBOLS[c], tt
            if c == "/":
                return "", tt
            if c in _ACCENTS:
                return self._accent(c, tt), tt
            raise _Unsupported(f"\\{c}")
        name = match.group(0)
        self.i += len(name)
        if name in _WORDS or name in _DECLARATIONS or name in _TT_DECLARATIONS:
            self._eat_space()
        if name == "verb":
            return self._verb(), tt
        if name in _TEXT_ARG:
            return self._argument(tt or name == "texttt"), tt
        if name in _DECLARATIONS:
            return "", tt
        if name in _TT_DECLARATIONS:
            return "", True
        if name in _WORDS:
            return _WORDS[name], tt
        if name in _ACCENTS:  # \c{c}
            return self._accent(name, tt), tt
        raise _Unsupported(f"\\{name}")

    def _eat_space(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \n\t":
            self.i += 1
        if self.s.startswith("{}", self.i):
            self.i += 2

    def _accent(self, accent: str, tt: bool) -> str:
        base = self._argument(tt)
        composed = unicodedata.normalize("NFC", base + _ACCENTS[accent])
        if len(composed) != 1:
            raise _Unsupported("accent on more than one letter")
        return composed

    def _verb(self) -> str:
        if self.i >= len(self.s) or self.s[self.i].isalpha() or self.s[self.i] in " *":
            raise _Unsupported("\\verb form")
        delimiter = self.s[self.i]
        end = self.s.find(delimiter, self.i + 1)
        if end < 0:
            raise _Unsupported("unclosed \\verb")
        text = self.s[self.i + 1:end]
        self.i = end + 1
        return text


def latex_cell_text(source: str) -> str | None:
    """The text a tabular cell shows, whitespace folded, or None when the cell uses math or a macro
    whose output is not known text."""
    try:
        text = _LatexText(source).convert()
    except _Unsupported:
        return None
    return clean_text(text)


@dataclass(frozen=True)
class Tabular:
    """One simple tabular: its source (rendered as written) and the table it shows."""

    source: str  # \\begin{tabular}{spec}...\\end{tabular}, comments removed
    table: Table
    line: int  # 1-based line of \\begin{tabular} in its file


_COLUMN = re.compile(r"\s*(?:([lcr|])|p\{\s*(?:\d*\.?\d+\s*(?:pt|mm|cm|in|em|ex)|\d*\.?\d*\s*\\(?:linewidth|textwidth|columnwidth))\s*\}|(@\{\}))")
_RULES = re.compile(r"\s*(?:\\hline|\\toprule|\\midrule|\\bottomrule|\\cline\{\d+-\d+\}|\\cmidrule(?:\([lr]+\))?\{\d+-\d+\})")
_BEGIN = re.compile(r"\\begin\{tabular\}")
_ROW_END = re.compile(r"^\s*\*?\s*(?:\[\s*-?\d*\.?\d+\s*(?:pt|mm|cm|in|em|ex)\s*\])?")
_MULTICOLUMN = re.compile(r"\s*\\multicolumn\{(\d+)\}\{([lcr|\s]*)\}\{")


def column_count(spec: str) -> int | None:
    """Columns of a spec made of l, c, r, |, p{width}, empty @{} and *{n}{...} of those; None for
    anything else."""
    spec = re.sub(r"\*\s*\{?(\d+)\}?\s*\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", lambda m: m.group(2) * int(m.group(1)), spec)
    spec = re.sub(r"\*\s*(\d)\s*([lcr])", lambda m: m.group(2) * int(m.group(1)), spec)
    count, i = 0, 0
    while i < len(spec):
        match = _COLUMN.match(spec, i)
        if match is None:
            return None if spec[i:].strip() else count
        count += 1 if match.group(0).strip() not in ("|", "@{}") else 0
        i = match.end()
    return count


_COMMENT = re.compile(r"(?<!\\)(?:\\\\)*%")


def strip_comments(source: str) -> str:
    """LaTeX without its % comments (an escaped \\% stays); a comment also joins its line to the next."""
    return re.sub(r"(?<!\\)((?:\\\\)*)%[^\n]*\n?[ \t]*", r"\1", source)


def _split(body: str, separator: str) -> list[str]:
    """`body` split at `separator` outside braces and \\verb, escaped characters kept whole."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            verb = re.match(r"\\verb(.)", body[i:])
            if verb and not verb.group(1).isalpha():
                end = body.find(verb.group(1), i + 6)
                i = len(body) if end < 0 else end + 1
                continue
            if depth == 0 and separator == "\\\\" and body.startswith("\\\\", i):
                parts.append(body[start:i])
                i += 2
                start = i
                continue
            i += 2
            continue
        if depth == 0 and c == separator:
            parts.append(body[start:i])
            start = i + 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        i += 1
    parts.append(body[start:])
    return parts


def _row_cells(row: str) -> list[Cell] | None:
    cells = []
    for raw in _split(row, "&"):
        colspan = 1
        multi = _MULTICOLUMN.match(raw)
        if multi:
            colspan = int(multi.group(1))
            inner = _split(raw[multi.end():], "}")
            if len(inner) < 2 or inner[1].strip():
                return None  # text after \multicolumn{..}{..}{..}
            raw = inner[0]
        text = latex_cell_text(raw)
        if text is None:
            return None
        cells.append(Cell(text, colspan))
    return cells


def parse_tabular(spec: str, body: str, limits: TableLimits = TableLimits()) -> Table | None:
    """The table a simple tabular shows, or None if any part of it is outside the simple subset."""
    columns = column_count(spec)
    if columns is None or "\\begin" in body or "\\end" in body:
        return None
    rows = []
    for raw in _split(body, "\\\\"):
        raw = _ROW_END.sub("", raw)  # what follows \\: * and [2pt]
        while match := _RULES.match(raw):
            raw = raw[match.end():]
        raw = raw.strip()
        if not raw:
            continue
        cells = _row_cells(raw)
        if cells is None or sum(c.colspan for c in cells) > columns:
            return None
        if any(c.text for c in cells):
            rows.append(cells)
    return accept(rows, limits)


def latex_tabulars(document: str, limits: TableLimits = TableLimits()) -> list[Tabular | None]:
    """One entry per `\\begin{tabular}` of `document` outside comments, in order: the simple
    tabular, or None."""
    found: list[Tabular | None] = []
    line, counted = 1, 0
    for begin in _BEGIN.finditer(document):
        line += document.count("\n", counted, begin.start())
        counted = begin.start()
        if _COMMENT.search(document, document.rfind("\n", 0, begin.start()) + 1, begin.start()):
            continue
        end = document.find("\\end{tabular}", begin.end())
        chunk = strip_comments(document[begin.end():end + len("\\end{tabular}")]) if end >= 0 else ""
        found.append(_tabular_at(chunk, 0, line, limits))
    return found


def _braced(text: str, i: int) -> int:
    """The index just past the group that opens at text[i] == "{", or -1 if it never closes."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        depth += (c == "{") - (c == "}")
        i += 1
        if depth == 0:
            return i
    return -1


def _tabular_at(text: str, i: int, line: int, limits: TableLimits) -> Tabular | None:
    option = re.match(r"\s*\[[tbc]\]", text[i:i + 16])
    if option:
        i += option.end()
    if not text.startswith("{", i) or (spec_end := _braced(text, i)) < 0:
        return None
    spec = text[i + 1:spec_end - 1]
    end = text.find("\\end{tabular}", spec_end)
    if end < 0 or "\\begin{tabular}" in text[spec_end:end]:
        return None
    body = text[spec_end:end]
    table = parse_tabular(spec, body, limits)
    if table is None:
        return None
    return Tabular("\\begin{tabular}{" + spec + "}" + body + "\\end{tabular}", table, line)


def decode_tex(data: bytes) -> str:
    """UTF-8, else Latin-1 (which decodes any bytes; a wrong guess gives characters no kept cell
    can hold, and the image is set from the same decoded text as the target)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")
