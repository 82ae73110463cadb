"""Recognised regions back into a document: the page result, its JSON (the shape that
`schemas/page.schema.json` publishes) and its markdown.

Markdown: the first title of a document is `#`, later ones `##`; paragraphs are their
lines joined, a word hyphenated across a line break joined back ("recog-" + "nition");
tables stay the HTML the recogniser writes; formulas are `$$ ... $$` blocks; figures are
image links, never read; running headers and footers are left out of the markdown (they
are in the JSON).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from PIL import Image

from .layout import Box

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


@dataclass
class RegionResult:
    order: int
    type: str
    bbox: Box
    score: float = 1.0
    task: str | None = None  # the prompt it was read with; None for figures
    text: str | None = None  # None for figures (not read)
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

    def to_dict(self) -> dict:
        return {
            "document_id": self.document_id, "page_number": self.page_number, "width": self.width,
            "height": self.height, "dpi": None if self.dpi is None else round(float(self.dpi), 3),
            "layout_backend": self.layout_backend, "regions": [region.to_dict() for region in self.regions],
            "seconds": {name: round(value, 4) for name, value in self.seconds.items()},
            "error": self.error,
        }

    def text(self, include_furniture: bool = False) -> str:
        """Plain text in reading order, figures left out: what a page score compares."""
        skip = {"figure"} | (set() if include_furniture else {"header", "footer"})
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
    return {
        "committed_tokens": tokens,
        "forward_passes": passes,
        "tokens_per_forward": round(tokens / max(1, passes), 4),
        "accepted_per_round": [a for p in parts for a in p["accepted_per_round"]],
        "ar_rounds": sum(p["ar_rounds"] for p in parts),
        "finish_reason": next((reason for reason in ("repetition", "length")
                               if any(p["finish_reason"] == reason for p in parts)), "eos"),
    }


# --- markdown --------------------------------------------------------------------------------

_BLOCK_START = re.compile(r"^(#|>|\s*[-*+]\s|\d+[.)]\s)")


def _escape(paragraph: str) -> str:
    """Recognised text that happens to start like markdown syntax stays text."""
    return "\\" + paragraph if _BLOCK_START.match(paragraph) else paragraph


def figure_name(page_number: int, region: RegionResult) -> str:
    return f"p{page_number}-r{region.order}.png"


def region_markdown(region: RegionResult, page_number: int, top_title: bool, figure_prefix: str = "") -> str:
    if region.error and not region.text:
        return f"<!-- page {page_number} region {region.order} ({region.type}) not read: {region.error} -->"
    text = (region.text or "").strip()
    if region.type == "figure":
        return f"![figure]({figure_prefix}{figure_name(page_number, region)})"
    if region.type == "title":
        return ("# " if top_title else "## ") + " ".join(text.split())
    if region.type == "table":
        return text
    if region.type == "formula":
        return f"$$\n{text}\n$$"
    return _escape(text)


def page_markdown(page: PageResult, title_seen: bool = False, figure_prefix: str = "",
                  include_furniture: bool = False) -> str:
    """Markdown of one page. `title_seen`: an earlier page already had the document's `#`."""
    blocks = [f"<!-- page {page.page_number} not read: {page.error} -->"] if page.error else []
    for region in page.regions:
        if region.type in ("header", "footer") and not include_furniture:
            continue
        if region.type != "figure" and not region.error and not (region.text or "").strip():
            continue  # nothing was read: no empty paragraph
        top = region.type == "title" and not title_seen
        title_seen = title_seen or top
        blocks.append(region_markdown(region, page.page_number, top, figure_prefix))
    return "\n\n".join(blocks)


def document_markdown(pages: list[PageResult], figure_prefix: str = "", include_furniture: bool = False) -> str:
    """Pages in order; a page marker comment before each page of a multi-page document."""
    parts = []
    title_seen = False
    for page in pages:
        body = page_markdown(page, title_seen, figure_prefix, include_furniture)
        title_seen = title_seen or any(r.type == "title" and (r.text or "").strip() for r in page.regions)
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
