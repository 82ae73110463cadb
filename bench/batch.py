"""`gravityocr bench batch`: pages/s of the batch job for 1 and 2 engine actors, AR vs
self-speculative, on the same input in one run, and the job's peak memory.

Peak memory is the largest total resident memory, sampled every 0.2 s, of the driver and
every process of the local Ray session the bench starts (raylet, workers, actors).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from gravityocr.model.decode.flags import add_model_argument
from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.corpus import synthetic_pages
from gravityocr.pipelines.batch_job import BatchJobConfig, run_batch_job


def rss_bytes(pid: int) -> int:
    """The process's resident memory in bytes; 0 once it has gone."""
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _session_pids(marker: str) -> list[int]:
    pids = [os.getpid()]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if marker.encode() in handle.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


class PeakMemory:
    def __init__(self, marker: str):
        self.marker, self.peak, self._stop = marker, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(rss_bytes(pid) for pid in _session_pids(self.marker)))
            time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# Bench modes: the job's decoding settings. "spec" is the product's default (on a CPU, AR
# rounds past a few regions); "spec-all" speculates at every batch size.
MODES = {"ar": DecodeSettings(mode="ar"), "spec": DecodeSettings(), "spec-all": DecodeSettings(speculative_max_batch=0)}


def make_input(directory: Path, pages: int, seed: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for index, page in enumerate(synthetic_pages.sample_pages(pages, seed=seed)):
        page.image.save(directory / f"page-{index:03d}.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gravityocr bench batch", description=__doc__)
    parser.add_argument("--input", help="folder of documents (default: generated pages)")
    parser.add_argument("--pages", type=int, default=8, help="generated pages when --input is absent")
    add_model_argument(parser)
    parser.add_argument("--actors", default="1,2")
    parser.add_argument("--modes", default="ar,spec", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")

    import ray

    work = Path(tempfile.mkdtemp(prefix="gravityocr-bench-batch-"))
    source = Path(args.input) if args.input else work / "input"
    if not args.input:
        make_input(source, args.pages, seed=100)
    ray_temp = str(work / "ray")
    ray.init(_temp_dir=ray_temp, log_to_driver=False, include_dashboard=False)
    rows = []
    try:
        for actors in [int(a) for a in args.actors.split(",")]:
            for mode in args.modes.split(","):
                output = work / f"out-{actors}-{mode}"
                with PeakMemory(ray_temp) as memory:
                    summary = run_batch_job(BatchJobConfig(str(source), str(output), min_actors=actors,
                                                           max_actors=actors, decode=MODES[mode], model=args.model,
                                                           max_new_tokens=args.max_new_tokens))
                rows.append({"actors": actors, "mode": mode, "pages": summary.pages, "seconds": round(summary.seconds, 2),
                             "pages_per_second": round(summary.pages_per_second, 4), "tpf": round(summary.tpf, 3),
                             "page_errors": summary.page_errors, "peak_memory_mib": round(memory.peak / 2**20)})
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    for actors in sorted({r["actors"] for r in rows}):
        by_mode = {r["mode"]: r for r in rows if r["actors"] == actors}
        for mode in ("spec", "spec-all"):
            if "ar" in by_mode and mode in by_mode and by_mode["ar"]["pages_per_second"]:
                by_mode[mode]["speedup_vs_ar"] = round(by_mode[mode]["pages_per_second"] / by_mode["ar"]["pages_per_second"], 3)
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        print(f"{'actors':>6} {'mode':>8} {'pages':>5} {'s':>8} {'pages/s':>8} {'TPF':>6} {'peak MiB':>9} {'spec/AR':>8}")
        for r in rows:
            print(f"{r['actors']:>6} {r['mode']:>8} {r['pages']:>5} {r['seconds']:>8} {r['pages_per_second']:>8} "
                  f"{r['tpf']:>6} {r['peak_memory_mib']:>9} {r.get('speedup_vs_ar', ''):>8}")
    return 0
