"""The batch job's stages that run in Ray Data's tasks (render, layout, write), the names its
outputs are written under, and a document's markdown rebuilt from its page rows: each a
function of its rows alone, so a stage retried or run twice writes the same bytes under the
same names (pipelines/batch_job.py runs them)."""

from __future__ import annotations

import functools
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from gravityocr.pipelines.assembly import PageResult, document_markdown, figure_prefix_for, figures_folder
from gravityocr.pipelines.batch_rows import PAGE_SCHEMA, PLANNED_SCHEMA, planned_fields, png
from gravityocr.pipelines.page_ocr import PageOcrConfig, PagePlanner
from gravityocr.pipelines.storage import StorageLocation, read_bytes, write_atomic


def markdown_key(document_key: str) -> str:
    return f"markdown/{document_key}.md"


def figure_key(document_key: str, name: str) -> str:
    """A figure crop beside the document's markdown, in the folder its links name."""
    return f"markdown/{figures_folder(document_key)}/{name}"


def markdown_figure_prefix(document_key: str) -> str:
    """The relative path from `markdown_key(KEY)` to its figures (`figure_key(KEY, ...)`)."""
    return figure_prefix_for(document_key.rsplit("/", 1)[-1])


def page_key(document_key: str, page_number: int) -> str:
    return f"pages/{document_key}/page-{page_number:05d}.parquet"


# --- stage 1: render pages (CPU tasks) --------------------------------------------------

def _error_row(document_id: str, page_number: int, reason: str, message: str) -> dict:
    return {"document_id": document_id, "page_number": page_number, "page_count": 1, "png": None,
            "width": 0, "height": 0, "dpi": 0.0, "error_reason": reason, "error_message": message}


def render_document(row: dict, source: StorageLocation, dpi: float) -> list[dict]:
    """One row per page of one document; any failure is an error row of its own."""
    from gravityocr.pipelines.documents import DocumentError, open_document

    key = row["key"]
    rows = []
    try:
        document = open_document(key, read_bytes(source, key), dpi)
        for page in document.pages():
            rows.append({"document_id": key, "page_number": page.page_number, "png": png(page.image),
                         "width": page.width, "height": page.height, "dpi": float(page.dpi or 0),
                         "error_reason": None, "error_message": None})
    except DocumentError as error:
        rows.append(_error_row(key, len(rows) + 1 if rows else 0, error.reason, error.message))
    except Exception as error:  # noqa: BLE001 - reported per document, the job goes on
        rows.append(_error_row(key, len(rows) + 1 if rows else 0, "unreadable", f"{type(error).__name__}: {error}"))
    for out in rows:
        out["page_count"] = len(rows)
    return rows


# --- stage 2: layout and crops (CPU tasks) -----------------------------------------------

@functools.lru_cache(maxsize=4)
def _planner(page: PageOcrConfig) -> PagePlanner:
    """One planner per worker process and settings: a layout model loads once, not per batch."""
    return PagePlanner(page)


def plan_pages(batch: pa.Table, page: PageOcrConfig) -> pa.Table:
    """Each rendered page laid out and cut into crops (PNG), its figures cut (PNG); the page
    image itself goes no further. An unrendered page passes through as it is."""
    from PIL import Image

    from gravityocr.pipelines.documents import Page

    planner = _planner(page)
    out = []
    for row in batch.to_pylist():
        record = {name: row[name] for name in PLANNED_SCHEMA.names if name in row}
        record.update(plan_json=None, crops=[], figures=[])
        if row["error_reason"] is None:
            image = Image.open(io.BytesIO(row["png"])).convert("RGB")
            plan = planner.plan(Page(row["document_id"], row["page_number"], image, row["width"], row["height"],
                                     row["dpi"] or None))
            record.update(planned_fields(plan))
        out.append(record)
    return pa.Table.from_pylist(out, schema=PLANNED_SCHEMA)


# --- stage 4: write pages (CPU tasks) -----------------------------------------------------

def write_pages(batch: pa.Table, destination: StorageLocation) -> pa.Table:
    """Each page's figure crops beside its document's markdown, then the page row to its own
    Parquet file (atomic writes, deterministic names); passes on what the driver needs for
    its bookkeeping and the document's markdown: the row without its page markdown and figures."""
    for index in range(batch.num_rows):
        document_id = batch["document_id"][index].as_py()
        for figure in batch["figures"][index].as_py() or []:
            write_atomic(destination, figure_key(document_id, figure["name"]), figure["png"])
        buffer = io.BytesIO()
        pq.write_table(batch.slice(index, 1).select(PAGE_SCHEMA.names), buffer)
        write_atomic(destination, page_key(document_id, batch["page_number"][index].as_py()), buffer.getvalue())
    return batch.drop_columns(["markdown", "figures"])


def region_decode_stats(regions_json: str | None) -> list[dict]:
    """Content type, token and pass counts, accepted drafts per round and AR rounds of each region a
    page's JSON says was decoded. The driver records them: an engine actor is killed when
    the job ends (or the pool shrinks), losing what it recorded since Ray's last metrics push."""
    page = json.loads(regions_json) if regions_json else None
    return [{"content_type": region["task"] or region["type"], "committed_tokens": region["stats"]["committed_tokens"],
             "forward_passes": region["stats"]["forward_passes"],
             "accepted_per_round": region["stats"]["accepted_per_round"],
             "ar_rounds": region["stats"]["ar_rounds"]}
            for region in (page or {}).get("regions", []) if region.get("stats")]


def page_result(row: dict) -> PageResult:
    """A page row back as the page result it was written from (its `regions_json`); a page
    that could not be rendered (no JSON) is a page whose error says why."""
    page = json.loads(row["regions_json"]) if row.get("regions_json") else None
    if page:
        return PageResult.from_dict(page)
    return PageResult(row["document_id"], row["page_number"], row.get("width") or 0, row.get("height") or 0, None,
                      "", error=f"{row['error_reason']}: {row['error_message']}")


def document_markdown_from_rows(document_key: str, rows: list[dict]) -> str:
    """The markdown of a document from its page rows: `assembly.document_markdown`, as
    `gravityocr ocr` and serve write it, with its figures linked where `write_pages` wrote them."""
    pages = [page_result(row) for row in sorted(rows, key=lambda r: r["page_number"])]
    return document_markdown(pages, figure_prefix=markdown_figure_prefix(document_key))
