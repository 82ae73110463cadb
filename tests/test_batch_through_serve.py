"""`gravityocr batch --serve-app`: the nightly job reads its pages through the replicas of a
running `gravityocr serve` (one pool of engines), on the test session's real local Ray
cluster, with real HTTP requests beside it. What it writes is what the job's own engine
actors write; online requests keep answering; Serve's autoscaling scales up for the job and
down after it; a replica killed mid-job loses and duplicates nothing."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from gravityocr.corpus import synthetic_pages
from gravityocr.model.network.loading import Recognizer, save_recognizer
from gravityocr.pipelines.batch_cli import EXIT_DOCUMENTS_FAILED
from gravityocr.pipelines.batch_job import BatchJobConfig, run_batch_job
from ports import free_port
from ray_cluster import processes_mentioning

pytestmark = pytest.mark.timeout(900)

APP = "gravityocr"  # the application `gravityocr serve` runs
PAGES = 6
MAX_NEW_TOKENS = 48


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, trained_tiny_model, processor):
    """The tiny model that writes its memorised lines and stops: pages read in seconds."""
    directory = tmp_path_factory.mktemp("model")
    save_recognizer(Recognizer(trained_tiny_model.to(torch.float32), processor), directory)
    trained_tiny_model.to(torch.float64)
    return str(directory)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """PAGES one-page documents and one that cannot be read (an error row, exit code 3)."""
    directory = tmp_path_factory.mktemp("corpus")
    for index, page in enumerate(synthetic_pages.sample_pages(PAGES, seed=20)):
        page.image.save(directory / f"page-{index:02d}.png")
    (directory / "empty.pdf").write_bytes(b"")
    return directory


def _serve_config(port: int) -> dict:
    """serve_config.yaml's shape, small: two lanes' room on a replica (max_ongoing_requests 8 =
    4 online + the job's 2 pages x 2 replicas), and autoscaling that reacts in seconds."""
    return {
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{
            "name": APP, "route_prefix": "/", "import_path": "gravityocr.serve.app:app_builder",
            "args": {"max_new_tokens": MAX_NEW_TOKENS, "max_concurrent_requests": 4, "batch_pages_per_replica": 2,
                     "threads": 1},
            "deployments": [{
                "name": "OcrService", "max_ongoing_requests": 8, "max_queued_requests": 16,
                "autoscaling_config": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2,
                                       "metrics_interval_s": 0.5, "look_back_period_s": 1,
                                       "upscale_delay_s": 0.5, "downscale_delay_s": 2},
                "ray_actor_options": {"num_cpus": 0.5},
            }],
        }],
    }


@pytest.fixture(scope="module")
def serving(ray_cluster, model_dir, tmp_path_factory):
    """`gravityocr serve` on the session's cluster, as a person starts it; Ctrl-C stops it."""
    port = free_port()
    config = tmp_path_factory.mktemp("serve") / "serve_config.yaml"
    config.write_text(yaml.safe_dump(_serve_config(port)))
    command = [sys.executable, "-m", "gravityocr.cli", "serve", "--address", ray_cluster.address,
               "--config", str(config), "--model", model_dir]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 240
        while not any("is serving" in line for line in lines):
            assert server.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


@pytest.fixture(scope="module")
def standalone(ray_cluster, model_dir, pages, tmp_path_factory):
    """The same pages read by the job's own engine actors: what the job through Serve must write."""
    output = tmp_path_factory.mktemp("standalone")
    summary = run_batch_job(BatchJobConfig(str(pages), str(output), address=ray_cluster.address, min_actors=1,
                                           max_actors=1, model=model_dir, pages_per_batch=2,
                                           max_new_tokens=MAX_NEW_TOKENS))
    assert summary.pages == PAGES and summary.documents_failed == 1 and summary.engine == "actors"
    return output


def _batch_command(ray_cluster, pages, output, *extra) -> list[str]:
    return [sys.executable, "-m", "gravityocr.cli", "batch", str(pages), str(output), "--address",
            ray_cluster.address, "--pages-per-batch", "2", *extra]


def _outputs(output) -> tuple[dict, list[dict]]:
    """The markdown files (bytes) and the page rows, but for what differs between any two runs:
    the node that read each page and the page's timings."""
    markdown = {p.relative_to(output).as_posix(): p.read_bytes() for p in (output / "markdown").rglob("*")
                if p.is_file()}
    rows = []
    for file in sorted((output / "pages").rglob("*.parquet")):
        for row in pq.read_table(file).to_pylist():
            regions = json.loads(row.pop("regions_json"))
            if regions:  # None: a document that could not be read
                regions.pop("seconds")
            rows.append({**{k: v for k, v in row.items() if k != "node_id"}, "regions": regions})
    return markdown, sorted(rows, key=lambda r: r["document_id"])


def _replicas() -> int:
    """OcrService replicas starting or running (the autoscaler's decision)."""
    from ray import serve

    states = serve.status().applications[APP].deployments["OcrService"].replica_states
    return sum(count for state, count in states.items() if str(getattr(state, "value", state)) in
               ("STARTING", "RUNNING", "UPDATING"))


def test_engine_flags_are_refused_with_serve_app(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gravityocr.cli", "batch", str(tmp_path), str(tmp_path / "out"),
                           "--serve-app", "--model", "x", "--block-size", "8"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "--model, --block-size set up the job's own engine actors" in done.stderr
    assert "'gravityocr' reads the pages with its own settings" in done.stderr


def test_the_job_reads_through_serve_beside_online_requests(ray_cluster, serving, standalone, pages, tmp_path):
    """Outputs identical to the job's own actors', `_summary.json` names the Serve engine,
    every online request answers 200 meanwhile, replicas scale up for the job and down after."""
    output = tmp_path / "through-serve"
    page_png = io.BytesIO()
    synthetic_pages.sample_pages(1, seed=3)[0].image.save(page_png, format="PNG")
    statuses: list[int] = []
    replicas_seen: list[int] = []
    job = subprocess.Popen(_batch_command(ray_cluster, pages, output, "--serve-app"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)

    def online():
        with httpx.Client(timeout=120) as client:
            while job.poll() is None:
                answer = client.post(f"{serving}/v1/ocr", files={"file": ("page.png", page_png.getvalue(), "image/png")})
                statuses.append(answer.status_code)

    def watch_replicas():
        while job.poll() is None:
            replicas_seen.append(_replicas())
            time.sleep(0.5)

    threads = [threading.Thread(target=online), threading.Thread(target=watch_replicas)]
    for thread in threads:
        thread.start()
    stdout, stderr = job.communicate(timeout=600)
    for thread in threads:
        thread.join(timeout=180)
    assert job.returncode == EXIT_DOCUMENTS_FAILED, stderr[-3000:]  # empty.pdf, an error row as ever
    assert statuses and set(statuses) == {200}, statuses
    assert max(replicas_seen) == 2, replicas_seen  # the job's pages alone take the deployment to max_replicas
    summary = json.loads((output / "_summary.json").read_text())
    assert summary["engine"] == f"serve:{APP}" and summary["pages"] == PAGES and summary["documents_failed"] == 1
    assert "read by: serve:gravityocr" in stdout
    assert _outputs(output) == _outputs(standalone)
    deadline = time.monotonic() + 90
    while _replicas() > 1:  # and back down once it is over
        assert time.monotonic() < deadline, "the deployment did not scale down after the job"
        time.sleep(1)


def test_a_replica_killed_mid_job_loses_and_duplicates_nothing_and_resume_redoes_only_the_missing(
        ray_cluster, serving, standalone, pages, tmp_path):
    import os

    output = tmp_path / "killed"
    job = subprocess.Popen(_batch_command(ray_cluster, pages, output, "--serve-app", APP), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and job.poll() is None and time.monotonic() < deadline:
        replicas = processes_mentioning(f"ServeReplica:{APP}:OcrService")
        if replicas and (output / "pages").exists() and any((output / "pages").rglob("*.parquet")):
            os.kill(replicas[0], signal.SIGKILL)  # a crash, not a polite shutdown
            killed = replicas[0]
        time.sleep(0.2)
    stdout, stderr = job.communicate(timeout=600)
    assert killed is not None, "the job finished before a replica could be killed"
    assert job.returncode == EXIT_DOCUMENTS_FAILED, stderr[-3000:]
    files = sorted((output / "pages").rglob("*.parquet"))
    assert len(files) == PAGES + 1  # and empty.pdf's error row
    assert _outputs(output) == _outputs(standalone)
    # --resume through Serve: only what is not complete is read again
    (output / "markdown" / "page-03.png.md").unlink()
    done = subprocess.run(_batch_command(ray_cluster, pages, output, "--serve-app", "--resume"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == EXIT_DOCUMENTS_FAILED, done.stderr[-3000:]
    summary = json.loads((output / "_summary.json").read_text())
    assert (summary["documents_skipped"], summary["pages"]) == (PAGES - 1, 1)  # page-03 and empty.pdf tried again
    assert _outputs(output) == _outputs(standalone)


def test_a_missing_application_is_one_clear_line(ray_cluster, serving, pages, tmp_path):
    done = subprocess.run(_batch_command(ray_cluster, pages, tmp_path / "out", "--serve-app", "nightly"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "no Serve application 'nightly' on this Ray cluster" in done.stderr
    assert not (tmp_path / "out" / "pages").exists() and not (tmp_path / "out" / "_summary.json").exists()
