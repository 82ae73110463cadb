"""Build GravityOCR's Grafana dashboards in code (grafana-foundation-sdk) and write them as JSON.

    python infra/grafana/build_dashboards.py            # rewrite infra/grafana/dashboards/*.json
    python infra/grafana/build_dashboards.py --check    # exit 1 if the committed JSON is stale

Three dashboards, all on one Prometheus data source (a `datasource` variable):
- autoscaling: nodes and actors per group, pending resources, Serve replicas, queues, and the
  online and batch lanes of the same replicas side by side;
- throughput: pages/s, documents/s, tokens/s, forward passes/s, TPF and accepted drafts;
- latency and errors: request latency by endpoint, error ratios, abandoned engine requests,
  page errors by reason.

Every query names either a metric defined in `gravityocr.metrics` (exported as
`ray_gravityocr_*`) or one Ray exports itself, listed in `RAY_METRICS` with where Ray
documents or defines it; tests/test_infra_dashboards.py checks both directions.
`$__rate_interval` is Grafana's; everything else is plain PromQL.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders.common import ReduceDataOptions, VizLegendOptions, VizTooltipOptions
from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (BigValueGraphMode, LegendDisplayMode, LegendPlacement, SortOrder,
                                                  TimeZoneBrowser, TooltipDisplayMode)
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from gravityocr import metrics as m

OUT_DIR = Path(__file__).resolve().parent / "dashboards"
RATE = "$__rate_interval"

_SYSTEM_METRICS_DOC = "https://docs.ray.io/en/latest/ray-observability/reference/system-metrics.html"
_SERVE_SOURCE = "python/ray/serve/_private/deployment_state.py"
# Ray's own metrics the dashboards use: Prometheus name -> where Ray documents or defines it.
# ray_* come through Ray's metrics export port like ours; autoscaler_* come from the
# autoscaler's own endpoint (port 44217 on the head; listed in Ray's service discovery file).
RAY_METRICS: dict[str, str] = {
    "ray_cluster_active_nodes": _SYSTEM_METRICS_DOC,
    "ray_cluster_pending_nodes": _SYSTEM_METRICS_DOC,
    "ray_actors": _SYSTEM_METRICS_DOC,
    "ray_tasks": _SYSTEM_METRICS_DOC,
    "ray_resources": _SYSTEM_METRICS_DOC,
    "autoscaler_pending_resources": "python/ray/autoscaler/_private/prom_metrics.py",
    "autoscaler_cluster_resources": "python/ray/autoscaler/_private/prom_metrics.py",
    "ray_serve_deployment_replica_healthy": _SERVE_SOURCE,
    "ray_serve_autoscaling_target_replicas": _SERVE_SOURCE,
    "ray_serve_deployment_queued_queries": "https://docs.ray.io/en/latest/serve/monitoring.html",
    "ray_serve_deployment_error_counter_total": "https://docs.ray.io/en/latest/serve/monitoring.html",
}

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

PAGES = m.PAGES.exported_name
DOCUMENTS = m.DOCUMENTS.exported_name
PAGE_ERRORS = m.PAGE_ERRORS.exported_name
TOKENS = m.COMMITTED_TOKENS.exported_name
PASSES = m.FORWARD_PASSES.exported_name
TPF = m.TOKENS_PER_FORWARD.exported_name
ACCEPTED = m.ACCEPTED_DRAFTS.exported_name
BATCH = m.ENGINE_BATCH_SIZE.exported_name
QUEUE = m.QUEUE_DEPTH.exported_name
ENGINES = m.ENGINE_ACTORS_ALIVE.exported_name
LATENCY = m.REQUEST_LATENCY.exported_name
ABANDONED = m.ABANDONED_ENGINE_REQUESTS.exported_name
ROUNDS = m.DECODE_ROUNDS.exported_name
ADMITTED = m.ADMITTED_CROPS.exported_name
LANE_PAGES = m.LANE_PAGES.exported_name
LANES = '{queue=~"online|batch"}'


def query(expr: str, legend: str = "", ref: str = "A") -> Dataquery:
    return Dataquery().expr(expr).legend_format(legend or "__auto").ref_id(ref)


def timeseries(title: str, description: str, unit: str, *queries: Dataquery, width: int = 12) -> Timeseries:
    panel = (Timeseries().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .span(width).height(8).min(0)
             .legend(VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST)
                     .placement(LegendPlacement.BOTTOM))
             .tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)))
    for q in queries:
        panel = panel.with_target(q)
    return panel


def stat(title: str, description: str, unit: str, expr: str) -> Stat:
    return (Stat().title(title).description(description).unit(unit).datasource(DATASOURCE)
            .span(6).height(4).graph_mode(BigValueGraphMode.AREA)
            .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .with_target(query(expr)))


def dashboard(uid: str, title: str, description: str) -> Dashboard:
    return (Dashboard(title).uid(uid).description(description).tags(["gravityocr", "generated"])
            .refresh("30s").time("now-3h", "now").timezone(TimeZoneBrowser)
            .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus")))


def rate_sum(metric: str, by: str = "", selector: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{selector}[{RATE}]))"


def quantile(q: float, histogram: str, by: str, selector: str = "") -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({histogram}_bucket{selector}[{RATE}])))"


def autoscaling() -> Dashboard:
    return (
        dashboard("gravityocr-autoscaling", "GravityOCR / Autoscaling",
                  "Nodes, actors and replicas per group as the KubeRay autoscaler and Serve scale them.")
        .with_row(Row("Nodes"))
        .with_panel(timeseries(
            "Nodes per group", "Alive Ray nodes by group (KubeRay worker group = autoscaler node type).",
            "short",
            query("sum by (node_type) (ray_cluster_active_nodes)", "{{node_type}} active", "A"),
            query("sum by (node_type) (ray_cluster_pending_nodes)", "{{node_type}} pending", "B")))
        .with_panel(timeseries(
            "Pending resources", "Logical resources the autoscaler is adding, against the cluster's total.",
            "short",
            query("sum by (resource) (autoscaler_pending_resources)", "{{resource}} pending", "A"),
            query('sum by (resource) (autoscaler_cluster_resources{resource=~"CPU|GPU"})',
                  "{{resource}} total", "B")))
        .with_panel(timeseries(
            "CPU and GPU in use", "Logical CPUs and GPUs held by tasks and actors.", "short",
            query('sum by (Name) (ray_resources{State="USED", Name=~"CPU|GPU"})', "{{Name}} used")))
        .with_panel(timeseries(
            "Waiting for a node", "Tasks and actors that wait for resources, by function or class.",
            "short",
            query('sum by (Name) (ray_tasks{State="PENDING_NODE_ASSIGNMENT"})', "task {{Name}}", "A"),
            query('sum by (Name) (ray_actors{State="PENDING_CREATION"})', "actor {{Name}}", "B")))
        .with_row(Row("Actors"))
        .with_panel(timeseries(
            "Actors alive by class",
            "Alive actors by class (the GCS's count): engine actors, Serve replicas, Ray Data workers.",
            "short", query('sum by (Name) (ray_actors{State="ALIVE"})', "{{Name}}")))
        .with_panel(timeseries(
            "Engine actors alive", "Engine actors that reported ready and have not stopped, by device.",
            "short", query(f"sum by (device) ({ENGINES})", "{{device}}")))
        .with_panel(timeseries(
            "Engine queue depth", "Requests waiting to be admitted to an engine batch, summed over engines.",
            "short", query(f"sum by (queue) ({QUEUE})", "{{queue}}")))
        .with_panel(timeseries(
            "Engine batch size", "Sequences in each engine's current batch: mean and max over engines.",
            "short", query(f"avg({BATCH})", "mean", "A"), query(f"max({BATCH})", "max", "B")))
        .with_row(Row("Serve"))
        .with_panel(timeseries(
            "Serve replicas", "Healthy replicas against the Serve autoscaler's target, per deployment.",
            "short",
            query("sum by (application, deployment) (ray_serve_deployment_replica_healthy)",
                  "{{deployment}} healthy", "A"),
            query("max by (application, deployment) (ray_serve_autoscaling_target_replicas)",
                  "{{deployment}} target", "B")))
        .with_panel(timeseries(
            "Serve queued requests", "Requests waiting for a replica, per deployment.", "short",
            query("sum by (application, deployment) (ray_serve_deployment_queued_queries)", "{{deployment}}")))
        .with_row(Row("Online and batch on the same replicas"))
        .with_panel(timeseries(
            "Pages/s by lane", "Pages the Serve replicas read: online (/v1/ocr) and a batch job run with "
            "--serve-app, side by side.", "ops", query(rate_sum(LANE_PAGES, "lane"), "{{lane}}"), width=8))
        .with_panel(timeseries(
            "Admitted crops/s by lane", "Crops the replicas' engines admit per second: online first, batch "
            "crops in the slots left free.", "ops", query(rate_sum(ADMITTED, "lane"), "{{lane}}"), width=8))
        .with_panel(timeseries(
            "Queue depth by lane", "Crops waiting for an engine slot in each lane, summed over replicas.", "short",
            query(f"sum by (queue) ({QUEUE}{LANES})", "{{queue}}"), width=8))
    )


def throughput() -> Dashboard:
    tpf_ratio = f"{rate_sum(TOKENS, 'content_type')} / {rate_sum(PASSES, 'content_type')}"
    return (
        dashboard("gravityocr-throughput", "GravityOCR / Throughput",
                  "Pages, documents and tokens per second; tokens per forward pass (TPF) by content type.")
        .with_row(Row("Now"))
        .with_panel(stat("Pages/s", "Pages finished per second, all statuses.", "ops", f"sum(rate({PAGES}[{RATE}]))"))
        .with_panel(stat("Tokens/s", "Tokens committed per second.", "short", f"sum(rate({TOKENS}[{RATE}]))"))
        .with_panel(stat("TPF", "Committed tokens / forward passes, all content types.", "short",
                         f"sum(rate({TOKENS}[{RATE}])) / sum(rate({PASSES}[{RATE}]))"))
        .with_panel(stat("Documents/s", "Documents finished per second.", "ops",
                         f"sum(rate({DOCUMENTS}[{RATE}]))"))
        .with_row(Row("Pages and documents"))
        .with_panel(timeseries("Pages/s", "Pages finished per second, by status.", "ops",
                               query(rate_sum(PAGES, "status"), "{{status}}")))
        .with_panel(timeseries("Documents/s", "Documents finished per second, by status.", "ops",
                               query(rate_sum(DOCUMENTS, "status"), "{{status}}")))
        .with_row(Row("Decoding"))
        .with_panel(timeseries("Tokens/s", "Tokens committed per second, by content type.", "short",
                               query(rate_sum(TOKENS, "content_type"), "{{content_type}}")))
        .with_panel(timeseries("Forward passes/s", "Forward passes (prefill, draft, verify) per second.", "short",
                               query(rate_sum(PASSES, "content_type"), "{{content_type}}")))
        .with_panel(timeseries(
            "TPF by content type", "Tokens per forward pass: committed tokens / forward passes (AR decoding is 1).",
            "short", query(tpf_ratio, "{{content_type}}")))
        .with_panel(timeseries(
            "TPF per region", "Distribution of each region's TPF: median and 10th percentile.", "short",
            query(quantile(0.5, TPF, "content_type"), "{{content_type}} p50", "A"),
            query(quantile(0.1, TPF, "content_type"), "{{content_type}} p10", "B")))
        .with_panel(timeseries(
            "Accepted drafts per round", "Mean drafts accepted per self-speculative round (of B - 1 = 31).",
            "short", query(f"{rate_sum(ACCEPTED + '_sum', 'content_type')} / "
                           f"{rate_sum(ACCEPTED + '_count', 'content_type')}", "{{content_type}} mean")))
        .with_panel(timeseries(
            "Accepted drafts per round, median", "Median drafts accepted per round, from the histogram.", "short",
            query(quantile(0.5, ACCEPTED, "content_type"), "{{content_type}} p50")))
        .with_panel(timeseries("Tokens/s by workload", "Tokens committed per second: batch job vs online API.",
                               "short", query(rate_sum(TOKENS, "workload"), "{{workload}}")))
        .with_panel(timeseries(
            "TPF by workload", "Tokens per forward pass of the batch job and of the online API.", "short",
            query(f"{rate_sum(TOKENS, 'workload')} / {rate_sum(PASSES, 'workload')}", "{{workload}}")))
        .with_panel(timeseries(
            "Decode rounds/s by kind",
            "Rounds regions took part in per second: speculative (drafts verified) or ar (one token: AR "
            "decoding, or a CPU batch past speculative_max_batch, where AR rounds decode faster). TPF falls "
            "as ar rounds rise: the engine choosing throughput, not worse drafts.",
            "short", query(rate_sum(ROUNDS, "kind, workload"), "{{kind}} {{workload}}")))
    )


def latency_and_errors() -> Dashboard:
    errors = '{status!~"2.."}'
    requests = rate_sum(LATENCY + "_count", "endpoint")
    failed = rate_sum(LATENCY + "_count", "endpoint", errors)
    failed_pages = f'sum(rate({PAGES}{{status="error"}}[{RATE}]))'
    return (
        dashboard("gravityocr-latency-errors", "GravityOCR / Latency and errors",
                  "Serve request latency by endpoint and status; page errors by reason.")
        .with_row(Row("Requests"))
        .with_panel(timeseries(
            "Request latency", "p50, p95 and p99 request latency by endpoint.", "s",
            query(quantile(0.5, LATENCY, "endpoint"), "{{endpoint}} p50", "A"),
            query(quantile(0.95, LATENCY, "endpoint"), "{{endpoint}} p95", "B"),
            query(quantile(0.99, LATENCY, "endpoint"), "{{endpoint}} p99", "C")))
        .with_panel(timeseries("Requests/s", "Requests per second by endpoint and status code.", "reqps",
                               query(rate_sum(LATENCY + "_count", "endpoint, status"), "{{endpoint}} {{status}}")))
        .with_panel(timeseries(
            "Request error ratio", "Share of requests without a 2xx status, by endpoint.", "percentunit",
            query(f"({failed} or {requests} * 0) / {requests}", "{{endpoint}}")))
        .with_panel(timeseries("Serve deployment errors/s", "Exceptions raised in Serve deployments.", "ops",
                               query(rate_sum("ray_serve_deployment_error_counter_total", "deployment"),
                                     "{{deployment}}")))
        .with_panel(timeseries(
            "Abandoned engine requests/s",
            "Engine requests withdrawn unfinished because their HTTP request timed out or its client "
            "went away, by reason: decoding that would have been thrown away.", "ops",
            query(rate_sum(ABANDONED, "reason"), "{{reason}}")))
        .with_row(Row("Pages"))
        .with_panel(timeseries("Page errors/s by reason", "Failed pages per second, by reason.", "ops",
                               query(rate_sum(PAGE_ERRORS, "reason"), "{{reason}}")))
        .with_panel(timeseries(
            "Page error ratio", "Failed pages / all pages.", "percentunit",
            query(f"({failed_pages} or vector(0)) / sum(rate({PAGES}[{RATE}]))", "error ratio")))
    )


DASHBOARDS = {
    "gravityocr-autoscaling.json": autoscaling,
    "gravityocr-throughput.json": throughput,
    "gravityocr-latency-errors.json": latency_and_errors,
}


def render() -> dict[str, str]:
    """File name -> JSON text, exactly as committed."""
    encoder = JSONEncoder(sort_keys=True, indent=2)
    out = {}
    for name, build in DASHBOARDS.items():
        model = json.loads(encoder.encode(build().build()))
        for i, panel in enumerate(model["panels"], start=1):
            panel["id"] = i  # the SDK leaves ids at 0; Grafana wants them unique
        out[name] = json.dumps(model, sort_keys=True, indent=2) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build GravityOCR's Grafana dashboards.")
    parser.add_argument("--check", action="store_true", help="only compare with the committed JSON")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT_DIR / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            OUT_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale: " + ", ".join(stale) + " (run python infra/grafana/build_dashboards.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
