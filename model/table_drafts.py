"""Drafts inside an HTML table, kept to the structure the committed tokens imply.

The drafter writes a block's tokens in parallel, and inside a table it loses the
structure more often than the content: on the held-out tables (shipped weights; rounds of
a decoding variant since deleted) 344 of 790 rounds stopped at a tag, among them `</tr>`
-> `</table>` and `</table>` -> eos in every table, a row continued past the first row's
column count, a tag written inside a cell, `</td>` written twice. The committed tokens
settle most of it: what may follow each tag, and how many columns a row has once the
first row is closed (colspans and rowspans counted). `repair_drafts` walks the drafts
with that knowledge: a tag that cannot follow is replaced by the one that can, a tag
inside a cell is dropped, a row ends at the column count, and where either of two tags
may follow (a row or the table's end after `</tr>`) the drafter's token picks one. After
the response's own `</table>` (a table task) comes eos.

Output is unchanged: drafts only choose what is verified, every committed token is still
the AR argmax. Used wherever drafts are verified: the prefill's and every round's
(reference decoder and engine; the engine repairs a round's drafts between its two passes
on the CPU only, where they are host memory anyway). Held-out set, shipped weights: TPF
3.250 without, 3.251 with the prefill's drafts kept, 3.340 with every round's (tables
2.97 -> 3.13).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

MARKUP = {
    "table": "<table>", "table_end": "</table>", "row": "<tr>", "row_end": "</tr>", "cell": "<td>",
    "cell_end": "</td>", "header": "<th>", "header_end": "</th>", "tag_open": "<", "colspan": ' colspan="',
    "rowspan": ' rowspan="', "tag_close": '">',
}


@dataclass(frozen=True)
class TableTokens:
    """Ids of the table markup in a tokenizer that writes each tag as one token."""

    table: int
    table_end: int
    row: int
    row_end: int
    cell: int
    cell_end: int
    header: int
    header_end: int
    tag_open: int
    colspan: int
    rowspan: int
    tag_close: int
    digits: tuple[int, ...]  # ids of "0".."9"
    eos: frozenset[int]

    @classmethod
    def of(cls, tokenizer, eos_ids) -> "TableTokens | None":
        """None where a tag or digit is not one token (GLM-OCR's own BPE tokenizer):
        structure is then left to the drafter."""
        ids = {}
        for name, text in list(MARKUP.items()) + [(str(d), str(d)) for d in range(10)]:
            encoded = tokenizer.encode(text, add_special_tokens=False)
            if len(encoded) != 1 or encoded[0] == tokenizer.unk_token_id:
                return None
            ids[name] = encoded[0]
        return cls(**{name: ids[name] for name in MARKUP}, digits=tuple(ids[str(d)] for d in range(10)),
                   eos=frozenset(eos_ids))

    @property
    def opening_cell(self) -> tuple[int, int, int]:
        return self.cell, self.header, self.tag_open

    @property
    def never_in_cell(self) -> frozenset[int]:
        """Tags that cannot stand inside a cell's text."""
        return frozenset({self.table, self.table_end, self.row, self.row_end, self.cell, self.header}) | self.eos


@dataclass
class TableShape:
    """What the tokens so far say about the table being written, fed one token at a time."""

    tokens: TableTokens
    response_is_table: bool | None = None  # the first token opens a table (a table task)
    inside: bool = False
    last: int | None = None
    in_cell: bool = False
    in_tag: bool = False  # between a cell's "<" and its '">'
    span_kind: str | None = None  # "colspan" or "rowspan" while its digits come
    spans: dict[str, int] = field(default_factory=lambda: {"colspan": 1, "rowspan": 1})
    columns: int | None = None  # of the first row, once it is closed
    row: int = 0
    covered: int = 0  # columns the current row has filled
    spanned_from_above: dict[int, int] = field(default_factory=dict)  # row -> columns rowspans take

    def copy(self) -> "TableShape":
        return replace(self, spans=dict(self.spans), spanned_from_above=dict(self.spanned_from_above))

    def feed(self, token: int) -> None:
        t = self.tokens
        if self.response_is_table is None:
            self.response_is_table = token == t.table
        if token == t.table:
            self.inside, self.in_cell, self.in_tag, self.columns, self.row, self.covered = True, False, False, None, 0, 0
            self.spanned_from_above = {}
        elif not self.inside:
            pass
        elif self.in_tag:
            self._feed_tag(token)
        elif self.in_cell:
            self.in_cell = token not in (t.cell_end, t.header_end)
            if token == t.table_end:
                self.inside = False
        elif token == t.table_end:
            self.inside = False
        elif token == t.row:
            self.covered = self.spanned_from_above.pop(self.row, 0)
        elif token == t.row_end:
            if self.columns is None:
                self.columns = self.covered
            self.row += 1
        elif token in (t.cell, t.header):
            self.covered += 1
            self.in_cell = True
        elif token == t.tag_open:
            self.in_tag, self.span_kind, self.spans = True, None, {"colspan": 1, "rowspan": 1}
        self.last = token

    def _feed_tag(self, token: int) -> None:
        t = self.tokens
        if token in (t.colspan, t.rowspan):
            self.span_kind = "colspan" if token == t.colspan else "rowspan"
            self.spans[self.span_kind] = 0
        elif token in t.digits and self.span_kind is not None:
            self.spans[self.span_kind] = 10 * self.spans[self.span_kind] + t.digits.index(token)
        elif token == t.tag_close:
            columns, rows = max(1, self.spans["colspan"]), max(1, self.spans["rowspan"])
            self.covered += columns
            for below in range(self.row + 1, self.row + rows):
                self.spanned_from_above[below] = self.spanned_from_above.get(below, 0) + columns
            self.in_tag, self.in_cell = False, True
        else:
            self.span_kind = None

    def repair(self, drafts: list[int]) -> list[int]:
        return repair_drafts(self, drafts)

    def choose(self, draft: int) -> int | None:
        """The token to draft instead of `draft`; None to drop it."""
        t = self.tokens
        if not self.inside:
            if self.last == t.table_end and self.response_is_table:
                return min(t.eos)
            return draft
        if self.in_tag:
            return draft
        if self.in_cell:
            return None if draft in t.never_in_cell else draft
        if self.last == t.table:
            return draft if draft == t.row else t.row
        if self.last == t.row:
            return draft if draft in t.opening_cell else t.cell
        if self.last in (t.cell_end, t.header_end):
            if self.columns is not None:
                if self.covered >= self.columns:
                    return t.row_end
                return draft if draft in t.opening_cell else t.cell
            ends = draft == t.row_end or draft == t.table_end or draft in t.eos
            return t.row_end if ends else (draft if draft in t.opening_cell else t.cell)
        if self.last == t.row_end:
            ends = draft == t.table_end or draft in t.eos
            return t.table_end if ends else t.row
        return draft


def repair_drafts(shape: TableShape, drafts: list[int]) -> list[int]:
    """Drafts after the tokens `shape` has been fed, kept to the table's structure; they
    stop at an eos."""
    t = shape.tokens
    if not shape.inside and shape.last != t.table_end and t.table not in drafts:  # no table in sight
        return list(drafts)
    shape = shape.copy()
    out = []
    for draft in drafts:
        choice = shape.choose(draft)
        if choice is None:
            continue
        out.append(choice)
        shape.feed(choice)
        if choice in t.eos:
            break
    return out
