"""`gravityocr batch INPUT OUTPUT`: the Ray Data job from object storage to object storage.

Stages, streaming:
  documents (listed by the driver)
  -> render: CPU tasks, one row per page (PNG bytes); a bad document becomes one error
     row (page 0), never a failed job or a silently dropped block
  -> layout: CPU tasks, a page's layout and its crops and figures (PNG), as in
     `PagePlanner.plan`; the page image goes no further
  -> read: an autoscaling pool of engine actors, each with one long-lived engine loop
     (`CropRecognizer`, as serve's replicas): several page batches are in flight on an actor
     and their crops share engine rounds; a page is handed on as soon as its crops are read
     (`PagePlanner.fill`); GPUs requested only when the cluster has them
  -> write: CPU tasks, a page's figure crops (PNG) and then one Parquet file per page,
     under names derived from the input key
The driver counts the written pages and, when all pages of a document are in, writes
its markdown: `assembly.document_markdown` over the pages' JSON, the function `gravityocr
ocr` and serve use, with the figures linked where the write stage put them. A document is
complete when its markdown exists (its figures are written before it): `--resume` skips
those; everything else is redone under the same names, so nothing is duplicated.

Output layout (KEY is the input key, extension kept so a.pdf and a.png never collide):
  OUTPUT/markdown/KEY.md
  OUTPUT/markdown/KEY_figures/p<page>-r<order>.png   (linked from KEY.md)
  OUTPUT/pages/KEY/page-00001.parquet   (page-00000: the document could not be read)
  OUTPUT/_summary.json
The Parquet rows' `markdown` is each page read alone (its first title `#`, no figure
links); the document's markdown is KEY.md.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from gravityocr import metrics
from gravityocr.model.decode.settings import DecodeSettings, add_decode_arguments, decode_settings_from_args
from gravityocr.pipelines.assembly import PageResult, document_markdown, figure_prefix_for, figures_folder
from gravityocr.pipelines.layout import LAYOUT_BACKENDS, LINE_SPLITTERS
from gravityocr.pipelines.page_ocr import Crop, PageOcrConfig, PagePlan, PagePlanner
from gravityocr.pipelines.progress import BatchProgress
from gravityocr.pipelines.storage import StorageError, StorageLocation, exists, list_objects, read_bytes, resolve, write_atomic
from gravityocr.pipelines.tables import TableGrid

log = logging.getLogger(__name__)

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
    ("node_id", pa.string()),  # the Ray node whose engine actor read the page
])
# What the engine actors hand the write stage: a page row and its figure crops as PNG,
# which the write stage writes beside the markdown (never into the Parquet row).
FIGURES_TYPE = pa.list_(pa.struct([("name", pa.string()), ("png", pa.binary())]))
READ_SCHEMA = PAGE_SCHEMA.append(pa.field("figures", FIGURES_TYPE))
# What the layout stage hands the engine actors: the page's fields, its plan (the unread page
# result and its crops' places, JSON), its crops and figures as PNG; no page image.
PLANNED_SCHEMA = pa.schema([
    ("document_id", pa.string()), ("page_number", pa.int32()), ("page_count", pa.int32()), ("width", pa.int32()),
    ("height", pa.int32()), ("dpi", pa.float64()), ("error_reason", pa.string()), ("error_message", pa.string()),
    ("plan_json", pa.string()), ("crops", pa.list_(pa.binary())), ("figures", FIGURES_TYPE),
])


@dataclass
class BatchJobConfig:
    input_uri: str
    output_uri: str
    endpoint_url: str | None = None
    address: str | None = None  # None: a local Ray started for the job
    min_actors: int = 1
    max_actors: int = 2
    resume: bool = False
    dpi: float = PageOcrConfig.dpi
    decode: DecodeSettings = field(default_factory=DecodeSettings)  # how the engine actors decode regions
    model: str | None = None  # None: the shipped default
    pages_per_batch: int = 4  # pages an engine actor reads in one engine batch
    layout: str = PageOcrConfig.layout  # see layout.LAYOUT_BACKENDS
    lines: str = PageOcrConfig.lines  # see layout.LINE_SPLITTERS
    max_new_tokens: int | None = None  # cap on every region's output (None: the recogniser's defaults)
    actor_resources: dict[str, float] = field(default_factory=dict)  # custom resources each engine actor needs


@dataclass
class BatchSummary:
    documents: int = 0
    documents_failed: int = 0
    documents_skipped: int = 0  # complete from an earlier run (--resume)
    pages: int = 0
    page_errors: int = 0
    seconds: float = 0.0
    pages_per_second: float = 0.0
    committed_tokens: int = 0
    forward_passes: int = 0
    tpf: float = 0.0
    # Rounds the regions took part in: speculative ones, and AR ones (AR mode, or on a CPU a
    # batch past speculative_max_batch, where they decode faster; they pull TPF towards 1).
    speculative_rounds: int = 0
    ar_rounds: int = 0
    errors: list[dict] = field(default_factory=list)  # {"document_id", "page_number", "reason", "message"}


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
            rows.append({"document_id": key, "page_number": page.page_number, "png": _png(page.image),
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
def _planner(layout: str, lines: str, dpi: float) -> PagePlanner:
    """One planner per worker process and settings: a layout model loads once, not per batch."""
    return PagePlanner(PageOcrConfig(dpi=dpi, layout=layout, lines=lines))


def plan_pages(batch: pa.Table, layout: str, lines: str, dpi: float) -> pa.Table:
    """Each rendered page laid out and cut into crops (PNG), its figures cut (PNG); the page
    image itself goes no further. An unrendered page passes through as it is."""
    from PIL import Image

    from gravityocr.pipelines.assembly import figure_crops, figure_png
    from gravityocr.pipelines.documents import Page

    planner = _planner(layout, lines, dpi)
    out = []
    for row in batch.to_pylist():
        record = {name: row[name] for name in PLANNED_SCHEMA.names if name in row}
        record.update(plan_json=None, crops=[], figures=[])
        if row["error_reason"] is None:
            image = Image.open(io.BytesIO(row["png"])).convert("RGB")
            plan = planner.plan(Page(row["document_id"], row["page_number"], image, row["width"], row["height"],
                                     row["dpi"] or None))
            record["plan_json"] = json.dumps({"page": plan.result.to_dict(),
                                              "crops": [{"region": c.region, "line": c.line, "task": c.task,
                                                         "cell": c.cell} for c in plan.crops],
                                              "tables": {str(index): grid.to_dict()
                                                         for index, grid in plan.tables.items()},
                                              "glyphs": plan.glyphs})
            record["crops"] = [_png(crop.image) for crop in plan.crops]
            record["figures"] = [{"name": name, "png": figure_png(figure)} for name, figure in figure_crops([plan.result])]
        out.append(record)
    return pa.Table.from_pylist(out, schema=PLANNED_SCHEMA)


def _png(image) -> bytes:
    """A page or crop on its way between stages: lossless, fast to write (the text is read from it)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def plan_from_row(row: dict) -> PagePlan:
    """The page plan `plan_pages` wrote into a row."""
    from PIL import Image

    record = json.loads(row["plan_json"])
    crops = [Crop(c["region"], tuple(c["line"]) if c["line"] is not None else None,
                  Image.open(io.BytesIO(png)).convert("RGB"), c["task"], c["cell"])
             for c, png in zip(record["crops"], row["crops"])]
    tables = {int(index): TableGrid.from_dict(grid) for index, grid in record["tables"].items()}
    return PagePlan(PageResult.from_dict(record["page"]), crops, tables, record.get("glyphs", 0))


# --- stage 3: read crops (engine actors) --------------------------------------------------

class PageReader:
    """An engine actor: one recogniser and its long-lived engine loop. Its `__call__` is
    async, so Ray Data keeps several page batches in flight on one actor and their crops
    decode in the same engine rounds; each page is handed on as soon as its last crop is read."""

    def __init__(self, model: str | None, decode: DecodeSettings, threads: int, max_new_tokens: int | None):
        import ray

        from gravityocr.model.engine.threads import reserve_for_engine
        from gravityocr.model.network.devices import resolve_device
        from gravityocr.model.network.loading import DEFAULT_MODEL_DIR
        from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig

        reserve_for_engine(threads)
        self.mode = decode.mode
        self.node_id = ray.get_runtime_context().get_node_id()
        settings = RecognizerConfig(decode=decode)
        device, dtype = resolve_device("auto")  # the GPU Ray assigned this actor, if any
        self.crops = CropRecognizer.load(model or DEFAULT_MODEL_DIR,
                                         settings.capped(max_new_tokens) if max_new_tokens else settings,
                                         dtype=dtype, device=device)
        metrics.engine_actor_started(device)

    async def __call__(self, batch: pa.Table):
        """The batch's crops go to the engine in one call (scheduled as `gravityocr ocr`
        schedules the same pages); each page is yielded as soon as its own crops are read."""
        rows = batch.to_pylist()
        plans = [plan_from_row(row) if row["error_reason"] is None else None for row in rows]
        start = time.perf_counter()
        futures = iter(self.crops.submit([(crop.image, crop.task) for plan in plans if plan for crop in plan.crops]))
        pending = [asyncio.ensure_future(self._page(row, plan, [next(futures) for _ in plan.crops] if plan else [], start))
                   for row, plan in zip(rows, plans)]
        for page in asyncio.as_completed(pending):
            yield pa.Table.from_pylist([await page], schema=READ_SCHEMA)

    async def _page(self, row: dict, plan: PagePlan | None, futures: list, start: float) -> dict:
        from gravityocr.pipelines.assembly import page_markdown

        record = {name: row.get(name) for name in PAGE_SCHEMA.names}
        record.update(mode=self.mode, node_id=self.node_id, figures=row["figures"])
        if plan is None:  # the document could not be rendered
            record.update(markdown="", regions_json="null", committed_tokens=0, forward_passes=0)
            return record
        read = await asyncio.gather(*(asyncio.wrap_future(future) for future in futures))
        result = PagePlanner.fill(plan, list(read), time.perf_counter() - start)
        stats = [region.stats for region in result.regions if region.stats]
        record.update(markdown=page_markdown(result), regions_json=json.dumps(result.to_dict()),
                      committed_tokens=sum(s["committed_tokens"] for s in stats),
                      forward_passes=sum(s["forward_passes"] for s in stats))
        if result.error:
            record.update(error_reason="layout_failed", error_message=result.error)
        return record


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


# --- the driver --------------------------------------------------------------------------

def _cluster_resources() -> tuple[float, float]:
    import ray

    resources = ray.cluster_resources()
    return float(resources.get("CPU", 1)), float(resources.get("GPU", 0))


def actor_resources(cpus: float, gpus: float, max_actors: int) -> dict:
    """Engine actors take a GPU each where the cluster has GPUs; on CPU nodes they leave at
    least one CPU to the render and write tasks (a 2-CPU node with two 1-CPU actors would
    starve those tasks and hang without a word)."""
    if gpus >= 1:
        return {"num_gpus": 1, "num_cpus": 1}
    share = (cpus - 1) / max(1, max_actors)
    return {"num_cpus": round(max(0.25, min(1.0, share)), 2)}


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


# The job submitter's storage credentials travel to the tasks and actors that read and
# write storage (on KubeRay the pods may also carry them from a Secret).
FORWARDED_ENVIRONMENT = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                         "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_PROFILE")


def _storage_runtime_env() -> dict | None:
    env_vars = {name: os.environ[name] for name in FORWARDED_ENVIRONMENT if name in os.environ}
    return {"env_vars": env_vars} if env_vars else None


def run_batch_job(config: BatchJobConfig, progress: "BatchProgress | None" = None) -> BatchSummary:
    """Run the job; `progress` (the CLI's) hears of each page and document as it finishes."""
    import ray

    started = time.perf_counter()
    source = resolve(config.input_uri, config.endpoint_url)
    destination = resolve(config.output_uri, config.endpoint_url)
    documents = list_objects(source)
    summary = BatchSummary(documents=len(documents))
    if config.resume:
        todo = [d for d in documents if not exists(destination, markdown_key(d.key))]
        summary.documents_skipped = len(documents) - len(todo)
    else:
        todo = documents

    joins_cluster = bool(config.address or os.environ.get("RAY_ADDRESS"))
    if progress is not None:
        progress.documents = len(todo)
    if todo:
        if not ray.is_initialized():
            # Ray's start-up notes (INFO) are not the job's news: it prints its own progress
            # (pipelines/progress.py)
            ray.init(address=config.address, log_to_driver=False, logging_level=logging.WARNING)
        cpus, gpus = _cluster_resources()
        resources = actor_resources(cpus, gpus, config.max_actors)
        threads = max(1, int(resources["num_cpus"]))
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        runtime_env = _storage_runtime_env()
        dataset = (
            ray.data.from_items([{"key": d.key} for d in todo], override_num_blocks=len(todo))
            .flat_map(render_document, fn_kwargs={"source": source, "dpi": config.dpi}, num_cpus=0.5,
                      runtime_env=runtime_env)
            .map_batches(plan_pages, fn_kwargs={"layout": config.layout, "lines": config.lines, "dpi": config.dpi},
                         batch_size=1, batch_format="pyarrow", num_cpus=0.25, runtime_env=runtime_env)
            .map_batches(
                PageReader,
                fn_constructor_kwargs={"model": config.model, "decode": config.decode, "threads": threads,
                                       "max_new_tokens": config.max_new_tokens},
                batch_size=config.pages_per_batch, batch_format="pyarrow",
                # Ray Data restarts a dead engine actor and retries its batch (max_restarts and
                # max_task_retries default to -1 for actor pools): a killed actor loses no page.
                compute=ray.data.ActorPoolStrategy(min_size=config.min_actors, max_size=config.max_actors),
                resources=config.actor_resources or None,
                runtime_env=runtime_env,
                **resources,
            )
            .map_batches(write_pages, fn_kwargs={"destination": destination}, batch_format="pyarrow",
                         batch_size=None, num_cpus=0.25, runtime_env=runtime_env)
        )
        by_document: dict[str, list[dict]] = defaultdict(list)
        for row in dataset.iter_rows():
            by_document[row["document_id"]].append(row)
            pages = by_document[row["document_id"]]
            if progress is not None and row["page_number"] > 0:
                progress.page_done()
            if len(pages) == row["page_count"]:
                failed = _finish_document(destination, row["document_id"], by_document.pop(row["document_id"]), summary)
                if progress is not None:
                    progress.document_done(row["document_id"], failed)
    summary.seconds = time.perf_counter() - started
    summary.pages_per_second = summary.pages / summary.seconds if summary.seconds else 0.0
    summary.tpf = summary.committed_tokens / summary.forward_passes if summary.forward_passes else 0.0
    write_atomic(destination, "_summary.json", json.dumps(asdict(summary), indent=2).encode())
    if todo and joins_cluster:
        metrics.wait_for_export()  # the last pages' counts reach the cluster's Prometheus
    return summary


def _finish_document(destination: StorageLocation, document_id: str, pages: list[dict], summary: BatchSummary) -> bool:
    """Count the document's pages into `summary` and write its markdown; True where it failed."""
    document_failed = any(p["page_number"] == 0 for p in pages)
    metrics.record_document(metrics.STATUS_ERROR if document_failed else metrics.STATUS_OK)
    if document_failed:
        metrics.record_page(error_reason=pages[0]["error_reason"])
    for page in pages:
        summary.committed_tokens += page["committed_tokens"] or 0
        summary.forward_passes += page["forward_passes"] or 0
        for region in region_decode_stats(page["regions_json"]):
            metrics.record_decode(metrics.WORKLOAD_BATCH, **region)
            summary.speculative_rounds += len(region["accepted_per_round"])
            summary.ar_rounds += region["ar_rounds"]
        if page["error_reason"]:
            summary.errors.append({"document_id": document_id, "page_number": page["page_number"],
                                   "reason": page["error_reason"], "message": page["error_message"]})
        if page["page_number"] > 0:
            summary.pages += 1
            summary.page_errors += bool(page["error_reason"])
            metrics.record_page(error_reason=page["error_reason"])
    if document_failed:
        summary.documents_failed += 1
        return True  # no markdown: a later --resume tries the document again
    write_atomic(destination, markdown_key(document_id), document_markdown_from_rows(document_id, pages).encode())
    return False


# --- CLI -----------------------------------------------------------------------------------

EXIT_DOCUMENTS_FAILED = 3  # the job ran to its end, and some documents could not be read

def add_arguments(parser) -> None:
    parser.add_argument("input", help="local folder, file://… or s3://bucket/prefix of PDFs and images")
    parser.add_argument("output", help="local folder, file://… or s3://bucket/prefix for markdown and Parquet")
    parser.add_argument("--address", help="Ray cluster address (default: a local Ray started for the job)")
    parser.add_argument("--endpoint-url", help="S3-compatible endpoint (MinIO, Ceph, …); default AWS_ENDPOINT_URL")
    parser.add_argument("--min-actors", type=int, default=1,
                        help="engine actors the pool keeps however little work there is (default: 1)")
    parser.add_argument("--max-actors", type=int, default=2,
                        help="engine actors the pool grows to while pages wait (default: 2)")
    parser.add_argument("--resume", action="store_true", help="skip documents whose outputs are complete")
    parser.add_argument("--dpi", type=float, default=PageOcrConfig.dpi,
                        help=f"PDF render resolution (default: {PageOcrConfig.dpi:g})")
    parser.add_argument("--model", help="model directory or hub name (default: the shipped model)")
    parser.add_argument("--pages-per-batch", type=int, default=4,
                        help="pages an engine actor reads together, their crops batched in one engine (default: 4)")
    parser.add_argument("--layout", choices=LAYOUT_BACKENDS, default=PageOcrConfig.layout,
                        help=f"layout backend (default: {PageOcrConfig.layout})")
    parser.add_argument("--lines", choices=LINE_SPLITTERS, default=PageOcrConfig.lines,
                        help=f"how text regions are split into lines (default: {PageOcrConfig.lines})")
    parser.add_argument("--max-new-tokens", type=int, help="cap on the tokens read per region")
    parser.add_argument("--actor-resources", type=json.loads, default={},
                        help='custom Ray resources each engine actor needs, as JSON, e.g. \'{"engine": 1}\'')
    add_decode_arguments(parser, with_mode=True)


def run(args) -> int:
    if args.min_actors < 1 or args.max_actors < args.min_actors:
        raise SystemExit(f"need 1 <= --min-actors <= --max-actors, got {args.min_actors}, {args.max_actors}")
    try:
        decode = decode_settings_from_args(args)
    except ValueError as error:
        raise SystemExit(f"gravityocr batch: {error}") from None
    config = BatchJobConfig(
        input_uri=args.input, output_uri=args.output, endpoint_url=args.endpoint_url, address=args.address,
        min_actors=args.min_actors, max_actors=args.max_actors, resume=args.resume, dpi=args.dpi, decode=decode,
        model=args.model, pages_per_batch=args.pages_per_batch, layout=args.layout,
        lines=args.lines, max_new_tokens=args.max_new_tokens, actor_resources=args.actor_resources,
    )
    try:
        summary = run_batch_job(config, BatchProgress())
    except StorageError as error:  # a folder that is a file, a bucket that does not exist ...
        raise SystemExit(f"gravityocr batch: {error}") from None
    print(f"documents: {summary.documents} ({summary.documents_failed} failed, {summary.documents_skipped} "
          f"already complete)   pages: {summary.pages} ({summary.page_errors} with errors)   "
          f"{summary.pages_per_second:.2f} pages/s   TPF {summary.tpf:.2f} ({summary.speculative_rounds} speculative "
          f"rounds, {summary.ar_rounds} AR rounds)   {summary.seconds:.1f} s")
    for error in summary.errors:
        print(f"  error {error['document_id']} page {error['page_number']}: {error['reason']}: {error['message']}")
    print(f"outputs: {config.output_uri}")
    if summary.documents_failed:
        print(f"gravityocr batch: {summary.documents_failed} of {summary.documents} documents failed (exit code "
              f"{EXIT_DOCUMENTS_FAILED}); their error rows are in the Parquet output, --resume reads them again",
              file=sys.stderr)
        return EXIT_DOCUMENTS_FAILED
    return 0
