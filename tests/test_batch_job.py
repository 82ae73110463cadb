"""`gravityocr batch` on a real local Ray cluster (two raylets) and a real S3 endpoint."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest
import ray
import torch
from PIL import Image

from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.model.network.loading import Recognizer, save_recognizer
from gravityocr.corpus import synthetic_pages
from gravityocr.pipelines.assembly import PageResult, document_markdown
from gravityocr.pipelines.batch_job import BatchJobConfig, run_batch_job
from gravityocr.pipelines.batch_rows import PAGE_SCHEMA
from gravityocr.pipelines.batch_stages import region_decode_stats
from ray_cluster import processes_mentioning


pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, trained_tiny_model, processor):
    """The tiny model that writes its memorised lines and stops: pages read in seconds."""
    directory = tmp_path_factory.mktemp("model")
    save_recognizer(Recognizer(trained_tiny_model.to(torch.float32), processor), directory)
    trained_tiny_model.to(torch.float64)
    return str(directory)


def _png(page) -> bytes:
    buffer = io.BytesIO()
    page.image.save(buffer, format="PNG")
    return buffer.getvalue()


def clean_documents() -> dict[str, bytes]:
    # Fresh page images per format: PIL keeps encoder settings on an image it saved as PDF,
    # and a later multi-frame TIFF save of the same objects fails.
    return {
        "reports/three-pages.pdf": synthetic_pages.pdf_bytes(synthetic_pages.sample_pages(3, seed=1)),
        "scans/two-frames.tiff": synthetic_pages.tiff_bytes(synthetic_pages.sample_pages(2, seed=4)),
        "one.png": _png(synthetic_pages.table_formula_page(seed=5)),  # a figure on it, as on the PDF's page 3
    }


def bad_documents() -> dict[str, bytes]:
    png = _png(synthetic_pages.sample_pages(1, seed=2)[0])
    pdf = synthetic_pages.pdf_bytes(synthetic_pages.sample_pages(1, seed=3))
    return {"bad/corrupt.png": png[: len(png) // 3], "bad/truncated.pdf": pdf[: len(pdf) // 2], "bad/empty.pdf": b""}


def _read_page_rows(s3, bucket, prefix):
    rows = []
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        if item["Key"].endswith(".parquet"):
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            rows.extend(pq.read_table(io.BytesIO(body)).to_pylist())
    return rows


def test_s3_to_s3_on_two_raylets_with_bad_documents(ray_cluster, s3_endpoint, model_dir):
    s3 = s3_endpoint.client()
    s3.create_bucket(Bucket="corpus")
    documents = {**clean_documents(), **bad_documents()}
    for key, body in documents.items():
        s3.put_object(Bucket="corpus", Key=f"incoming/{key}", Body=body)

    summary = run_batch_job(BatchJobConfig(
        input_uri="s3://corpus/incoming", output_uri="s3://corpus/results", endpoint_url=s3_endpoint.url,
        address=ray_cluster.address, min_actors=2, max_actors=2, model=model_dir, pages_per_batch=1,
        max_new_tokens=48, actor_resources={ray_cluster.node_resource: 1},
    ))

    assert summary.documents == 6 and summary.documents_failed == 3
    assert summary.pages == 6  # 3 + 2 + 1 good pages
    assert {e["document_id"] for e in summary.errors} == set(bad_documents())
    assert {e["reason"] for e in summary.errors} <= {"corrupt", "empty_file", "no_pages", "unreadable"}
    rows = _read_page_rows(s3, "corpus", "results/pages/")
    good = [r for r in rows if r["error_reason"] is None]
    assert sorted((r["document_id"], r["page_number"]) for r in good) == sorted(
        [("reports/three-pages.pdf", n) for n in (1, 2, 3)] + [("scans/two-frames.tiff", n) for n in (1, 2)]
        + [("one.png", 1)])
    assert all(r["markdown"] and r["committed_tokens"] > 0 for r in good)
    stats = [region for r in good for region in region_decode_stats(r["regions_json"])]
    assert summary.speculative_rounds == sum(len(region["accepted_per_round"]) for region in stats)
    # a page's crops decode together, and the product's default speculates at every batch size
    assert summary.ar_rounds == sum(region["ar_rounds"] for region in stats) == 0
    assert summary.speculative_rounds > 0
    assert {r["document_id"] for r in rows if r["error_reason"]} == set(bad_documents())
    # Each raylet offers one unit of the actors' custom resource, so the two actors sit on
    # different raylets; which of them reads which page is Ray Data's choice (a fast actor may
    # read them all), so the pages are only checked to come from the cluster's raylets.
    raylets = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert len(raylets) == 2 and {r["node_id"] for r in good} <= raylets
    written = {o["Key"] for o in s3.list_objects_v2(Bucket="corpus", Prefix="results/markdown/")["Contents"]}
    markdown = {key for key in written if key.endswith(".md")}
    assert markdown == {f"results/markdown/{key}.md" for key in clean_documents()}
    three = s3.get_object(Bucket="corpus", Key="results/markdown/reports/three-pages.pdf.md")["Body"].read().decode()
    assert three.index("<!-- page 1 -->") < three.index("<!-- page 2 -->") < three.index("<!-- page 3 -->")
    # the driver's document markdown is assembly's, from the pages' JSON in the Parquet rows
    pages = sorted((r for r in good if r["document_id"] == "reports/three-pages.pdf"), key=lambda r: r["page_number"])
    assert three == document_markdown([PageResult.from_dict(json.loads(r["regions_json"])) for r in pages],
                                      figure_prefix="three-pages.pdf_figures/")
    # a figure crop is written beside its document's markdown, which links it relatively;
    # nothing else is written under markdown/, and the crops never go into the Parquet rows
    one = s3.get_object(Bucket="corpus", Key="results/markdown/one.png.md")["Body"].read().decode()
    assert re.findall(r"!\[figure\]\(([^)]*)\)", one) == ["one.png_figures/p1-r6.png"]
    assert re.findall(r"!\[figure\]\(([^)]*)\)", three) == ["three-pages.pdf_figures/p3-r6.png"]
    assert written - markdown == {"results/markdown/one.png_figures/p1-r6.png",
                                  "results/markdown/reports/three-pages.pdf_figures/p3-r6.png"}
    figure = Image.open(io.BytesIO(s3.get_object(Bucket="corpus", Key="results/markdown/one.png_figures/p1-r6.png")
                                   ["Body"].read()))
    assert figure.size[0] > 50
    assert all(set(r) == set(PAGE_SCHEMA.names) for r in rows)
    assert s3.get_object(Bucket="corpus", Key="results/_summary.json")["Body"].read()


def _many_pages(directory, count):
    directory.mkdir()
    for index, page in enumerate(synthetic_pages.sample_pages(count, seed=10)):
        page.image.save(directory / f"page-{index:02d}.png")


def _page_files(output):
    return sorted(p.relative_to(output) for p in (output / "pages").rglob("*.parquet"))


def test_killed_engine_actor_loses_and_duplicates_nothing(ray_cluster, model_dir, tmp_path):
    import ray

    source, output = tmp_path / "in", tmp_path / "out"
    _many_pages(source, 8)
    result = {}
    job = threading.Thread(target=lambda: result.update(summary=run_batch_job(BatchJobConfig(
        str(source), str(output), address=ray_cluster.address, min_actors=2, max_actors=2, model=model_dir,
        pages_per_batch=1, max_new_tokens=48, decode=DecodeSettings(speculative_max_batch=0)))))
    job.start()
    killed = None
    deadline = time.monotonic() + 240
    while killed is None and job.is_alive() and time.monotonic() < deadline:
        # Ray titles an actor's worker process after its class: ray::MapWorker(MapBatches(PageReader))
        readers = processes_mentioning("PageReader")
        if readers and (output / "pages").exists() and _page_files(output):
            os.kill(readers[0], signal.SIGKILL)  # a crash, not a polite shutdown
            killed = readers[0]
        time.sleep(0.2)
    job.join(timeout=300)
    assert killed is not None, "the job finished before an engine actor could be killed"
    summary = result["summary"]
    assert summary.pages == 8 and summary.documents_failed == 0
    assert summary.speculative_rounds > 0 and summary.ar_rounds == 0  # speculating at every batch size
    files = _page_files(output)
    assert len(files) == 8 and len(set(files)) == 8
    rows = [row for f in files for row in pq.read_table(output / f).to_pylist()]
    assert sorted(r["document_id"] for r in rows) == sorted(f"page-{i:02d}.png" for i in range(8))
    assert len(list((output / "markdown").glob("*.md"))) == 8
    assert ray.is_initialized()


def test_interrupted_job_resumes_without_redoing_finished_documents(ray_cluster, model_dir, tmp_path):
    source, output = tmp_path / "in", tmp_path / "out"
    _many_pages(source, 8)
    command = [sys.executable, "-m", "gravityocr.cli", "batch", str(source), str(output), "--address",
               ray_cluster.address, "--model", model_dir, "--min-actors", "1", "--max-actors", "1",
               "--pages-per-batch", "1", "--max-new-tokens", "48"]
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and driver.poll() is None:
            if (output / "markdown").exists() and len(list((output / "markdown").glob("*.md"))) >= 2:
                break
            time.sleep(0.1)
    finally:
        driver.kill()
        driver.wait(timeout=60)
    finished_before = {p.name: p.stat().st_mtime_ns for p in (output / "markdown").glob("*.md")}
    assert 2 <= len(finished_before) < 8, "the interruption must leave the job part way"

    summary = run_batch_job(BatchJobConfig(str(source), str(output), address=ray_cluster.address, resume=True,
                                           model=model_dir, pages_per_batch=1, max_new_tokens=48))
    assert summary.documents_skipped == len(finished_before)
    assert summary.pages == 8 - len(finished_before)
    after = {p.name: p.stat().st_mtime_ns for p in (output / "markdown").glob("*.md")}
    assert len(after) == 8
    assert all(after[name] == mtime for name, mtime in finished_before.items()), "finished documents were redone"
    files = _page_files(output)
    assert len(files) == 8 and len(set(files)) == 8


def test_a_run_with_a_bad_document_prints_progress_and_exits_non_zero(ray_cluster, model_dir, tmp_path):
    """The CLI tells a person what it does as documents finish (stderr), and a job in which a
    document failed exits with its documented code after the summary, its good outputs written."""
    from gravityocr.pipelines.batch_cli import EXIT_DOCUMENTS_FAILED

    source, output = tmp_path / "in", tmp_path / "out"
    source.mkdir()
    (source / "good.png").write_bytes(_png(synthetic_pages.sample_pages(1, seed=4)[0]))
    (source / "empty.pdf").write_bytes(b"")
    command = [sys.executable, "-m", "gravityocr.cli", "batch", str(source), str(output), "--address",
               ray_cluster.address, "--model", model_dir, "--max-actors", "1", "--max-new-tokens", "32"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == EXIT_DOCUMENTS_FAILED != 0, done.stderr[-2000:]
    progress = [line for line in done.stderr.splitlines() if line.startswith("batch: ")]
    assert any(line.endswith("empty.pdf FAILED") for line in progress)
    assert any("good.png" in line and "FAILED" not in line for line in progress)
    assert progress[-1].startswith("batch: 2/2 documents (1 failed), 1 pages")
    assert "documents: 2 (1 failed" in done.stdout and "1 of 2 documents failed" in done.stderr
    assert (output / "markdown/good.png.md").exists() and not (output / "markdown/empty.pdf.md").exists()
    ray_data_notes = [line for line in done.stderr.splitlines() if "streaming_executor" in line
                      or "Progress bars disabled" in line or "issue_detector" in line]
    assert not ray_data_notes, "Ray Data's INFO and WARNING records are for its log file, not the console"
