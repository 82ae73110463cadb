"""The table form every table item's target takes, and the checks a table must pass to be kept.

A target is the recogniser's table form, `<table><tr><td>text</td>...</tr></table>`: only
table/tr/td tags, ` colspan="N"`/` rowspan="N"` where N > 1, cell text with whitespace folded to
single spaces and characters the tokenizer knows. The target round-trips through `parse_table`
cell for cell, so `teds(target, target) == 1` and a prediction is scored against exactly the
text shown.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from gravityocr.model.evaluation.scores import parse_table
from gravityocr.model.network.tokenizer import character_vocabulary

VOCABULARY = frozenset(character_vocabulary()) - {"\n"}
# As in the synthetic tables: '<', '>' and '&' would make a target's cell text ambiguous HTML.
FORBIDDEN = frozenset("<>&")
# Characters mapped before the vocabulary check: spaces to a space, invisible ones to nothing.
CHARACTER_MAP = {
    **{c: " " for c in "\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000"},
    **{c: "" for c in "\u00ad\u200b\u200c\u200d\u2060\ufeff"},
    "\u2010": "-", "\u2011": "-", "\u2212": "-",
}
_TRANSLATE = str.maketrans(CHARACTER_MAP)


@dataclass(frozen=True)
class Cell:
    text: str
    colspan: int = 1
    rowspan: int = 1


@dataclass(frozen=True)
class Table:
    rows: tuple[tuple[Cell, ...], ...]

    def html(self) -> str:
        """The target: table/tr/td only, spans written only where greater than 1."""
        return "<table>" + "".join("<tr>" + "".join(td(c) + c.text + "</td>" for c in row) + "</tr>"
                                   for row in self.rows) + "</table>"

    @property
    def n_columns(self) -> int:
        return max(sum(c.colspan for c in row) for row in self.rows)


def td(cell: Cell) -> str:
    spans = (f' colspan="{cell.colspan}"' if cell.colspan > 1 else "") + (
        f' rowspan="{cell.rowspan}"' if cell.rowspan > 1 else "")
    return f"<td{spans}>"


@dataclass(frozen=True)
class TableLimits:
    """What a kept table looks like: a data grid of modest size with short, known-character cells."""

    min_rows: int = 2
    max_rows: int = 40
    min_columns: int = 2
    max_columns: int = 12
    max_span: int = 12
    max_cell_chars: int = 200
    max_table_chars: int = 3000
    min_filled_cells: int = 3


def clean_text(text: str) -> str | None:
    """Cell text with mapped characters and folded whitespace, or None if a character is not in
    the tokenizer's vocabulary or is one the target form forbids."""
    text = " ".join(text.translate(_TRANSLATE).split())
    text = unicodedata.normalize("NFC", text)
    if any(c not in VOCABULARY or c in FORBIDDEN for c in text):
        return None
    return text


def accept(rows: list[list[Cell]], limits: TableLimits = TableLimits()) -> Table | None:
    """The table, empty rows dropped, if it passes `limits` and its target round-trips; else None."""
    rows = [row for row in rows if row]
    if not (limits.min_rows <= len(rows) <= limits.max_rows):
        return None
    table = Table(tuple(tuple(row) for row in rows))
    cells = [c for row in rows for c in row]
    if not (limits.min_columns <= table.n_columns <= limits.max_columns):
        return None
    if max(len(row) for row in rows) < 2:
        return None  # one cell per row: a list or a box, not a grid
    if any(c.colspan > limits.max_span or c.rowspan > limits.max_span for c in cells):
        return None
    if any(len(c.text) > limits.max_cell_chars for c in cells):
        return None
    if sum(len(c.text) for c in cells) > limits.max_table_chars:
        return None
    if sum(1 for c in cells if c.text) < limits.min_filled_cells:
        return None
    return table if _round_trips(table) else None


def _round_trips(table: Table) -> bool:
    root = parse_table(table.html())
    if root is None or len(root.children) != len(table.rows):
        return False
    for node_row, row in zip(root.children, table.rows):
        if node_row.tag != "tr" or len(node_row.children) != len(row):
            return False
        for node, cell in zip(node_row.children, row):
            if (node.content, node.colspan, node.rowspan) != (cell.text, cell.colspan, cell.rowspan):
                return False
    return True
