"""A chat answer for a table: the model's HTML with every table element it opened closed.

The model writes a whole table as HTML, character by character, and may stop with elements
still open: at its token budget (mid-cell, or mid-tag: `…</t`), or at eos inside a cell. The
answer a client gets is then still one table an HTML parser reads as the model wrote it: an
unfinished tag at the very end is dropped and the open `<td>`, `<tr>`, `<table>` … are
closed, innermost first (`closed_table`). A stream holds an unfinished tag back until the
tokens after it finish it (`unfinished_tag`), so the streamed text and the whole answer are
the same string. `usage` still counts the model's tokens; the closing tags are not tokens.
"""

from __future__ import annotations

import re

TABLE_ELEMENTS = frozenset({"table", "thead", "tbody", "tfoot", "tr", "th", "td"})
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9]*)[^<>]*?(/?)>")
_UNFINISHED = re.compile(r"</?(?:[A-Za-z][^<>]*)?")  # a tag begun, its `>` not written yet


def unfinished_tag(text: str) -> int:
    """Where a tag that `text` ends inside of starts (`<`, `</`, `<td colspan="2`), else
    len(text). A `<` that cannot open a tag (`a < b`) is text, not a tag."""
    start = text.rfind("<")
    if start >= 0 and _UNFINISHED.fullmatch(text, start):
        return start
    return len(text)


def closed_table(text: str) -> str:
    """`text` without an unfinished tag at its end, then the end tags of the table elements
    it left open, innermost first. A text that closes everything it opened is returned as it is."""
    kept = text[:unfinished_tag(text)]
    open_elements: list[str] = []
    for match in _TAG.finditer(kept):
        closing, name, self_closing = match.group(1), match.group(2).lower(), match.group(3)
        if name not in TABLE_ELEMENTS or self_closing:
            continue
        if not closing:
            open_elements.append(name)
        elif name in open_elements:  # closes it and whatever it held that was left open
            del open_elements[len(open_elements) - 1 - open_elements[::-1].index(name):]
    return kept + "".join(f"</{name}>" for name in reversed(open_elements))
