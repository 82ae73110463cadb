"""Data tables found in HTML pages, each normalised to the table form.

One entry per <table> of a page, in order of appearance: the normalised table, or None where it
is layout, navigation, nested, holds block content or fails the limits. Cell text is the text
the page shows, whitespace folded; a cell with a character the target form cannot hold drops
its table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from gravityocr.corpus.table_form import Cell, Table, TableLimits, accept, clean_text

# Cell content that makes a table layout rather than data (or that text cannot stand for).
BLOCK_TAGS = frozenset({
    "ul", "ol", "dl", "pre", "img", "table", "blockquote", "hr", "form", "input", "select", "textarea",
    "button", "iframe", "object", "embed", "svg", "math", "video", "audio", "canvas", "h1", "h2", "h3",
    "h4", "h5", "h6", "figure",
})
# Tags whose boundaries separate words.
BREAK_TAGS = frozenset({"br", "p", "div", "li", "dt", "dd", "tr", "td", "th", "caption"})
# Words in a table's class, summary, role or id that mark navigation, layout or admonition boxes.
LAYOUT_HINTS = re.compile(r"\b(?:nav\w*|navigation|simplelist|callout\w*|layout|menu\w*|toc|breadcrumbs?|"
                          r"admonition|note|tip|warning|caution|important|presentation)\b")


@dataclass
class _RawTable:
    attrs: dict
    serial: int  # order of the <table> start tag in the page
    rows: list[list[list]] = field(default_factory=list)  # [text parts, colspan, rowspan]
    cell: list | None = None
    nested: bool = False
    block: bool = False

    def start_row(self) -> None:
        self.cell = None
        self.rows.append([])

    def start_cell(self, colspan: int, rowspan: int) -> None:
        if not self.rows:
            self.rows.append([])
        self.cell = [[], colspan, rowspan]
        self.rows[-1].append(self.cell)


def _span(value: str | None) -> int:
    try:
        return max(1, int((value or "1").strip()))
    except ValueError:
        return 1


class _TableExtractor(HTMLParser):
    """Every <table> of a page with its cells' raw text and whether it is nested or holds blocks.
    Unclosed cells and rows close implicitly, as browsers close them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[_RawTable] = []
        self.done: list[_RawTable] = []
        self.skip_depth = 0  # inside <script>/<style>
        self.serial = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip_depth += 1
            return
        table = self.open[-1] if self.open else None
        if tag == "table":
            for outer in self.open:
                outer.nested = True
            self.open.append(_RawTable({k: v or "" for k, v in attrs}, self.serial, nested=bool(self.open)))
            self.serial += 1
            return
        if table is None:
            return
        values = dict(attrs)
        if tag == "tr":
            table.start_row()
        elif tag in ("td", "th"):
            table.start_cell(_span(values.get("colspan")), _span(values.get("rowspan")))
        elif table.cell is not None:
            if tag in BLOCK_TAGS:
                table.block = True
            elif tag in BREAK_TAGS:
                table.cell[0].append(" ")

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag in ("script", "style"):
            self.skip_depth -= 1

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip_depth = max(0, self.skip_depth - 1)
        elif self.open and tag == "table":
            self.done.append(self.open.pop())
        elif self.open and tag in ("td", "th"):
            self.open[-1].cell = None
        elif self.open and self.open[-1].cell is not None and tag in BREAK_TAGS:
            self.open[-1].cell[0].append(" ")

    def handle_data(self, data):
        if self.open and not self.skip_depth and self.open[-1].cell is not None:
            self.open[-1].cell[0].append(data)

    def tables(self) -> list[_RawTable]:
        """Closed and unclosed tables in document order of their start."""
        return sorted(self.done + self.open, key=lambda t: t.serial)


def _is_layout(raw: _RawTable) -> bool:
    hints = " ".join(raw.attrs.get(k, "") for k in ("class", "summary", "role", "id")).lower()
    return raw.nested or raw.block or raw.attrs.get("role", "") == "none" or bool(LAYOUT_HINTS.search(hints))


def html_tables(document: str, limits: TableLimits = TableLimits()) -> list[Table | None]:
    """One entry per <table> of `document` in order of appearance: the normalised table, or None
    where it is layout, navigation, nested, holds block content or fails `limits`."""
    parser = _TableExtractor()
    parser.feed(document)
    parser.close()
    return [None if _is_layout(raw) else _normalise(raw, limits) for raw in parser.tables()]


def _normalise(raw: _RawTable, limits: TableLimits) -> Table | None:
    rows = []
    for raw_row in raw.rows:
        row = []
        for parts, colspan, rowspan in raw_row:
            text = clean_text("".join(parts))
            if text is None:
                return None
            row.append(Cell(text, colspan, rowspan))
        rows.append(row)
    return accept(rows, limits)


def normalize_html_table(fragment: str, limits: TableLimits = TableLimits()) -> str | None:
    """The target form of the first table in `fragment`, or None if it is not a kept data table."""
    tables = html_tables(fragment, limits)
    return tables[0].html() if tables and tables[0] is not None else None


_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


def decode_html(data: bytes) -> str:
    """The page's text by its declared charset (UTF-8 when none is declared or it is unknown);
    undecodable bytes become U+FFFD, which no kept cell can hold."""
    match = _CHARSET.search(data[:4096])
    encoding = match.group(1).decode("ascii") if match else "utf-8"
    try:
        return data.decode(encoding, errors="replace")
    except LookupError:
        return data.decode("utf-8", errors="replace")
