"""The project's Prometheus metrics: defined once here, recorded through Ray.

Every metric is a `ray.util.metrics` Counter, Gauge or Histogram. Ray's metrics agent on
each node serves them on the node's metrics export port (`ray start
--metrics-export-port`, 8080 on KubeRay) with a `ray_` prefix, next to Ray's own
metrics, so one Prometheus scrape config covers both. What ray 2.60 exports, seen by
starting a local Ray with `_metrics_export_port` and scraping it:

    Counter   gravityocr_pages           -> ray_gravityocr_pages_total
    Gauge     gravityocr_queue_depth     -> ray_gravityocr_queue_depth
    Histogram gravityocr_request_latency_seconds
              -> ray_gravityocr_request_latency_seconds_bucket{le=...}, _sum, _count

(counters gain `_total`; every series also carries Ray's labels SessionName,
NodeAddress, Component, Version and WorkerId). `prometheus_names()` gives these exported
names; the dashboards in infra/grafana/ query them, and tests check that every metric
here is on some panel and that a real Ray exports exactly these names.

A gauge that is not set again drops out of Ray's export about 20 s later (two report
intervals: that is how Ray ages out the gauges of dead workers), so this module re-sets
every gauge its process has set, every few seconds, from a daemon thread: a gauge reads
"the last value, while the process lives".

The functions below are the whole API: the batch job and the Serve app call them, the
engine (`model/`, which knows nothing of Ray) only returns the numbers. Metric objects
are created on first use in each process (Ray workers are separate processes) and
cached; without a connected Ray (unit tests, `gravityocr ocr`) every call is a no-op.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

PREFIX = "gravityocr_"
EXPORT_PREFIX = "ray_"  # added by Ray's exporter

# Label values used across the project (free strings, listed so dashboards and callers agree).
STATUS_OK = "ok"
STATUS_ERROR = "error"
WORKLOAD_BATCH = "batch"  # the batch job (nightly corpus runs)
WORKLOAD_ONLINE = "online"  # the Serve HTTP API
ABANDONED_TIMEOUT = "timeout"  # the HTTP request ran past the service's request timeout
ABANDONED_CLIENT_CLOSED = "client_closed"  # the client hung up before the answer


@dataclass(frozen=True)
class MetricSpec:
    name: str  # as given to ray.util.metrics (without Ray's `ray_` prefix)
    kind: str  # "counter" | "gauge" | "histogram"
    description: str
    tag_keys: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()  # histograms only; Ray needs them positive

    @property
    def exported_name(self) -> str:
        """The Prometheus name: `ray_` prefix; counters end in `_total`; a histogram's
        series are this name plus `_bucket`, `_sum` and `_count`."""
        suffix = "_total" if self.kind == "counter" else ""
        return f"{EXPORT_PREFIX}{self.name}{suffix}"


# Accepted drafts per round lie in 0..B-1 (B = 32 by default); Ray histogram boundaries
# must be positive, so "0 accepted" is the le="0.5" bucket.
_ACCEPTED_BOUNDARIES = (0.5, 1.5, 2.5, 4.5, 8.5, 12.5, 16.5, 20.5, 24.5, 28.5, 31.5, 63.5)
_TPF_BOUNDARIES = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 33.0)
_LATENCY_BOUNDARIES = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)

DOCUMENTS = MetricSpec(
    PREFIX + "documents", "counter",
    "Documents finished by the batch job or the service, by status (ok: every page ok).", ("status",))
PAGES = MetricSpec(
    PREFIX + "pages", "counter", "Pages finished, by status (ok or error).", ("status",))
PAGE_ERRORS = MetricSpec(
    PREFIX + "page_errors", "counter",
    "Pages that failed, by reason (e.g. read, render, layout, decode, write, timeout).", ("reason",))
COMMITTED_TOKENS = MetricSpec(
    PREFIX + "committed_tokens", "counter",
    "Tokens committed by the recogniser, by content type (text, table, formula, ...) and workload (batch, online).",
    ("content_type", "workload"))
FORWARD_PASSES = MetricSpec(
    PREFIX + "forward_passes", "counter",
    "Recogniser forward passes (prefill, draft and verify all count), by content type and workload.",
    ("content_type", "workload"))
TOKENS_PER_FORWARD = MetricSpec(
    PREFIX + "tokens_per_forward", "histogram",
    "Tokens per forward pass (TPF) of each decoded region, by content type and workload.",
    ("content_type", "workload"),
    _TPF_BOUNDARIES)
ACCEPTED_DRAFTS = MetricSpec(
    PREFIX + "accepted_drafts_per_round", "histogram",
    "Draft tokens accepted in each self-speculative round, by content type and workload.",
    ("content_type", "workload"),
    _ACCEPTED_BOUNDARIES)
ENGINE_BATCH_SIZE = MetricSpec(
    PREFIX + "engine_batch_size", "gauge",
    "Sequences in the engine's current decoding batch, per engine actor.", ("engine",))
QUEUE_DEPTH = MetricSpec(
    PREFIX + "queue_depth", "gauge",
    "Items waiting in a queue, per engine actor (engine: requests not yet admitted to a batch; online, "
    "batch: those of each lane of a Serve replica's engine).",
    ("queue", "engine"))
ADMITTED_CROPS = MetricSpec(
    PREFIX + "admitted_crops", "counter",
    "Crops a Serve replica's engine admitted into its batch, by lane (online requests first, then the batch "
    "job's pages in the slots left free).", ("lane",))
LANE_PAGES = MetricSpec(
    PREFIX + "lane_pages", "counter",
    "Pages a Serve replica read, by lane (online: /v1/ocr requests; batch: pages of a batch job run "
    "with --serve-app).", ("lane",))
ENGINE_ACTORS_ALIVE = MetricSpec(
    PREFIX + "engine_actors_alive", "gauge",
    "1 while an engine actor is up (sum over series = engine actors alive), by device.",
    ("engine", "device"))
REQUEST_LATENCY = MetricSpec(
    PREFIX + "request_latency_seconds", "histogram",
    "Serve request latency in seconds, by endpoint and status (HTTP status code).",
    ("endpoint", "status"), _LATENCY_BOUNDARIES)
ABANDONED_ENGINE_REQUESTS = MetricSpec(
    PREFIX + "abandoned_engine_requests", "counter",
    "Engine requests withdrawn unfinished because their HTTP request was abandoned, by reason "
    "(timeout or client_closed); their batch slots go to live requests at the next decode round.",
    ("reason",))

DECODE_ROUNDS = MetricSpec(
    PREFIX + "decode_rounds", "counter",
    "Decode rounds each region took part in, by kind (speculative: drafts verified; ar: one token, in AR "
    "decoding or in a CPU batch past speculative_max_batch), content type and workload.",
    ("kind", "content_type", "workload"))
ROUND_SPECULATIVE, ROUND_AR = "speculative", "ar"

METRICS: tuple[MetricSpec, ...] = (
    DOCUMENTS, PAGES, PAGE_ERRORS, COMMITTED_TOKENS, FORWARD_PASSES, TOKENS_PER_FORWARD,
    ACCEPTED_DRAFTS, ENGINE_BATCH_SIZE, QUEUE_DEPTH, ADMITTED_CROPS, LANE_PAGES, ENGINE_ACTORS_ALIVE,
    REQUEST_LATENCY, ABANDONED_ENGINE_REQUESTS, DECODE_ROUNDS)

METRIC_NAMES: tuple[str, ...] = tuple(spec.name for spec in METRICS)


def prometheus_names() -> dict[str, MetricSpec]:
    """Exported Prometheus name -> spec, for every metric defined here."""
    return {spec.exported_name: spec for spec in METRICS}


# ------------------------------------------------------------------ per-process objects

_lock = threading.Lock()
_objects: dict[str, object] = {}
GAUGE_REFRESH_S = 5.0  # well under Ray's 2 x 10 s gauge time-to-live
_gauge_values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
_refresher: threading.Thread | None = None


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")  # never imported means never initialised: don't import it
    return ray is not None and ray.is_initialized()


def _metric(spec: MetricSpec):
    """The ray.util.metrics object for `spec` in this process, created on first use."""
    metric = _objects.get(spec.name)
    if metric is not None:
        return metric
    from ray.util import metrics as ray_metrics

    with _lock:
        metric = _objects.get(spec.name)
        if metric is None:
            if spec.kind == "counter":
                metric = ray_metrics.Counter(spec.name, spec.description, tag_keys=spec.tag_keys)
            elif spec.kind == "gauge":
                metric = ray_metrics.Gauge(spec.name, spec.description, tag_keys=spec.tag_keys)
            else:
                metric = ray_metrics.Histogram(spec.name, spec.description, list(spec.boundaries),
                                               tag_keys=spec.tag_keys)
            _objects[spec.name] = metric
    return metric


def _engine_id() -> str:
    """This process's engine label: the Ray actor id, shortened (unique among live actors),
    or the worker id for a plain task or driver."""
    import ray

    context = ray.get_runtime_context()
    actor_id = context.get_actor_id()
    return (actor_id or context.get_worker_id())[:12]


def _inc(spec: MetricSpec, value: float, **tags: str) -> None:
    if value > 0 and _ray_connected():
        _metric(spec).inc(value, tags=tags)


def _set(spec: MetricSpec, value: float, **tags: str) -> None:
    global _refresher
    if not _ray_connected():
        return
    _metric(spec).set(value, tags=tags)
    with _lock:
        _gauge_values[(spec.name, tuple(sorted(tags.items())))] = value
        if _refresher is None:
            _refresher = threading.Thread(target=_refresh_gauges, name="gravityocr-gauges", daemon=True)
            _refresher.start()


def _refresh_gauges() -> None:
    specs = {spec.name: spec for spec in METRICS}
    while True:
        time.sleep(GAUGE_REFRESH_S)
        if not _ray_connected():
            continue
        with _lock:
            values = list(_gauge_values.items())
        for (name, tags), value in values:
            _metric(specs[name]).set(value, tags=dict(tags))


def _observe(spec: MetricSpec, values: Iterable[float], **tags: str) -> None:
    if not _ray_connected():
        return
    metric = _metric(spec)
    for value in values:
        metric.observe(value, tags=tags)


# ------------------------------------------------------------------------------ the API

def record_document(status: str = STATUS_OK) -> None:
    """One document finished (status: "ok" if every page succeeded, else "error")."""
    _inc(DOCUMENTS, 1, status=status)


def record_page(status: str = STATUS_OK, error_reason: str | None = None) -> None:
    """One page finished; a failed page also counts under its reason."""
    if error_reason is not None:
        status = STATUS_ERROR
    _inc(PAGES, 1, status=status)
    if status != STATUS_OK:
        _inc(PAGE_ERRORS, 1, reason=error_reason or "unknown")


def wait_for_export() -> None:
    """Block for one of Ray's metric report intervals, plus a margin. Ray pushes a process's
    metrics only on that period, and what a process recorded since the last push is lost
    when it ends (ray-project/ray#66178); a short-lived recorder (the batch job's driver,
    which counts pages and documents) calls this before it ends. A no-op without Ray."""
    if not _ray_connected():
        return
    import ray

    try:
        interval_s = ray._config.metrics_report_interval_ms() / 1000
    except AttributeError:  # the setting's accessor is not public API
        interval_s = 10.0
    time.sleep(interval_s + 1.0)


def record_decode(workload: str, content_type: str, committed_tokens: int, forward_passes: int,
                  accepted_per_round: Sequence[int] = (), ar_rounds: int = 0) -> None:
    """One region decoded by a workload (WORKLOAD_BATCH or WORKLOAD_ONLINE): its token and
    pass counts (TPF = tokens / passes), the number of drafts accepted in each of its
    self-speculative rounds (empty for AR decoding) and its rounds of one AR token. Takes
    the fields of the engine's per-request stats as they are."""
    tags = {"content_type": content_type, "workload": workload}
    _inc(COMMITTED_TOKENS, committed_tokens, **tags)
    _inc(FORWARD_PASSES, forward_passes, **tags)
    if forward_passes > 0:
        _observe(TOKENS_PER_FORWARD, [committed_tokens / forward_passes], **tags)
    _observe(ACCEPTED_DRAFTS, [float(a) for a in accepted_per_round], **tags)
    for kind, rounds in ((ROUND_SPECULATIVE, len(accepted_per_round)), (ROUND_AR, ar_rounds)):
        if rounds > 0:
            _inc(DECODE_ROUNDS, rounds, kind=kind, **tags)


def set_engine_batch_size(n: int) -> None:
    """Sequences in this engine actor's current batch (call after each scheduler step)."""
    if _ray_connected():
        _set(ENGINE_BATCH_SIZE, n, engine=_engine_id())


def set_queue_depth(n: int, queue: str = "engine") -> None:
    """Items waiting in this process's queue of the given name."""
    if _ray_connected():
        _set(QUEUE_DEPTH, n, queue=queue, engine=_engine_id())


def record_admitted_crops(lane: str, count: int) -> None:
    """`count` crops admitted into this replica's engine from `lane` (online or batch)."""
    _inc(ADMITTED_CROPS, count, lane=lane)


def record_lane_page(lane: str, count: int = 1) -> None:
    """Pages this replica read for `lane` (online or batch)."""
    _inc(LANE_PAGES, count, lane=lane)


def engine_actor_started(device: str = "cpu") -> None:
    """Call once when an engine actor is ready. The value is kept fresh while the actor
    lives; when it dies, its series drops out of the export within about 20 s."""
    if _ray_connected():
        _set(ENGINE_ACTORS_ALIVE, 1, engine=_engine_id(), device=device)


def engine_actor_stopped(device: str = "cpu") -> None:
    """Call on orderly shutdown, so the gauge reads 0 at once."""
    if _ray_connected():
        _set(ENGINE_ACTORS_ALIVE, 0, engine=_engine_id(), device=device)


def observe_request_latency(endpoint: str, status: int | str, seconds: float) -> None:
    """One Serve request: its endpoint (route, e.g. "/v1/ocr"), status code and latency."""
    _observe(REQUEST_LATENCY, [seconds], endpoint=endpoint, status=str(status))


def record_abandoned_engine_requests(reason: str, count: int) -> None:
    """`count` engine requests withdrawn because their HTTP request was abandoned
    (reason ABANDONED_TIMEOUT or ABANDONED_CLIENT_CLOSED)."""
    _inc(ABANDONED_ENGINE_REQUESTS, count, reason=reason)
