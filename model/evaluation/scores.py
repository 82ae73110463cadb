"""OCR accuracy scores in [0, 1], one per content type, as the GLM-OCR / OmniDocBench line of work reports them.

- text: 1 - normalized edit distance, after folding whitespace runs;
- pages: the same on the page's text (`page_text`): a table counts by its cells' text, a
  table of contents' dot leaders are left out;
- tables: TEDS (tree-edit-distance similarity, PubTabNet), built on `apted`;
- formulas: 1 - normalized edit distance of LaTeX in one canonical form, so that
  `x^2` and `x^{2}`, or `\\frac12` and `\\frac{1}{2}`, are not counted as errors.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass, field
from html.parser import HTMLParser

from apted import APTED, Config
from rapidfuzz.distance import Levenshtein


def _fold_whitespace(s: str) -> str:
    return " ".join(s.split())


def edit_similarity(pred: str, ref: str) -> float:
    """1 - Levenshtein distance / length of the longer string; two empty strings are identical."""
    return 1.0 - Levenshtein.normalized_distance(pred, ref)


def text_similarity(pred: str, ref: str) -> float:
    return edit_similarity(_fold_whitespace(pred), _fold_whitespace(ref))


_TABLE = re.compile(r"<table\b.*?</table>", re.DOTALL | re.IGNORECASE)
_TABLE_TAG = re.compile(r"</?(?:table|thead|tbody|tfoot|tr|td|th)\b[^>]*>", re.IGNORECASE)
_LEADER = re.compile(r"(?:\.\s*){3,}")  # ". . . . ." of a table of contents


def page_text(text: str) -> str:
    """What a page score compares: NFKC; a table's markup taken out and its cells' text
    unescaped (a page's true text is plain, and a peer that writes plain text is not charged
    for markup); dot leaders left out (text layers keep every dot, a reader some);
    whitespace folded. Text outside tables keeps its angle brackets."""
    text = unicodedata.normalize("NFKC", text).replace("\ufffe", "")
    text = _TABLE.sub(lambda table: " " + html.unescape(_TABLE_TAG.sub(" ", table.group(0))) + " ", text)
    return _fold_whitespace(_LEADER.sub(" ", text))


def page_similarity(pred: str, ref: str) -> float:
    return edit_similarity(page_text(pred), page_text(ref))


# ---------------------------------------------------------------- LaTeX

_LATEX_TOKEN = re.compile(r"\\[a-zA-Z]+|\\[^a-zA-Z]|\\$|\s+|.", re.DOTALL)
_ALIASES = {r"\dfrac": r"\frac", r"\tfrac": r"\frac", r"\le": r"\leq", r"\ge": r"\geq", r"\ne": r"\neq",
            r"\rightarrow": r"\to", r"\lbrace": r"\{", r"\rbrace": r"\}"}
_SIZING = {r"\left", r"\right", r"\bigl", r"\bigr", r"\Bigl", r"\Bigr", r"\biggl", r"\biggr", r"\Biggl",
           r"\Biggr", r"\big", r"\Big", r"\bigg", r"\Bigg", r"\displaystyle", r"\textstyle"}
_ARITY = {r"\frac": 2, r"\binom": 2, r"\sqrt": 1, "^": 1, "_": 1, r"\mathrm": 1, r"\mathbf": 1,
          r"\mathit": 1, r"\mathbb": 1, r"\mathcal": 1, r"\operatorname": 1, r"\text": 1, r"\textrm": 1,
          r"\mbox": 1, r"\hat": 1, r"\bar": 1, r"\vec": 1, r"\tilde": 1, r"\dot": 1, r"\ddot": 1,
          r"\overline": 1, r"\underline": 1, r"\widehat": 1}
_TEXT_COMMANDS = {r"\text", r"\textrm", r"\mbox", r"\operatorname"}  # spaces inside their argument count
_DELIMITERS = [("$$", "$$"), ("$", "$"), (r"\[", r"\]"), (r"\(", r"\)")]

# A parsed formula: a list whose items are tokens (str) or groups (nested lists, i.e. {...}).
Items = list


def _parse(tokens: list[str], i: int = 0, nested: bool = False) -> tuple[Items, int]:
    items: Items = []
    while i < len(tokens):
        token = tokens[i]
        if token == "{":
            group, i = _parse(tokens, i + 1, nested=True)
            items.append(group)
            continue
        if token == "}" and nested:
            return items, i + 1
        items.append(" " if token.isspace() else token)
        i += 1
    return items, i


def _fold_spaces(items: Items) -> Items:
    out: Items = []
    for item in items:
        if item == " " and (not out or out[-1] == " "):
            continue
        out.append(item if isinstance(item, str) else _normalize(item, keep_spaces=True))
    while out and out[-1] == " ":
        out.pop()
    return out


def _atom(items: Items, i: int, keep_spaces: bool) -> tuple[Items, int]:
    """Normalize the item at i together with the arguments it takes; returns the new items and the next index."""
    item = items[i]
    if isinstance(item, list):
        return [_normalize(item, keep_spaces)], i + 1
    token = _ALIASES.get(item, item)
    if token == " " and not keep_spaces:
        return [], i + 1
    if token in _SIZING:
        skip = 2 if token in (r"\left", r"\right") and i + 1 < len(items) and items[i + 1] == "." else 1
        return [], i + skip
    if token not in _ARITY:
        return [token], i + 1
    out: Items = [token]
    j = i + 1
    if token == r"\sqrt":
        while j < len(items) and items[j] == " ":
            j += 1
        if j < len(items) and items[j] == "[" and "]" in items[j + 1:]:
            close = items.index("]", j + 1)
            out += ["["] + _normalize(items[j + 1:close], keep_spaces) + ["]"]
            j = close + 1
    for _ in range(_ARITY[token]):
        argument: Items = []
        while not argument and j < len(items):
            if items[j] == " ":
                j += 1
                continue
            argument, j = _atom(items, j, keep_spaces)
        if not argument:
            break
        if len(argument) == 1 and isinstance(argument[0], list):
            group = argument[0]
        else:
            group = argument
        if token in _TEXT_COMMANDS and isinstance(items[j - 1], list):
            group = _fold_spaces(items[j - 1])
        out.append(group)
    return out, j


def _normalize(items: Items, keep_spaces: bool = False) -> Items:
    out: Items = []
    i = 0
    while i < len(items):
        new, i = _atom(items, i, keep_spaces)
        out += new
    return out


def _flatten(items: Items) -> list[str]:
    flat: list[str] = []
    for item in items:
        if isinstance(item, list):
            flat += ["{"] + _flatten(item) + ["}"]
        else:
            flat.append(item)
    return flat


def canonicalize_latex(s: str) -> str:
    """One spelling per formula: no math delimiters, no sizing commands (\\left, \\big, ...), arguments of
    ^ _ \\frac \\sqrt etc. always braced, and a space only where a command name would otherwise run on."""
    s = s.strip()
    for opening, closing in _DELIMITERS:
        if len(s) >= len(opening) + len(closing) and s.startswith(opening) and s.endswith(closing):
            s = s[len(opening):len(s) - len(closing)].strip()
            break
    items, _ = _parse(_LATEX_TOKEN.findall(s))
    out: list[str] = []
    for token in _flatten(_normalize(items)):
        if out and token[:1].isalpha() and re.search(r"\\[a-zA-Z]+$", out[-1]):
            out.append(" ")
        out.append(token)
    return "".join(out)


def formula_similarity(pred: str, ref: str) -> float:
    return edit_similarity(canonicalize_latex(pred), canonicalize_latex(ref))


# ---------------------------------------------------------------- TEDS


@dataclass
class TableNode:
    tag: str  # "table" | "tr" | "td"
    colspan: int = 1
    rowspan: int = 1
    content: str = ""
    children: list["TableNode"] = field(default_factory=list)

    def size(self) -> int:
        return 1 + sum(child.size() for child in self.children)


def _span(value: str | None) -> int:
    try:
        return max(1, int(value or 1))
    except ValueError:
        return 1


class _TableTreeBuilder(HTMLParser):
    """Builds a table/tr/td tree from possibly broken HTML: unclosed cells and rows close implicitly,
    stray tags are ignored. <th> counts as <td>; <thead>/<tbody>/<tfoot> wrappers are dropped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root: TableNode | None = None
        self.stack: list[TableNode] = []
        self.done = False

    def handle_starttag(self, tag, attrs):
        if self.done:
            return
        tag = "td" if tag == "th" else tag
        if tag == "table":
            if self.root is None:
                self.root = TableNode("table")
                self.stack = [self.root]
        elif tag in ("tr", "td") and self.stack:
            while self.stack[-1].tag not in ("table", "tr") or (tag == "tr" and self.stack[-1].tag == "tr"):
                self.stack.pop()
            if tag == "td" and self.stack[-1].tag == "table":
                row = TableNode("tr")
                self.stack[-1].children.append(row)
                self.stack.append(row)
            values = dict(attrs)
            node = TableNode(tag, _span(values.get("colspan")), _span(values.get("rowspan")))
            self.stack[-1].children.append(node)
            self.stack.append(node)

    def handle_endtag(self, tag):
        if self.done or not self.stack:
            return
        tag = "td" if tag == "th" else tag
        if tag == "table":
            self.done = True
        elif tag in ("tr", "td") and any(node.tag == tag for node in self.stack[1:]):
            while self.stack[-1].tag != tag:
                self.stack.pop()
            self.stack.pop()

    def handle_data(self, data):
        if not self.done and self.stack and self.stack[-1].tag == "td":
            self.stack[-1].content += data


def parse_table(html: str) -> TableNode | None:
    """The first table in `html` as a tree, or None when there is none."""
    builder = _TableTreeBuilder()
    try:
        builder.feed(html)
        builder.close()
    except Exception:  # html.parser is lenient; this only guards against the unexpected
        pass
    root = builder.root
    if root is not None:
        _fold_cell_text(root)
    return root


def _fold_cell_text(node: TableNode) -> None:
    node.content = _fold_whitespace(node.content)
    for child in node.children:
        _fold_cell_text(child)


class _TedsCost(Config):
    def __init__(self, structure_only: bool) -> None:
        self.structure_only = structure_only

    def rename(self, a: TableNode, b: TableNode) -> float:
        if a.tag != b.tag or a.colspan != b.colspan or a.rowspan != b.rowspan:
            return 1.0
        if a.tag == "td" and not self.structure_only and (a.content or b.content):
            return Levenshtein.normalized_distance(a.content, b.content)
        return 0.0

    def children(self, node: TableNode) -> list[TableNode]:
        return node.children


def teds(pred_html: str, ref_html: str, structure_only: bool = False) -> float:
    """1 - TED(pred, ref) / max(node counts below the <table> root), as in PubTabNet's TEDS."""
    pred, ref = parse_table(pred_html), parse_table(ref_html)
    if ref is None:
        return 1.0 if pred is None else 0.0
    if pred is None:
        return 0.0
    n_nodes = max(pred.size(), ref.size()) - 1
    if n_nodes == 0:
        return 1.0
    distance = APTED(pred, ref, _TedsCost(structure_only)).compute_edit_distance()
    return max(0.0, 1.0 - float(distance) / n_nodes)


# ---------------------------------------------------------------- dispatch

SCORERS = {
    "text": text_similarity,
    "table": teds,
    "formula": formula_similarity,
    "page": page_similarity,
}


def score(type: str, pred: str, ref: str) -> float:
    """The accuracy of one prediction, by content type."""
    try:
        scorer = SCORERS[type]
    except KeyError:
        raise ValueError(f"unknown content type {type!r}; expected one of {sorted(SCORERS)}") from None
    return scorer(pred, ref)
