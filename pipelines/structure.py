"""The markdown of a text region whose lines are not a paragraph: a code or log listing, a
numbered heading, a list, a table of contents.

A text region is read line by line (its `lines`, each with its box); joined into one
paragraph, a listing loses its line breaks and indentation, a list its items and a table of
contents runs its entries together. `text_markdown` looks at the lines' text and boxes and
writes each kind as markdown keeps it: a listing as a fenced block with its lines and their
indentation, a heading with `#` marks by its number's depth, list items as `- ` lines, table
of contents entries as list items without their dot leaders. Anything else stays the
paragraph the page pipeline joined. The region's `text` (what page scores compare) is not
changed: only how markdown lays it out.
"""

from __future__ import annotations

import re
import statistics

# Characters that code and logs use far more than prose does.
CODE_CHARACTERS = frozenset("{}[]()<>=;\\/$#%|_~^&*@")
CODE_SHARE = 0.08  # of a region's non-space characters, with ragged lines: a listing
RAGGED = 0.85  # a line ending short of this share of the region's widest line is ragged
HEADING = re.compile(r"^(\d+(?:\.\d+)*)\.?\s+(\S.{0,78})$")
BULLET = re.compile(r"^(?:[•·▪‣◦–\-*]|\d+[.)]|\(?[a-z]\))\s+")
LEADER = re.compile(r"\s*(?:\.\s*){3,}")


def text_markdown(lines: list) -> str | None:
    """The markdown of a text region's `lines` (each with `text` and `bbox`, as
    assembly.LineResult) when they form a listing, a heading, a list or a table of contents;
    None: the region's paragraph as it is."""
    texts = [line.text.rstrip() for line in lines if line.text and line.text.strip()]
    boxes = [line.bbox for line in lines if line.text and line.text.strip()]
    if len(texts) == 1:
        return numbered_heading(texts[0])
    if len(texts) < 2:
        return None
    if sum(bool(LEADER.search(text)) for text in texts) >= 2:
        return "\n".join("- " + LEADER.sub(" ", text).strip() for text in texts)
    if BULLET.match(texts[0].lstrip()) and sum(bool(BULLET.match(t.lstrip())) for t in texts) >= 2:
        return _list(texts, boxes)
    if _is_listing(texts, boxes):
        return _fenced(texts, boxes)
    return None


def numbered_heading(text: str) -> str | None:
    """`## 4 Title`, `### 4.4 Title` ...: a single line that starts with a section number, is
    short and does not end like a sentence."""
    match = HEADING.match(text.strip())
    if match is None or text.rstrip()[-1] in ".,;:" or not match.group(2)[0].isupper():
        return None
    depth = match.group(1).count(".") + 1
    return "#" * min(6, depth + 1) + " " + " ".join(text.split())


def _is_listing(texts: list[str], boxes: list) -> bool:
    characters = "".join("".join(text.split()) for text in texts)
    code = sum(character in CODE_CHARACTERS for character in characters) / max(1, len(characters))
    left = min(box[0] for box in boxes)
    widest = max(box[2] for box in boxes) - left
    # prose runs its lines to the right edge but for the last; a listing's lines end where they end
    ragged = sum(box[2] - left < RAGGED * widest for box in boxes)
    return code >= CODE_SHARE and ragged >= max(1, len(boxes) // 3)


def _indents(texts: list[str], boxes: list) -> list[int]:
    """Each line's indentation in characters, from how far its box starts right of the
    leftmost line's, at the lines' median character width."""
    widths = [(box[2] - box[0]) / len(text) for text, box in zip(texts, boxes) if len(text) >= 4]
    character = statistics.median(widths) if widths else 1.0
    left = min(box[0] for box in boxes)
    return [round((box[0] - left) / character) if character > 0 else 0 for box in boxes]


def _fenced(texts: list[str], boxes: list) -> str:
    body = "\n".join(" " * indent + text.strip() for text, indent in zip(texts, _indents(texts, boxes)))
    fence = "```" if "```" not in body else "~~~~"
    return f"{fence}\n{body}\n{fence}"


def _list(texts: list[str], boxes: list) -> str:
    """One `- ` line per item; a line without a bullet continues the item before it."""
    items: list[str] = []
    for text in texts:
        text = text.strip()
        bullet = BULLET.match(text)
        if bullet or not items:
            marker = bullet.group(0).strip() if bullet else ""
            ordered = marker[:1].isdigit()
            items.append((f"{marker} " if ordered else "- ") + text[bullet.end() if bullet else 0:])
        else:
            items[-1] += " " + text
    return "\n".join(items)
