"""End to end on one host: infra/local/cluster.sh starts a multi-node Ray cluster (head, a
CPU worker, an engine worker, token auth), the S3 endpoint and a real Prometheus that finds
the nodes through Ray's service discovery file; infra/local/metrics_demo.py drives the
GravityOCR metrics from tasks and actors; Prometheus's query API must then answer every
query of the throughput dashboard (pages/s, tokens/s, TPF, accepted drafts) with data.

Everything listens on loopback. The test starts and stops all of it (`cluster.sh down`
signals exactly the process groups `up` started) and fails, rather than skips, when a
program it needs is missing: Prometheus comes from Debian (`apt-get install prometheus`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "infra" / "local" / "cluster.sh"
DEMO = REPO / "infra" / "local" / "metrics_demo.py"
DASHBOARDS = REPO / "infra" / "grafana" / "dashboards"
RAY_HOST, HOST = "127.0.0.2", "127.0.0.1"


def _require(program: str, install: str) -> None:
    if shutil.which(program) is None:
        pytest.fail(f"`{program}` not found: {install}")


def _ports_free(base: int) -> bool:
    """Every port cluster.sh derives from `base` (see its header) is free on both addresses."""
    ports = list(range(base, base + 100)) + list(range(base + 100, base + 400))
    for host in (HOST, RAY_HOST):
        for port in ports:
            with socket.socket() as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    return False
    return True


def _port_base() -> int:
    # Below Linux's ephemeral range (32768+), so no outgoing connection holds one of them.
    candidates = list(range(21000, 32000, 500))
    random.shuffle(candidates)
    for base in candidates:
        if _ports_free(base):
            return base
    pytest.fail("no free block of 400 ports between 21000 and 32000 on loopback")


def _query(prometheus: str, expr: str) -> list[dict]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _panel_queries(dashboard: str) -> list[tuple[str, str]]:
    model = json.loads((DASHBOARDS / dashboard).read_text())
    return [(p["title"], t["expr"].replace("$__rate_interval", "1m"))
            for p in model["panels"] for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def local_cluster():
    _require("prometheus", "install Debian's package: apt-get install prometheus")
    _require("moto_server", "pip install 'moto[server]' (in the dev extra)")
    _require("ray", "pip install -e . (ray is a dependency)")
    state = tempfile.mkdtemp(prefix="gocr", dir="/tmp")  # short: Ray's Unix socket paths
    env = {**os.environ, "GRAVITYOCR_LOCAL_DIR": state, "GRAVITYOCR_PORT_BASE": str(_port_base()),
           "CPU_WORKERS": "1", "ENGINE_WORKERS": "1", "WORKER_CPUS": "1", "RAY_AUTH_MODE": "token",
           "START_TIMEOUT_S": "240", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    try:
        up = subprocess.run(["bash", str(CLUSTER), "up"], env=env, capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, f"cluster.sh up failed:\n{up.stderr[-4000:]}"
        settings = {}
        for line in (Path(state) / "env.sh").read_text().splitlines():
            if line.startswith("export "):
                for assignment in line.removeprefix("export ").split():
                    key, _, value = assignment.partition("=")
                    settings[key] = value
        yield env, settings
    finally:
        subprocess.run(["bash", str(CLUSTER), "down"], env=env, capture_output=True, timeout=300)
        pids = list((Path(state) / "pids").glob("*.pid")) if (Path(state) / "pids").exists() else []
        shutil.rmtree(state, ignore_errors=True)
        assert not pids, f"cluster.sh down left {pids}"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_prometheus_answers_the_throughput_panels(local_cluster):
    env, settings = local_cluster
    prometheus = settings["PROMETHEUS_URL"]
    assert settings["RAY_AUTH_MODE"] == "token" and Path(settings["RAY_AUTH_TOKEN_PATH"]).is_file()
    assert prometheus.startswith(f"http://{HOST}:") and settings["RAY_ADDRESS"].startswith(f"{RAY_HOST}:")

    # Prometheus found the three Ray nodes (and the autoscaler and dashboard) through Ray's file.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        nodes = _query(prometheus, 'count(up{job="ray"} == 1)')
        if nodes and float(nodes[0]["value"][1]) >= 3:
            break
        time.sleep(3)
    else:
        pytest.fail(f"Prometheus does not scrape 3 Ray endpoints: {_query(prometheus, 'up')}")

    demo_log = Path(env["GRAVITYOCR_LOCAL_DIR"]) / "logs" / "metrics_demo.log"
    with open(demo_log, "w") as log:
        demo = subprocess.Popen([sys.executable, str(DEMO), "--seconds", "400", "--engines", "1"],
                                env={**env, **settings}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    queries = _panel_queries("gravityocr-throughput.json")
    assert {"Pages/s", "Tokens/s", "TPF", "TPF by content type", "TPF per region"} <= {t for t, _ in queries}
    extra = [(t, e) for t, e in _panel_queries("gravityocr-latency-errors.json") if t == "Request latency"]
    extra += [(t, e) for t, e in _panel_queries("gravityocr-autoscaling.json")
              if t in ("Engine actors alive", "Actors alive by class", "Engine queue depth")]
    tpf_query = next(expr for title, expr in queries if title == "TPF by content type")
    pages_query = next(expr for title, expr in queries if title == "Pages/s")  # the stat: one series

    def tpf_by_type() -> dict[str, float]:
        return {r["metric"]["content_type"]: float(r["value"][1]) for r in _query(prometheus, tpf_query)}

    empty = [title for title, _ in queries + extra]
    tpf: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 300
        while (empty or not all(v > 1 for v in tpf.values())) and time.monotonic() < deadline:
            assert demo.poll() is None, f"the metrics demo ended early:\n{demo_log.read_text()[-3000:]}"
            time.sleep(5)
            empty = [title for title, expr in queries + extra if not _query(prometheus, expr)]
            tpf = tpf_by_type()  # NaN (0/0) while the counters have not moved within the last minute
        assert not empty, f"panels with no data after 300 s: {empty}"

        assert set(tpf) == {"text", "table", "formula"}
        assert tpf["table"] > tpf["text"] > tpf["formula"] > 1, tpf  # the demo's shape, as in the paper
        (pages,) = _query(prometheus, pages_query)
        assert float(pages["value"][1]) > 0
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGTERM)
        demo.wait(timeout=60)
