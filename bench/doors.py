"""The same pages through each door a user has, in one run: `gravityocr ocr` (in-process, no
cluster), `gravityocr batch` (a local Ray cluster and its engine actors) and `gravityocr serve`
(`POST /v1/ocr`), each run as a user runs it, a command in its own process.

Each door reads the pages as one multi-page TIFF, and that TIFF's first page alone; seconds per
page = (all pages - the first alone) / (pages - 1), so what a door pays once (a process start,
Ray's start, loading the model, the first pass) is left out and its steady cost a page remains.
Each door reads the first page once before it is timed (the commands from a cold disk cache and
a Ray that starts for the first time, serve's first request), so both timed runs find the same
warm machine. The regions' text each door returns is compared: the doors read the same pages
the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pyarrow.parquet as pq
from PIL import Image

from gravityocr.bench.serve import free_port

DOORS = ("ocr", "batch", "serve")
READY_WITHIN_S = 300


@dataclass
class DoorFigures:
    door: str
    seconds_first_page: float = 0.0
    seconds_all_pages: float = 0.0
    region_texts: list[str] = field(default_factory=list)  # every page's regions, in reading order
    skipped: str | None = None

    def row(self, pages: int) -> dict:
        if self.skipped:
            return {"door": self.door, "skipped": self.skipped}
        steady = (self.seconds_all_pages - self.seconds_first_page) / max(1, pages - 1)
        return {"door": self.door, "s_per_page": round(steady, 3), "seconds_all_pages": round(self.seconds_all_pages, 2),
                "seconds_first_page": round(self.seconds_first_page, 2)}


def _write_tiff(images: list[Image.Image], path: Path) -> Path:
    images[0].save(path, save_all=True, append_images=images[1:], compression="tiff_deflate")
    return path


def _document_region_texts(document: dict) -> list[str]:
    return [region["text"] for page in document["pages"] for region in page["regions"]]


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gravityocr.cli", *args]


def _run(command: list[str], env: dict) -> float:
    """Seconds the command took; a failure stops the bench with the command's last words."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[2:])} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds


def run_ocr(first: Path, every: Path, model: str, work: Path, env: dict) -> DoorFigures:
    figures = DoorFigures("ocr")
    out = work / "ocr"
    _run(_command("ocr", str(first), "--model", model, "--out", str(out / "warm-up"), "--no-progress"), env)
    figures.seconds_first_page = _run(_command("ocr", str(first), "--model", model, "--format", "json", "--out",
                                               str(out / "first"), "--no-progress"), env)
    figures.seconds_all_pages = _run(_command("ocr", str(every), "--model", model, "--format", "json", "--out",
                                              str(out / "all"), "--no-progress"), env)
    document = json.loads((out / "all" / f"{every.name}.json").read_text())
    figures.region_texts = _document_region_texts(document)
    return figures


def run_batch(first: Path, every: Path, model: str, work: Path, env: dict) -> DoorFigures:
    figures = DoorFigures("batch")
    seconds = []
    for name, document in (("warm-up", first), ("first", first), ("all", every)):
        source = work / f"batch-in-{name}"
        source.mkdir()
        shutil.copy(document, source / every.name)
        seconds.append(_run(_command("batch", str(source), str(work / f"batch-out-{name}"), "--model", model), env))
    _, figures.seconds_first_page, figures.seconds_all_pages = seconds
    pages = sorted((work / "batch-out-all" / "pages" / every.name).glob("page-*.parquet"))
    for path in pages:
        for row in pq.read_table(path).to_pylist():
            figures.region_texts += [region["text"] for region in json.loads(row["regions_json"])["regions"]]
    return figures


@contextlib.contextmanager
def _serve(model: str, work: Path, env: dict):
    """`gravityocr serve` on its shipped config, a local Ray of its own, until it answers
    /readyz; stopped by one SIGINT on the way out (its process group killed if it lingers)."""
    port = free_port()
    ray_dir = tempfile.mkdtemp(prefix="gocr-doors-", dir="/tmp")  # short: Ray's socket paths live under it
    log = open(work / "serve.log", "wb")
    process = subprocess.Popen(_command("serve", "--model", model, "--port", str(port), "--address", "local"),
                               env={**env, "RAY_TMPDIR": ray_dir}, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_WITHIN_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"gravityocr serve exited {process.returncode}: see {work / 'serve.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"gravityocr serve not ready in {READY_WITHIN_S} s")
            time.sleep(0.5)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        log.close()
        shutil.rmtree(ray_dir, ignore_errors=True)


def run_serve(first: Path, every: Path, model: str, work: Path, env: dict) -> DoorFigures:
    figures = DoorFigures("serve")

    def post(client: httpx.Client, url: str, path: Path) -> tuple[float, dict]:
        start = time.perf_counter()
        response = client.post(f"{url}/v1/ocr", files={"file": (every.name, path.read_bytes(), "image/tiff")})
        seconds = time.perf_counter() - start
        if response.status_code != 200:
            raise RuntimeError(f"POST /v1/ocr answered {response.status_code}: {response.text[:2000]}")
        return seconds, response.json()

    with _serve(model, work, env) as url, httpx.Client(timeout=None) as client:
        post(client, url, first)  # warm-up: the replica's first pages
        figures.seconds_first_page, _ = post(client, url, first)
        figures.seconds_all_pages, answer = post(client, url, every)
    figures.region_texts = _document_region_texts(answer["document"])
    return figures


RUNNERS = {"ocr": run_ocr, "batch": run_batch, "serve": run_serve}


def measure_doors(images: list[Image.Image], model: str, doors: tuple[str, ...] = DOORS) -> dict:
    """Each door's seconds per page on `images` (two or more) and whether all read the same text."""
    if len(images) < 2:
        raise ValueError("the doors are measured on two pages or more")
    work = Path(tempfile.mkdtemp(prefix="gravityocr-bench-doors-"))
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    try:
        every = _write_tiff(images, work / "pages.tif")
        (work / "first").mkdir()
        first = _write_tiff(images[:1], work / "first" / "pages.tif")
        results = []
        for door in doors:
            try:
                results.append(RUNNERS[door](first, every, model, work, env))
            except RuntimeError as error:
                results.append(DoorFigures(door, skipped=str(error)))
        read = [r for r in results if not r.skipped]
        report = {"pages": len(images), "doors": [r.row(len(images)) for r in results],
                  "same_text": all(r.region_texts == read[0].region_texts for r in read) if read else None}
        by_door = {row["door"]: row for row in report["doors"] if "s_per_page" in row}
        if "ocr" in by_door and "batch" in by_door and by_door["batch"]["s_per_page"] > 0:
            report["ocr_vs_batch_s_per_page"] = round(by_door["ocr"]["s_per_page"] / by_door["batch"]["s_per_page"], 3)
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)
