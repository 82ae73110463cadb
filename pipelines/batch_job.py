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
from gravityocr.pipelines.batch_rows import PAGE_SCHEMA, PLANNED_SCHEMA, planned_fields, png
from gravityocr.pipelines.layout import LAYOUT_BACKENDS, LINE_SPLITTERS
from gravityocr.pipelines.page_ocr import PageOcrConfig, PagePlanner
from gravityocr.pipelines.page_readers import DEFAULT_SERVE_APP, PageReader, ServePageReader
from gravityocr.pipelines.progress import BatchProgress
from gravityocr.pipelines.storage import StorageError, StorageLocation, exists, list_objects, read_bytes, resolve, write_atomic

log = logging.getLogger(__name__)

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
    # A running Serve application whose replicas read the pages (their batch lane) instead
    # of engine actors of the job's own; its settings then decide how crops are decoded.
    serve_app: str | None = None

    def check(self) -> None:
        """Raise ValueError for a job that cannot run as configured."""
        if self.min_actors < 1 or self.max_actors < self.min_actors:
            raise ValueError(f"need 1 <= --min-actors <= --max-actors, got {self.min_actors}, {self.max_actors}")
        if self.pages_per_batch < 1:
            raise ValueError(f"--pages-per-batch must be at least 1, got {self.pages_per_batch}")


ENGINE_ACTORS = "actors"
SERVE_ENGINE_PREFIX = "serve:"


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
    engine: str = ENGINE_ACTORS  # which engines read the pages: the job's own actors, or "serve:APP"
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
def _planner(layout: str, lines: str, dpi: float) -> PagePlanner:
    """One planner per worker process and settings: a layout model loads once, not per batch."""
    return PagePlanner(PageOcrConfig(dpi=dpi, layout=layout, lines=lines))


def plan_pages(batch: pa.Table, layout: str, lines: str, dpi: float) -> pa.Table:
    """Each rendered page laid out and cut into crops (PNG), its figures cut (PNG); the page
    image itself goes no further. An unrendered page passes through as it is."""
    from PIL import Image

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


def _read_stage(config: BatchJobConfig) -> dict:
    """The read stage's `map_batches` arguments: engine actors of the job's own, or one
    light reader that sends each page to the Serve application's replicas."""
    import ray

    if config.serve_app:
        in_flight = serve_batch_pages_in_flight(config.serve_app)
        return {"fn": ServePageReader, "fn_constructor_kwargs": {"app_name": config.serve_app,
                                                                 "pages_in_flight": in_flight},
                # one reader holds the job's bound; enough batches on it to keep that many pages sent
                "compute": ray.data.ActorPoolStrategy(
                    size=1, max_tasks_in_flight_per_actor=-(-in_flight // config.pages_per_batch) + 1),
                "num_cpus": 0.1}
    cpus, gpus = _cluster_resources()
    resources = actor_resources(cpus, gpus, config.max_actors)
    return {"fn": PageReader,
            "fn_constructor_kwargs": {"model": config.model, "decode": config.decode,
                                      "threads": max(1, int(resources["num_cpus"])),
                                      "max_new_tokens": config.max_new_tokens},
            # Ray Data restarts a dead engine actor and retries its batch (max_restarts and
            # max_task_retries default to -1 for actor pools): a killed actor loses no page.
            "compute": ray.data.ActorPoolStrategy(min_size=config.min_actors, max_size=config.max_actors),
            "resources": config.actor_resources or None, **resources}


class ServeAppNotFound(Exception):
    """--serve-app names no application running on the job's Ray cluster."""


def serve_batch_pages_in_flight(app_name: str) -> int:
    """The pages a job keeps in flight on the running Serve application `app_name`
    (`OcrService.batch_pages_in_flight`); a clear error when there is no such application."""
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        handle = serve.get_app_handle(app_name)
    except RayServeException as error:
        raise ServeAppNotFound(f"no Serve application {app_name!r} on this Ray cluster ({error}); start one "
                               f"with `gravityocr serve --address ADDRESS` (its app is {DEFAULT_SERVE_APP!r}), "
                               "or name the running one with --serve-app NAME") from None
    return handle.batch_pages_in_flight.remote().result()


def _ray_data_console_errors_only() -> None:
    """Ray Data's console says only errors (its execution plan, its notes that progress bars
    are off and its memory hints are in the session's ray-data.log, as all of its records are):
    the job prints its own progress and summary."""
    for handler in logging.getLogger("ray.data").handlers:
        if type(handler) is not logging.FileHandler and isinstance(handler, logging.StreamHandler):
            handler.setLevel(logging.ERROR)


def run_batch_job(config: BatchJobConfig, progress: "BatchProgress | None" = None) -> BatchSummary:
    """Run the job; `progress` (the CLI's) hears of each page and document as it finishes."""
    import ray

    started = time.perf_counter()
    source = resolve(config.input_uri, config.endpoint_url)
    destination = resolve(config.output_uri, config.endpoint_url)
    documents = list_objects(source)
    summary = BatchSummary(documents=len(documents),
                           engine=SERVE_ENGINE_PREFIX + config.serve_app if config.serve_app else ENGINE_ACTORS)
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
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        _ray_data_console_errors_only()
        runtime_env = _storage_runtime_env()
        dataset = (
            ray.data.from_items([{"key": d.key} for d in todo], override_num_blocks=len(todo))
            .flat_map(render_document, fn_kwargs={"source": source, "dpi": config.dpi}, num_cpus=0.5,
                      runtime_env=runtime_env)
            .map_batches(plan_pages, fn_kwargs={"layout": config.layout, "lines": config.lines, "dpi": config.dpi},
                         batch_size=1, batch_format="pyarrow", num_cpus=0.25, runtime_env=runtime_env)
            .map_batches(**_read_stage(config), batch_size=config.pages_per_batch,
                         batch_format="pyarrow", runtime_env=runtime_env)
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
    parser.add_argument("--serve-app", nargs="?", const=DEFAULT_SERVE_APP, metavar="NAME",
                        help="read the pages through the running Serve application NAME on the cluster given by "
                             f"--address (default NAME: {DEFAULT_SERVE_APP}): its replicas' engines, after their "
                             "online requests, instead of engine actors of the job's own; the application's "
                             "settings then decide the model and decoding")
    parser.add_argument("--min-actors", type=int, default=None,
                        help="engine actors the pool keeps however little work there is (default: 1)")
    parser.add_argument("--max-actors", type=int, default=None,
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


# Flags that set up the job's own engine actors: with --serve-app the application's replicas
# read the pages under the application's own settings, so these would be silently ignored.
ENGINE_FLAGS = {"model": "--model", "max_new_tokens": "--max-new-tokens", "min_actors": "--min-actors",
                "max_actors": "--max-actors", "actor_resources": "--actor-resources", "mode": "--mode",
                "block_size": "--block-size", "speculative_max_batch": "--speculative-max-batch"}


def run(args) -> int:
    if args.serve_app:
        given = [flag for name, flag in ENGINE_FLAGS.items() if getattr(args, name, None) not in (None, {})]
        if given:
            raise SystemExit(f"gravityocr batch: {', '.join(given)} set up the job's own engine actors; with "
                             f"--serve-app the application {args.serve_app!r} reads the pages with its own "
                             "settings (its Serve config, or `gravityocr serve`'s flags)")
    try:
        decode = decode_settings_from_args(args)
        config = BatchJobConfig(
            input_uri=args.input, output_uri=args.output, endpoint_url=args.endpoint_url, address=args.address,
            min_actors=1 if args.min_actors is None else args.min_actors,
            max_actors=2 if args.max_actors is None else args.max_actors, resume=args.resume, dpi=args.dpi,
            decode=decode, model=args.model, pages_per_batch=args.pages_per_batch, layout=args.layout,
            lines=args.lines, max_new_tokens=args.max_new_tokens, actor_resources=args.actor_resources,
            serve_app=args.serve_app,
        )
        config.check()
    except ValueError as error:
        raise SystemExit(f"gravityocr batch: {error}") from None
    try:
        summary = run_batch_job(config, BatchProgress())
    except (StorageError, ServeAppNotFound) as error:  # a folder that is a file, a bucket that does not exist ...
        raise SystemExit(f"gravityocr batch: {error}") from None
    print(f"documents: {summary.documents} ({summary.documents_failed} failed, {summary.documents_skipped} "
          f"already complete)   pages: {summary.pages} ({summary.page_errors} with errors)   "
          f"{summary.pages_per_second:.2f} pages/s   TPF {summary.tpf:.2f} ({summary.speculative_rounds} speculative "
          f"rounds, {summary.ar_rounds} AR rounds)   {summary.seconds:.1f} s")
    for error in summary.errors:
        print(f"  error {error['document_id']} page {error['page_number']}: {error['reason']}: {error['message']}")
    print(f"outputs: {config.output_uri}   read by: {summary.engine}")
    if summary.documents_failed:
        print(f"gravityocr batch: {summary.documents_failed} of {summary.documents} documents failed (exit code "
              f"{EXIT_DOCUMENTS_FAILED}); their error rows are in the Parquet output, --resume reads them again",
              file=sys.stderr)
        return EXIT_DOCUMENTS_FAILED
    return 0
