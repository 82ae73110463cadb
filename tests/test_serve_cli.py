"""`gravityocr serve` as a person runs it: a real subprocess with a Ray of its own, real
HTTP, the README's requests as written, and the first Ctrl-C (SIGINT) stopping all of it.

The command runs in a session of its own with its own Ray temp dir (`RAY_TMPDIR`) and
`--address local`, so it never joins the test session's cluster, and every process it
starts is found by that session or that temp dir, never by a name that another user's Ray
would share."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from PIL import Image

from document_fixtures import tiny_recognizer
from gravityocr.model.evaluation.scores import parse_table
from gravityocr.model.network.loading import save_recognizer
from gravityocr.model.network.tasks import TASK_PROMPTS
from gravityocr.pipelines.ocr_cli import default_model_path, has_weights
from gravityocr.serve.cli import DEFAULT_CONFIG
from gravityocr.serve.schemas import ChatCompletionResponse, OcrResponse
from ports import free_port
from ray_cluster import cluster_processes, describe, stop_processes

pytestmark = pytest.mark.timeout(480)
REPO = Path(__file__).resolve().parents[1]
README_URL = "http://127.0.0.1:8000"
STOP_WITHIN_S = 60


def _log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"


@contextlib.contextmanager
def _serve_command(work: Path, model: Path | None = None, settings: dict | None = None):
    """`gravityocr serve` on the shipped config with `settings` over its `args`, in a session
    and a Ray temp dir of its own, one replica; whatever is left of it is stopped on the way
    out. `model` None: the tiny random model with a small output cap (it never says eos)."""
    if model is None:
        model = work / "model"
        save_recognizer(tiny_recognizer(), model)
        settings = {"max_new_tokens": 8, **(settings or {})}
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    application = config["applications"][0]
    application["args"].update(settings or {})
    for deployment in application["deployments"]:
        deployment["ray_actor_options"] = {"num_cpus": 0.5}
        deployment["autoscaling_config"].update(min_replicas=1, max_replicas=1)
    (work / "serve.yaml").write_text(yaml.safe_dump(config))
    ray_dir = tempfile.mkdtemp(prefix="gocr-serve-", dir="/tmp")  # short: Ray's socket paths live under it
    port = free_port()
    env = {**os.environ, "RAY_TMPDIR": ray_dir, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    log = work / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gravityocr.cli", "serve", "--config", str(work / "serve.yaml"),
             "--model", str(model), "--port", str(port), "--address", "local"],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    started = {"process": process, "url": f"http://127.0.0.1:{port}", "log": log,
               "processes": lambda: cluster_processes(ray_dir, [process.pid])}
    try:
        yield started
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                pass
        stop_processes(started["processes"], grace_seconds=5)  # whatever a failed test left
        if process.poll() is None:
            process.wait(10)
        shutil.rmtree(ray_dir, ignore_errors=True)


def _stopped_within(started: dict, seconds: float = STOP_WITHIN_S) -> tuple[int, float]:
    """(exit status, seconds) of the command after a signal; fails past `seconds`."""
    begun = time.monotonic()
    try:
        code = started["process"].wait(seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gravityocr serve still ran {seconds} s after one signal:\n{_log_tail(started['log'])}")
    return code, time.monotonic() - begun


def _assert_nothing_left(started: dict) -> None:
    """Ray's processes stop with the command (the local Ray it started ends them)."""
    deadline = time.monotonic() + 20
    while started["processes"]() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = started["processes"]()
    assert not left, f"left running after gravityocr serve exited: {describe(left)}"


def _wait_ready(started: dict) -> None:
    """Until the command answers /readyz (its model loaded); fails if it exits or takes 300 s."""
    process, log = started["process"], started["log"]
    deadline = time.monotonic() + 300
    while True:
        assert process.poll() is None, f"gravityocr serve exited ({process.returncode}):\n{_log_tail(log)}"
        try:
            if httpx.get(f"{started['url']}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"gravityocr serve never became ready:\n{_log_tail(log)}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def serve_process(tmp_path_factory):
    """The command, with the tiny model, once it answers /readyz."""
    with _serve_command(tmp_path_factory.mktemp("serve-cli")) as started:
        _wait_ready(started)
        yield started


def _readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


@pytest.mark.skipif(not has_weights(default_model_path()), reason="no default model in model/default")
@pytest.mark.timeout(900)
def test_readme_requests_work_as_written(tmp_path, s3_endpoint):
    """Every request of the README's HTTP section, run by bash as written (only the port
    changed) against `gravityocr serve` with the shipped model and config, plus the one
    setting the README names for the `uri` example (`allowed_buckets: [inbox]`, here read
    from a real S3 endpoint holding s3://inbox/scan.pdf): each answers 200 with what the
    README says it holds, the table's HTML closed."""
    section = _readme_section("Using the HTTP API")
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert blocks
    assert "`allowed_buckets: [inbox]`" in section
    scan = io.BytesIO()
    Image.open(REPO / "samples" / "scanned.jpg").convert("RGB").save(scan, "PDF", resolution=150)
    s3 = s3_endpoint.client()
    s3.create_bucket(Bucket="inbox")
    s3.put_object(Bucket="inbox", Key="scan.pdf", Body=scan.getvalue())
    settings = {"allowed_buckets": ["inbox"], "s3_endpoint_url": s3_endpoint.url}
    calls = tmp_path / "calls"
    calls.mkdir()
    with _serve_command(tmp_path, default_model_path(), settings) as started:
        _wait_ready(started)
        # `curl` records its arguments, the status and the body of each request, then does it
        shim = ('n=0; curl() { n=$((n+1)); printf "%s\\0" "$@" > "$CALLS/$n.args"; '
                'command curl -o "$CALLS/$n.body" -w "%{http_code}" "$@" > "$CALLS/$n.status"; }\n')
        script = shim + "\n".join(blocks).replace(README_URL, started["url"])
        subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env={**os.environ, "CALLS": str(calls)},
                       check=True, timeout=600)
        url = started["url"]
    requests = []
    for number in range(1, len(list(calls.glob("*.args"))) + 1):
        args = (calls / f"{number}.args").read_bytes().decode().split("\0")[:-1]
        requests.append((args, int((calls / f"{number}.status").read_text()), (calls / f"{number}.body").read_text()))
    routes = [next(a for a in args if a.startswith(url))[len(url):] for args, _, _ in requests]
    assert routes == ["/v1/ocr"] * 3 + ["/v1/chat/completions"] * 3
    for args, status, body in requests:
        assert status == 200, (args[:3], body)

    (upload, _, _), (document, _, _), (uri, _, _) = requests[:3]
    assert upload[upload.index("-F") + 1] == "file=@samples/report.pdf"
    assert json.loads(document[document.index("-d") + 1]).keys() == {"filename", "document"}
    assert json.loads(uri[uri.index("-d") + 1]) == {"uri": "s3://inbox/scan.pdf"}
    for (_, _, body), expected_id in zip(requests[:3], ["report.pdf", "notice.png", "s3://inbox/scan.pdf"]):
        answer = OcrResponse.model_validate_json(body)
        assert answer.document_id == expected_id and answer.page_count == len(answer.pages) >= 1
        assert answer.markdown.strip() and all(page.markdown.strip() for page in answer.pages)
        assert all(page.result["regions"] for page in answer.pages) and answer.document["pages"]
        stats = json.loads(body)["stats"]
        assert isinstance(stats["committed_tokens"], int) and isinstance(stats["forward_passes"], int)
        assert stats["committed_tokens"] > 0

    for (args, _, body), task in zip(requests[3:], ["text", "table", "formula"]):
        chat = json.loads(args[args.index("-d") + 1])
        (message,) = chat["messages"]
        image, prompt = message["content"]
        assert image["type"] == "image_url" and image["image_url"]["url"].startswith("data:image/png;base64,")
        assert prompt == {"type": "text", "text": TASK_PROMPTS[task]}
        answer = ChatCompletionResponse.model_validate_json(body)
        assert json.loads(body)["gravityocr"]["task"] == task
        content = answer.choices[0].message["content"]
        assert answer.choices[0].message["role"] == "assistant" and content.strip(), body
        assert answer.usage["completion_tokens"] >= 1
        if task == "table":  # one table, however the model ended it
            assert content.startswith("<table>") and content.endswith("</table>") and parse_table(content)
            # its prompt and the shipped cap need more than the 2048-token slot serve once had
            shipped_cap = yaml.safe_load(DEFAULT_CONFIG.read_text())["applications"][0]["args"]["max_new_tokens"]
            assert answer.usage["prompt_tokens"] + shipped_cap > 2048


def test_readme_fresh_machine_section_keeps_two_commands():
    blocks = re.findall(r"```bash\n(.*?)```", _readme_section("On a fresh machine (Python 3.11)"), re.S)
    assert len(blocks) == 2 and all(len(block.strip().splitlines()) == 1 for block in blocks)


def test_first_sigint_stops_serve_and_every_process_it_started(serve_process):
    """One SIGINT while requests are being read (Serve's graceful shutdown waits for those):
    the command exits, and nothing it started is left."""
    process, log = serve_process["process"], serve_process["log"]
    assert process.poll() is None and serve_process["processes"](), "serve and its Ray are running"
    document = (REPO / "samples" / "report.pdf").read_bytes()
    answered, stop_posting = [], threading.Event()

    def keep_posting():
        while not stop_posting.is_set():
            try:
                response = httpx.post(f"{serve_process['url']}/v1/ocr", timeout=120,
                                      files={"file": ("report.pdf", document, "application/pdf")})
                answered.append(response.status_code)
            except httpx.HTTPError:
                return  # the server went away mid-request, as it should

    clients = [threading.Thread(target=keep_posting, daemon=True) for _ in range(4)]
    for client in clients:
        client.start()
    deadline = time.monotonic() + 60
    while not answered and time.monotonic() < deadline:
        time.sleep(0.1)
    assert answered == [200] * len(answered) and answered, answered
    process.send_signal(signal.SIGINT)  # once
    try:
        code, took = _stopped_within(serve_process)
    finally:
        stop_posting.set()
    for client in clients:
        client.join(30)
    assert code == 0, _log_tail(log)
    assert "SIGINT received, stopping" in log.read_text()
    _assert_nothing_left(serve_process)
    print(f"gravityocr serve exited {took:.1f} s after SIGINT")


def test_first_sigterm_while_the_model_loads_stops_everything(tmp_path):
    """SIGTERM once Serve runs but before the app is up (the replica still loading the
    model): the command stops without waiting for the app."""
    with _serve_command(tmp_path) as started:
        process, log = started["process"], started["log"]
        deadline = time.monotonic() + 300
        while "Started Serve" not in log.read_text(errors="replace"):
            assert process.poll() is None, _log_tail(log)
            assert time.monotonic() < deadline, _log_tail(log)
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        code, took = _stopped_within(started)
        assert code == 0, _log_tail(log)
        assert "SIGTERM received, stopping" in log.read_text() and "Traceback" not in log.read_text(), _log_tail(log)
        assert "is serving" not in log.read_text()  # it stopped before the app was up
        _assert_nothing_left(started)
        print(f"gravityocr serve exited {took:.1f} s after SIGTERM")
