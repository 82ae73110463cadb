"""End to end on one host: infra/local/cluster.sh starts a multi-node Ray cluster (head, a
CPU worker, an engine worker, token auth), the S3 endpoint and a real Prometheus that finds
the nodes through Ray's service discovery file. On that cluster a real `gravityocr batch`
job reads documents from the S3 endpoint with the shipped model while `gravityocr serve`
answers real HTTP requests; Prometheus's query API must then answer the throughput
dashboard's queries (pages/s, tokens/s, TPF, TPF by content type) and the latency and
engine panels with data, and count every page the job wrote.

Everything listens on loopback. The test starts and stops all of it (`cluster.sh down`
signals exactly the process groups `up` started) and fails, rather than skips, when a
program it needs is missing: Prometheus comes from Debian (`apt-get install prometheus`).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import boto3
import pypdfium2
import pytest

from ports import free_port

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "infra" / "local" / "cluster.sh"
SAMPLES = REPO / "samples"
GENERATED_SAMPLES = ("columns.jpg", "notice.png", "report.pdf")  # corpus/make_samples.py draws them
COPIES = 3  # of the generated samples in the job: 12 pages (with fewer the job can end inside one metrics export and Pages/s has no rate)
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
    # Two logical CPUs a worker: the Serve replica (1 CPU) may land on the engine worker, and
    # the batch job's engine actor (1 CPU + engine_worker) must still fit there (with one
    # CPU the actor stayed pending for the whole job: seen in a CI run).
    env = {**os.environ, "GRAVITYOCR_LOCAL_DIR": state, "GRAVITYOCR_PORT_BASE": str(_port_base()),
           "CPU_WORKERS": "1", "ENGINE_WORKERS": "1", "WORKER_CPUS": "2", "RAY_AUTH_MODE": "token",
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


def _answered(result: list[dict], positive: bool) -> bool:
    """Data in the answer: at least one series, no NaN (0/0 while a counter stood still) and,
    for rates, movement (a counter's first sample gives a rate of 0)."""
    values = [float(r["value"][1]) for r in result]
    return bool(values) and all(math.isfinite(v) and (v > 0 or not positive) for v in values)


def _s3(settings: dict):
    return boto3.client("s3", endpoint_url=settings["AWS_ENDPOINT_URL"], region_name=settings["AWS_DEFAULT_REGION"],
                        aws_access_key_id=settings["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=settings["AWS_SECRET_ACCESS_KEY"])


def _job_summary(settings: dict) -> dict:
    body = _s3(settings).get_object(Bucket="gravityocr-output", Key="nightly/_summary.json")["Body"].read()
    return json.loads(body)


def _upload_documents(settings: dict) -> int:
    """The bundled generated samples, COPIES times, into the input bucket; the number of pages."""
    s3 = _s3(settings)
    pages = 0
    for copy in range(COPIES):
        for path in (SAMPLES / name for name in GENERATED_SAMPLES):
            s3.put_object(Bucket="gravityocr-input", Key=f"nightly/{copy}-{path.name}", Body=path.read_bytes())
            pages += len(pypdfium2.PdfDocument(str(path))) if path.suffix == ".pdf" else 1
    return pages


def _wait_ready(url: str, server: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, f"gravityocr serve ended early:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    pytest.fail(f"gravityocr serve not ready after {timeout} s:\n{log.read_text()[-3000:]}")


def _ocr_request(url: str, image: bytes) -> int | str:
    """The answer's status, or what went wrong on the way (a timeout, a refused connection)."""
    boundary = "gravityocr-test-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"notice.png\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + image + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(f"{url}/v1/ocr", data=body, method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:  # a loaded 2-core box can be slow
            json.load(response)
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:  # no answer at all: said in the statuses, the requests go on
        return f"{type(error).__name__}: {error}"


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_prometheus_answers_the_panels_for_a_real_batch_job_and_serve_requests(local_cluster):
    env, settings = local_cluster
    client_env = {**env, **settings}
    prometheus = settings["PROMETHEUS_URL"]
    logs = Path(env["GRAVITYOCR_LOCAL_DIR"]) / "logs"
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

    pages_expected = _upload_documents(settings)
    gravityocr = str(Path(sys.executable).parent / "gravityocr")
    serve_url = f"http://{HOST}:{free_port()}"
    with open(logs / "serve.log", "w") as log:
        server = subprocess.Popen([gravityocr, "serve", "--address", settings["RAY_ADDRESS"],
                                   "--port", serve_url.rsplit(":", 1)[1]],
                                  env=client_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    batch = None
    statuses: list[int] = []
    stop_requests = threading.Event()

    def send_requests() -> None:  # a few online requests while the nightly job runs
        image = (SAMPLES / "notice.png").read_bytes()
        while not stop_requests.is_set():
            statuses.append(_ocr_request(serve_url, image))
            stop_requests.wait(2)

    requester = threading.Thread(target=send_requests)
    try:
        _wait_ready(serve_url, server, logs / "serve.log", timeout=300)
        with open(logs / "batch.log", "w") as log:
            # An engine actor of its own on the engine worker node, as an ad-hoc job on RayCluster
            # gravityocr places it (the nightly job reads through the service: test_batch_through_serve.py).
            batch = subprocess.Popen([gravityocr, "batch", "s3://gravityocr-input/nightly/",
                                      "s3://gravityocr-output/nightly/", "--address", settings["RAY_ADDRESS"],
                                      "--max-actors", "1", "--actor-resources", '{"engine_worker": 1}',
                                      "--max-new-tokens", "48"],
                                     env=client_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        requester.start()

        queries = _panel_queries("gravityocr-throughput.json")
        assert {"Pages/s", "Tokens/s", "TPF", "TPF by content type"} <= {t for t, _ in queries}
        wanted = [(t, e) for t, e in queries if t in ("Pages/s", "Tokens/s", "TPF", "TPF by content type")]
        wanted += [(t, e) for t, e in queries if t == "Tokens/s by workload"]
        wanted += [(t, e) for t, e in _panel_queries("gravityocr-latency-errors.json") if t == "Request latency"]
        wanted += [(t, e) for t, e in _panel_queries("gravityocr-autoscaling.json")
                   if t in ("Engine actors alive", "Engine queue depth")]
        answers: dict[str, list[dict]] = {}  # the first answer with data, by panel and query
        counted_pages = batch_tokens = 0.0
        job_tokens = None  # from the job's summary, once it has ended
        deadline = time.monotonic() + 360
        while time.monotonic() < deadline:
            time.sleep(5)
            for title, expr in wanted:
                # The Serve requests keep the token counters moving; a short job's page counter
                # may appear already complete in one export (a rate of 0), so it is counted below.
                rate = title in ("Tokens/s", "TPF", "TPF by content type")
                if (title, expr) not in answers and _answered(result := _query(prometheus, expr), rate):
                    answers[(title, expr)] = result
            total = _query(prometheus, "sum(ray_gravityocr_pages_total)")
            counted_pages = float(total[0]["value"][1]) if total else 0.0
            tokens = _query(prometheus, 'sum(ray_gravityocr_committed_tokens_total{workload="batch"})')
            batch_tokens = float(tokens[0]["value"][1]) if tokens else 0.0
            if batch.poll() is not None:
                assert batch.returncode == 0, f"the batch job failed:\n{(logs / 'batch.log').read_text()[-3000:]}"
                job_tokens = job_tokens or _job_summary(settings)["committed_tokens"]
                if (len(answers) == len(wanted) and counted_pages >= pages_expected and batch_tokens >= job_tokens
                        and len(statuses) >= 3):
                    break
        missing = sorted({title for title, expr in wanted if (title, expr) not in answers})
        assert not missing, f"panels with no data: {missing}"
    finally:
        stop_requests.set()
        if requester.is_alive():
            requester.join(timeout=180)
        for process in (batch, server):
            if process is not None:
                _stop(process)

    batch_log = (logs / "batch.log").read_text()
    assert batch.returncode == 0, batch_log[-3000:]
    assert f"pages: {pages_expected} (0 with errors)" in batch_log, batch_log[-3000:]
    assert counted_pages == pages_expected, (counted_pages, pages_expected)  # every page counted exactly once
    # every token the job committed counted once, the online API's apart (the driver records
    # them: an engine actor killed at the job's end would lose its last seconds)
    assert job_tokens and batch_tokens == job_tokens, (batch_tokens, job_tokens)
    assert len(statuses) >= 3 and set(statuses) == {200}, (statuses, (logs / "serve.log").read_text()[-3000:])

    tpf = {r["metric"]["content_type"]: float(r["value"][1])
           for (title, _), result in answers.items() if title == "TPF by content type" for r in result}
    assert tpf and set(tpf) <= {"text", "table", "formula"}, tpf
    # A round commits at least one token per two passes and at most block + 1 per pass.
    assert all(0.4 < value <= 33 for value in tpf.values()), tpf
    (pages_per_second,) = next(result for (title, _), result in answers.items() if title == "Pages/s")
    assert float(pages_per_second["value"][1]) >= 0
    latency = next(result for (title, _), result in answers.items() if title == "Request latency")
    assert {r["metric"]["endpoint"] for r in latency} == {"/v1/ocr"}, latency
    by_workload = next(result for (title, _), result in answers.items() if title == "Tokens/s by workload")
    assert {r["metric"]["workload"] for r in by_workload} <= {"batch", "online"}, by_workload
