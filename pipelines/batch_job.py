"""`gravityocr batch INPUT OUTPUT`: the Ray Data job from object storage to object storage
(its stages' functions: batch_stages.py; its rows' schemas: batch_rows.py; the command
line: batch_cli.py).

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

import json
import logging
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from gravityocr import metrics
from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.pipelines.batch_stages import (document_markdown_from_rows, markdown_key, plan_pages,
                                               region_decode_stats, render_document, write_pages)
from gravityocr.pipelines.page_ocr import PageOcrConfig
from gravityocr.pipelines.page_readers import DEFAULT_SERVE_APP, PageReader, ServePageReader
from gravityocr.pipelines.progress import BatchProgress
from gravityocr.pipelines.storage import StorageLocation, exists, list_objects, resolve, write_atomic

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
    page: PageOcrConfig = field(default_factory=PageOcrConfig)  # how pages are rendered and laid out
    decode: DecodeSettings = field(default_factory=DecodeSettings)  # how the engine actors decode regions
    model: str | None = None  # None: the shipped default
    pages_per_batch: int = 4  # pages an engine actor reads in one engine batch
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
            .flat_map(render_document, fn_kwargs={"source": source, "dpi": config.page.dpi}, num_cpus=0.5,
                      runtime_env=runtime_env)
            .map_batches(plan_pages, fn_kwargs={"page": config.page},
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
