"""The rows the batch job's stages hand each other, and reading one planned page.

The layout stage writes a page's plan into a row (`planned_fields`), an engine reads its
crops and fills the plan (`submit_page_crops`, then `read_page` or `page_record`), the
write stage writes the result row. The job's own engine actors and Serve's replicas (when the job reads through
them) run the same two functions, so a page's row is the same whichever engine read it.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa

from gravityocr.pipelines.assembly import PageResult
from gravityocr.pipelines.page_ocr import Crop, PagePlan, PagePlanner
from gravityocr.pipelines.tables import TableGrid

PAGE_SCHEMA = pa.schema([
    ("document_id", pa.string()),
    ("page_number", pa.int32()),
    ("page_count", pa.int32()),
    ("width", pa.int32()),
    ("height", pa.int32()),
    ("markdown", pa.string()),
    ("regions_json", pa.string()),
    ("committed_tokens", pa.int64()),
    ("forward_passes", pa.int64()),
    ("error_reason", pa.string()),
    ("error_message", pa.string()),
    ("mode", pa.string()),
    ("node_id", pa.string()),  # the Ray node whose engine read the page
])
# What the engines hand the write stage: a page row and its figure crops as PNG, which the
# write stage writes beside the markdown (never into the Parquet row).
FIGURES_TYPE = pa.list_(pa.struct([("name", pa.string()), ("png", pa.binary())]))
READ_SCHEMA = PAGE_SCHEMA.append(pa.field("figures", FIGURES_TYPE))
# What the layout stage hands the engines: the page's fields, its plan (the unread page
# result and its crops' places, JSON), its crops and figures as PNG; no page image.
PLANNED_SCHEMA = pa.schema([
    ("document_id", pa.string()), ("page_number", pa.int32()), ("page_count", pa.int32()), ("width", pa.int32()),
    ("height", pa.int32()), ("dpi", pa.float64()), ("error_reason", pa.string()), ("error_message", pa.string()),
    ("plan_json", pa.string()), ("crops", pa.list_(pa.binary())), ("figures", FIGURES_TYPE),
])


def png(image) -> bytes:
    """A page or crop on its way between stages: lossless, fast to write (the text is read from it)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def planned_fields(plan: PagePlan) -> dict:
    """The plan's part of a PLANNED_SCHEMA row: `plan_json`, `crops` and `figures`."""
    from gravityocr.pipelines.assembly import figure_crops, figure_png

    return {
        "plan_json": json.dumps({"page": plan.result.to_dict(),
                                 "crops": [{"region": c.region, "line": c.line, "task": c.task, "cell": c.cell}
                                           for c in plan.crops],
                                 "tables": {str(index): grid.to_dict() for index, grid in plan.tables.items()},
                                 "glyphs": plan.glyphs}),
        "crops": [png(crop.image) for crop in plan.crops],
        "figures": [{"name": name, "png": figure_png(figure)} for name, figure in figure_crops([plan.result])],
    }


def plan_from_row(row: dict) -> PagePlan:
    """The page plan `planned_fields` wrote into a row."""
    from PIL import Image

    record = json.loads(row["plan_json"])
    crops = [Crop(c["region"], tuple(c["line"]) if c["line"] is not None else None,
                  Image.open(io.BytesIO(data)).convert("RGB"), c["task"], c["cell"])
             for c, data in zip(record["crops"], row["crops"])]
    tables = {int(index): TableGrid.from_dict(grid) for index, grid in record["tables"].items()}
    return PagePlan(PageResult.from_dict(record["page"]), crops, tables, record.get("glyphs", 0))


@dataclass
class SubmittedPage:
    """A planned row whose crops are with an engine (`plan` None: the page was never rendered)."""

    row: dict
    plan: PagePlan | None
    futures: list[Future]
    started: float


def submit_page_crops(rows: list[dict], crops, submit=None) -> list[SubmittedPage]:
    """The crops of every rendered page in `rows` to `crops` (a CropRecognizer) in one call,
    so they join the engine in the same step; `submit` as `CropRecognizer.submit` takes it."""
    plans = [plan_from_row(row) if row["error_reason"] is None else None for row in rows]
    started = time.perf_counter()
    futures = iter(crops.submit([(crop.image, crop.task) for plan in plans if plan for crop in plan.crops], submit))
    return [SubmittedPage(row, plan, [next(futures) for _ in plan.crops] if plan else [], started)
            for row, plan in zip(rows, plans)]


async def read_page(page: SubmittedPage, mode: str, node_id: str) -> dict:
    """The READ_SCHEMA record of a submitted page, once its crops are read (awaited)."""
    read = await asyncio.gather(*(asyncio.wrap_future(future) for future in page.futures))
    return page_record(page, list(read), mode, node_id)


def page_record(page: SubmittedPage, read: list, mode: str, node_id: str) -> dict:
    """The READ_SCHEMA record of a submitted page from its crops' results (CropResult)."""
    from gravityocr.pipelines.assembly import page_markdown

    row, plan = page.row, page.plan
    record = {name: row.get(name) for name in PAGE_SCHEMA.names}
    record.update(mode=mode, node_id=node_id, figures=row["figures"])
    if plan is None:  # the document could not be rendered
        record.update(markdown="", regions_json="null", committed_tokens=0, forward_passes=0)
        return record
    result = PagePlanner.fill(plan, read, time.perf_counter() - page.started)
    stats = [region.stats for region in result.regions if region.stats]
    record.update(markdown=page_markdown(result), regions_json=json.dumps(result.to_dict()),
                  committed_tokens=sum(s["committed_tokens"] for s in stats),
                  forward_passes=sum(s["forward_passes"] for s in stats))
    if result.error:
        record.update(error_reason="layout_failed", error_message=result.error)
    return record
