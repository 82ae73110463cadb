"""Recognised regions back into a document: the page result, its JSON (the shape that
`schemas/page.schema.json` publishes) and its markdown.

Markdown: the first title of a document is `#`, later ones `##`; paragraphs are their
lines joined, a word hyphenated across a line break joined back ("recog-" + "nition");
tables stay the HTML the recogniser writes; formulas are `$$ ... $$` blocks; a figure is a
picture whose words alone are read (its lines, pipelines/figures.py): with an output folder it
is an image link to its crop written beside the markdown (`figure_prefix`), its words the
link's alt text; without one its words are a paragraph and a figure without words is left out
(its box stays in the JSON), so no link ever points at a file that was not written and no
word read is dropped; running headers and footers are left out of the markdown (they are in
the JSON).

One document, one markdown: `gravityocr batch`, `gravityocr ocr` and serve's /v1/ocr all
build a document's markdown with `document_markdown` and its per-page pieces with
`page_markdowns` (the document markdown is their join), and its JSON with `document_json`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote

from PIL import Image

from gravityocr.pipelines.regions import Box
from gravityocr.pipelines.documents import png_bytes

SCHEMA_VERSION = "1.0"
SOFT_HYPHEN = "\u00ad"
HYPHENS = "-\u2010"  # hyphen-minus, hyphen


@dataclass
class LineResult:
    bbox: Box
    text: str
    stats: dict | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return {"bbox": list(self.bbox), "text": self.text, "stats": self.stats, "error": self.error}

    @classmethod
    def from_dict(cls, data: dict) -> "LineResult":
        return cls(tuple(data["bbox"]), data["text"], data.get("stats"), data.get("error"))


@dataclass
class RegionResult:
    order: int
    type: str
    bbox: Box
    score: float = 1.0
    task: str | None = None  # the prompt it was read with; None for a figure without words
    text: str | None = None  # None for a figure without words (not read); a figure's words otherwise
    lines: list[LineResult] = field(default_factory=list)
    stats: dict | None = None  # decode statistics, summed over the lines
    error: str | None = None
    image: Image.Image | None = None  # the crop of a figure, for writing it out; not in the JSON

    def to_dict(self) -> dict:
        return {
            "order": self.order, "type": self.type, "bbox": list(self.bbox), "score": round(float(self.score), 4),
            "task": self.task, "text": self.text, "lines": [line.to_dict() for line in self.lines],
            "stats": self.stats, "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "RegionResult":
        """The inverse of `to_dict` (a figure's crop is not in the JSON: `image` is None)."""
        return cls(data["order"], data["type"], tuple(data["bbox"]), data.get("score", 1.0), data.get("task"),
                   data.get("text"), [LineResult.from_dict(line) for line in data.get("lines") or []],
                   data.get("stats"), data.get("error"))


@dataclass
class PageResult:
    document_id: str
    page_number: int
    width: int
    height: int
    dpi: float | None
    layout_backend: str
    regions: list[RegionResult] = field(default_factory=list)  # in reading order
    seconds: dict[str, float] = field(default_factory=dict)  # layout / recognition / total
    error: str | None = None  # the page could not be laid out (its document still succeeds)
    rotation: float = 0.0  # degrees the page was turned to straighten it before layout (pipelines/deskew.py)
    # what a reader should know of a page read without error: e.g. that it gave almost no text
    # for the ink it holds (page_ocr.PagePlanner.fill), never a silent near-empty success
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "document_id": self.document_id, "page_number": self.page_number, "width": self.width,
            "height": self.height, "dpi": None if self.dpi is None else round(float(self.dpi), 3),
            "layout_backend": self.layout_backend, "rotation": self.rotation,
            "regions": [region.to_dict() for region in self.regions],
            "seconds": {name: round(value, 4) for name, value in self.seconds.items()},
            "error": self.error, "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "PageResult":
        """The inverse of `to_dict`: a page back from its JSON (a batch job's `regions_json`)."""
        return cls(data["document_id"], data["page_number"], data["width"], data["height"], data.get("dpi"),
                   data["layout_backend"], [RegionResult.from_dict(region) for region in data.get("regions") or []],
                   dict(data.get("seconds") or {}), data.get("error"), data.get("rotation", 0.0),
                   list(data.get("warnings") or []))

    def text(self, include_furniture: bool = False) -> str:
        """Plain text in reading order, a figure's words included: what a page score compares."""
        skip = set() if include_furniture else {"header", "footer"}
        return "\n".join(r.text for r in self.regions if r.type not in skip and r.text)


# --- text ----------------------------------------------------------------------------------

def join_lines(lines: list[str]) -> str:
    """One paragraph from its lines. A word broken at a line end is joined back: a soft
    hyphen always, a hard hyphen after a letter when the next line goes on in lower case
    ("recog-" "nition" -> "recognition"); before a capital or digit, or when the word
    already holds a hyphen, the hyphen is kept without a space ("Jean-" "Paul" -> "Jean-Paul",
    "state-of-the-" "art" -> "state-of-the-art")."""
    out = ""
    for line in (line.strip() for line in lines):
        if not line:
            continue
        if not out:
            out = line
        elif out.endswith(SOFT_HYPHEN):
            out = out[:-1] + line
        elif out[-1] in HYPHENS and len(out) > 1 and out[-2].isalpha():
            compound = any(h in out.rsplit(None, 1)[-1][:-1] for h in HYPHENS)  # "state-of-the-" + "art"
            out = out[:-1] + line if line[0].islower() and not compound else out + line
        else:
            out = f"{out} {line}"
    return out


def sum_stats(parts: list[dict | None]) -> dict | None:
    """Decode statistics of a region from those of its lines."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    tokens = sum(p["committed_tokens"] for p in parts)
    passes = sum(p["forward_passes"] for p in parts)
    drafted: dict[str, int] = {}
    for part in parts:
        for source, count in part["drafted_tokens"].items():
            drafted[source] = drafted.get(source, 0) + count
    return {
        "committed_tokens": tokens,
        "forward_passes": passes,
        "tokens_per_forward": round(tokens / max(1, passes), 4),
        "accepted_per_round": [a for p in parts for a in p["accepted_per_round"]],
        "ar_rounds": sum(p["ar_rounds"] for p in parts),
        "drafted_tokens": drafted,
        "finish_reason": next((reason for reason in ("repetition", "length")
                               if any(p["finish_reason"] == reason for p in parts)), "eos"),
    }


# --- markdown --------------------------------------------------------------------------------

_BLOCK_START = re.compile(r"^(#|>|\s*[-*+]\s|\d+[.)]\s)")


def _escape(paragraph: str) -> str:
    """Recognised text that happens to start like markdown syntax stays text."""
    return "\\" + paragraph if _BLOCK_START.match(paragraph) else paragraph


def figure_name(page_number: int, region: RegionResult) -> str:
    """A figure's file name, the same from every entry point: p<page>-r<order>.png."""
    return f"p{page_number}-r{region.order}.png"


def figures_folder(name: str) -> str:
    """The folder beside `<name>.md` that holds its figures."""
    return f"{name}_figures"


def figure_prefix_for(name: str) -> str:
    """The `figure_prefix` of `<name>.md` whose figures are written to `figures_folder(name)`
    beside it: a relative link, percent-encoded (a name may hold spaces or `#`)."""
    return quote(figures_folder(name)) + "/"


def figure_crops(pages: list[PageResult]) -> list[tuple[str, Image.Image]]:
    """(file name, crop) of every figure of the pages whose crop is at hand."""
    return [(figure_name(page.page_number, region), region.image) for page in pages for region in page.regions
            if region.type == "figure" and region.image is not None]


def figure_png(image: Image.Image) -> bytes:
    """A figure's file: one PNG writer for every entry point."""
    return png_bytes(image)


def _alt_text(text: str) -> str:
    """A figure's words as an image link's alt text: one line, its brackets escaped."""
    return re.sub(r"([\\\[\]])", r"\\\1", " ".join(text.split())) or "figure"


def region_markdown(region: RegionResult, page_number: int, top_title: bool,
                    figure_prefix: str | None = None) -> str | None:
    """One block of markdown, or None for a figure without words when there is no output
    folder (`figure_prefix` None): no link to a file that is never written. A figure's words
    are its link's alt text, or a paragraph without a folder."""
    text = (region.text or "").strip()
    if region.type == "figure":  # its picture stands whether or not its words could be read
        if figure_prefix is None:
            return _escape(" ".join(text.split())) if text else None
        return f"![{_alt_text(text)}]({figure_prefix}{figure_name(page_number, region)})"
    if region.error and not region.text:
        return f"<!-- page {page_number} region {region.order} ({region.type}) not read: {region.error} -->"
    if region.type == "title":  # a numbered one by its number's depth (pipelines/structure.py)
        from gravityocr.pipelines.structure import numbered_heading

        return numbered_heading(text) or ("# " if top_title else "## ") + " ".join(text.split())
    if region.type == "table":
        return text
    if region.type == "formula":
        return f"$$\n{text}\n$$"
    if region.type == "text":  # a listing, a numbered heading, a list, a table of contents
        from gravityocr.pipelines.structure import text_markdown

        structured = text_markdown(region.lines)
        if structured is not None:
            return structured
    return _escape(text)


def _page_body(page: PageResult, title_seen: bool, figure_prefix: str | None,
               include_furniture: bool) -> tuple[str, bool]:
    """A page's markdown, and whether the document's `#` has been written once it is done."""
    blocks = [f"<!-- page {page.page_number} not read: {page.error} -->"] if page.error else []
    for region in page.regions:
        if region.type in ("header", "footer") and not include_furniture:
            continue
        if region.type != "figure" and not region.error and not (region.text or "").strip():
            continue  # nothing was read: no empty paragraph
        heading = region.type == "title" and bool((region.text or "").strip())  # an unread title is a comment
        block = region_markdown(region, page.page_number, heading and not title_seen, figure_prefix)
        title_seen = title_seen or heading
        if block is not None:
            blocks.append(block)
    return "\n\n".join(blocks), title_seen


def page_markdown(page: PageResult, title_seen: bool = False, figure_prefix: str | None = None,
                  include_furniture: bool = False) -> str:
    """Markdown of one page read alone. `title_seen`: an earlier page already had the
    document's `#`. The pages of a document: `page_markdowns`."""
    return _page_body(page, title_seen, figure_prefix, include_furniture)[0]


def page_markdowns(pages: list[PageResult], figure_prefix: str | None = None,
                   include_furniture: bool = False) -> list[str]:
    """The markdown of each page of a document, in order, as the document has it: the
    document's first title is `#` wherever it is, every later one `##` (a page-2 title after
    a page-1 title is `##`). `document_markdown` is their join."""
    pieces, title_seen = [], False
    for page in pages:
        body, title_seen = _page_body(page, title_seen, figure_prefix, include_furniture)
        pieces.append(body)
    return pieces


def document_markdown(pages: list[PageResult], figure_prefix: str | None = None, include_furniture: bool = False,
                      error: dict | None = None) -> str:
    """The markdown of a document: `page_markdowns` joined, a page marker comment before
    each page of a multi-page document; a document that could not be read (`error`, the
    JSON's {"reason", "message"}) starts with a comment saying why. `figure_prefix`: None
    leaves figures out (no output folder), else the relative path from the markdown file
    to its figures (`figure_prefix_for`), each linked as `<prefix>p<page>-r<order>.png`."""
    parts = [f"<!-- document not read ({error['reason']}): {error['message']} -->"] if error else []
    pieces = page_markdowns(pages, figure_prefix, include_furniture)
    for page, body in zip(pages, pieces):
        parts.append(f"<!-- page {page.page_number} -->\n\n{body}" if len(pages) > 1 else body)
    return "\n\n".join(part.rstrip() for part in parts).strip() + "\n"


def document_json(document_id: str, pages: list[PageResult], error: dict | None = None,
                  source_format: str | None = None) -> dict:
    """The document object of `schemas/document.schema.json`."""
    return {
        "schema_version": SCHEMA_VERSION,
        "document_id": document_id,
        "format": source_format,
        "page_count": len(pages),
        "pages": [page.to_dict() for page in pages],
        "error": error,
    }
