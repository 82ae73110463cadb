"""gravityocr.metrics: the definitions, the no-op without Ray, and what a real Ray exports.

The export test starts a single-node Ray (in a subprocess, so that its environment and
Ray's process-wide state stay out of this test process) with a metrics export port on
loopback, records every metric through the API from an actor, a task and the driver,
and reads Ray's Prometheus endpoint: the names must be `metrics.prometheus_names()`, and
a gauge set once must still be exported after Ray's gauge time-to-live has passed.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import textwrap

import pytest

from gravityocr import metrics
from ports import free_port

LOOPBACK = "127.0.0.2"  # Ray rewrites 127.0.0.1 to the host's routable address; this it keeps


def test_definitions():
    names = [spec.name for spec in metrics.METRICS]
    assert len(set(names)) == len(names) and tuple(names) == metrics.METRIC_NAMES
    for spec in metrics.METRICS:
        assert spec.name.startswith("gravityocr_") and spec.description
        assert spec.kind in ("counter", "gauge", "histogram")
        if spec.kind == "histogram":
            assert list(spec.boundaries) == sorted(set(spec.boundaries)) and spec.boundaries[0] > 0
        else:
            assert not spec.boundaries
    exported = metrics.prometheus_names()
    assert exported["ray_gravityocr_pages_total"] is metrics.PAGES
    assert exported["ray_gravityocr_tokens_per_forward"] is metrics.TOKENS_PER_FORWARD
    assert exported["ray_gravityocr_queue_depth"] is metrics.QUEUE_DEPTH


def test_every_call_is_a_no_op_without_ray():
    """Nothing is imported or recorded outside Ray (unit tests, `gravityocr ocr`)."""
    code = textwrap.dedent("""
        import sys
        from gravityocr import metrics as m
        m.record_document(); m.record_page(error_reason="render"); m.record_decode(m.WORKLOAD_BATCH, "text", 30, 4, [12, 14], ar_rounds=1)
        m.set_engine_batch_size(3); m.set_queue_depth(2); m.engine_actor_started("cpu"); m.engine_actor_stopped()
        m.observe_request_latency("/v1/ocr", 200, 0.3)
        m.record_abandoned_engine_requests(m.ABANDONED_TIMEOUT, 2)
        m.record_admitted_crops("batch", 40); m.record_lane_page("online")
        assert "ray" not in sys.modules, "recording without Ray imported ray"
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


EXPORT_SCRIPT = textwrap.dedent("""
    import json, re, sys, time, urllib.request
    import ray
    from gravityocr import metrics as m

    host, port, temp_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address=host, _metrics_export_port=port,
             _temp_dir=temp_dir, logging_level="ERROR")

    @ray.remote(num_cpus=0)
    class Engine:
        def __init__(self):
            m.engine_actor_started("cpu")  # set once, never again
        def step(self):
            m.set_engine_batch_size(8)
            m.set_queue_depth(3)
            m.record_decode(m.WORKLOAD_ONLINE, "table", 270, 20, [25, 24, 26, 0, 31], ar_rounds=2)
            m.set_queue_depth(40, queue="batch")
            m.record_admitted_crops("online", 3)
            m.record_admitted_crops("batch", 29)
            m.record_lane_page("batch")
            return True

    @ray.remote(num_cpus=0)
    def page():
        m.record_page()
        m.record_page(error_reason="layout")
        return True

    engine = Engine.remote()
    ray.get([engine.step.remote(), page.remote()])
    m.record_document("ok")
    m.observe_request_latency("/v1/ocr", 200, 0.42)
    m.record_abandoned_engine_requests(m.ABANDONED_CLIENT_CLOSED, 1)

    def scrape():
        body = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
        found = {}
        for line in body.splitlines():
            match = re.match(r"(ray_gravityocr_\\w+)\\{(.*)\\}", line)
            if match:
                found.setdefault(match.group(1), set()).update(re.findall(r'(\\w+)="', match.group(2)))
        return found

    want = {"ray_gravityocr_" + s.name.removeprefix("gravityocr_") for s in m.METRICS}
    deadline = time.monotonic() + 120
    found = scrape()
    while time.monotonic() < deadline and len({re.sub("_(total|bucket|sum|count)$", "", n) for n in found}) < len(want):
        time.sleep(2)
        found = scrape()
    first = {name: sorted(labels) for name, labels in found.items()}
    # past Ray's gauge time-to-live (2 report intervals), which the refresh must outlast
    time.sleep(3 * ray._config.metrics_report_interval_ms() / 1000)
    later = scrape()
    print(json.dumps({"first": first, "later": sorted(later),
                      "interval_s": ray._config.metrics_report_interval_ms() / 1000}))
    ray.shutdown()
""")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_real_ray_exports_the_documented_names():
    with tempfile.TemporaryDirectory(prefix="gocr", dir="/tmp") as temp_dir:  # short: Unix socket paths
        # Reports every 4 s instead of 10: a gauge's time-to-live (2 intervals, 8 s) still
        # outlasts metrics.GAUGE_REFRESH_S, and the test waits 12 s for it instead of 30.
        env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
               "RAY_USAGE_STATS_ENABLED": "0", "RAY_metrics_report_interval_ms": "4000"}
        result = subprocess.run(
            [sys.executable, "-c", EXPORT_SCRIPT, LOOPBACK, str(free_port(LOOPBACK)), temp_dir],
            env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    first, later = report["first"], set(report["later"])
    assert report["interval_s"] == 4.0 and metrics.GAUGE_REFRESH_S < 2 * report["interval_s"]

    expected = set()
    for name, spec in metrics.prometheus_names().items():
        expected |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if spec.kind == "histogram" else {name}
    assert set(first) == expected
    for name, spec in metrics.prometheus_names().items():
        series = f"{name}_bucket" if spec.kind == "histogram" else name
        assert set(spec.tag_keys) <= set(first[series]), name
    assert "le" in first["ray_gravityocr_accepted_drafts_per_round_bucket"]
    # set once in the actor's constructor, still there after the time-to-live: refreshed
    assert "ray_gravityocr_engine_actors_alive" in later
