"""`gravityocr bench lanes`: one pool of engines for the batch job and online requests,
measured side by side in one run on a local Ray.

With the same number of engines (--engines: Serve replicas, or the job's own actors), on the
same pages and the same model:
- online latency p50/p99 (chat completions of held-out crops, as `bench serve` sends them)
  at each --concurrency, alone, and again while `gravityocr batch --serve-app` reads pages
  through the same replicas;
- the batch job's pages/s through Serve's replicas against its own engine actors;
- during each job, the processes that hold a model (Serve replicas, the job's engine actors)
  and their peak resident memory: through Serve the replicas hold the only models; with its
  own actors beside a running service, there is a model per replica and another per actor.
The online levels also run beside the job on its own actors: the control, where the job
shares the cores but not the replica's engine. While online levels run beside a job, the
job is started again as often as it ends before they do; its figures are its first run's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

from gravityocr.model.decode.flags import add_model_argument
from gravityocr.bench.batch import rss_bytes, make_input
from gravityocr.bench.serve import REAL, chat_bodies, free_port, load_level
from gravityocr.pipelines.batch_job import BatchJobConfig, run_batch_job
from gravityocr.serve.app import build_app
from gravityocr.serve.settings import ServeSettings

APP = "gravityocr"
ACTORS_BESIDE, SERVE_BESIDE = "job on own actors", "job through serve"
ENGINE_PROCESSES = ("ServeReplica:", "MapBatches(PageReader)")  # how Ray titles the processes holding a model


class EngineMemory:
    """The most processes holding a model seen at once, and the peak of their total resident memory."""

    def __init__(self):
        self.processes, self.peak, self._stop = 0, 0, threading.Event()
        self.titles: set[str] = set()  # what the processes holding a model were called
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            holders = {int(entry.name): title for entry in Path("/proc").iterdir()
                       if entry.name.isdigit() and (title := _model_holder(entry))}
            pids = list(holders)
            self.titles.update(holders.values())
            self.processes = max(self.processes, len(pids))
            self.peak = max(self.peak, sum(rss_bytes(pid) for pid in pids))
            time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _model_holder(process: Path) -> str | None:
    """The process's title where it holds a model, else None."""
    try:
        command = (process / "cmdline").read_bytes()
    except OSError:
        return None
    if any(marker.encode() in command for marker in ENGINE_PROCESSES):
        return command.split(b"\0")[0].decode(errors="replace")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gravityocr bench lanes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_argument(parser)
    parser.add_argument("--data", default=str(REAL), help="manifest of crops the online requests send (default: data/real)")
    parser.add_argument("--input", help="folder of documents for the batch job (default: generated pages)")
    parser.add_argument("--pages", type=int, default=8, help="generated pages when --input is absent")
    parser.add_argument("--engines", type=int, default=1, help="Serve replicas, and the job's own actors (default: 1)")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--requests", type=int, default=48, help="online requests per level at most")
    parser.add_argument("--max-seconds", type=float, default=45, help="time per online level at most")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]

    import ray
    from ray import serve

    work = Path(tempfile.mkdtemp(prefix="gravityocr-bench-lanes-"))
    source = Path(args.input) if args.input else work / "input"
    if not args.input:
        make_input(source, args.pages, seed=100)
    bodies = chat_bodies(Path(args.data), 200)
    ray_temp = str(work / "ray")
    # Logical CPUs beyond the cores: the replicas, the job's actors and its CPU tasks must all
    # be placeable at once (they share the cores either way).
    ray.init(_temp_dir=ray_temp, num_cpus=8, log_to_driver=False, include_dashboard=False)
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    report: dict = {"engines": args.engines, "online": [], "jobs": []}
    try:
        settings = ServeSettings(model=args.model, threads=1, max_concurrent_requests=64, batch_pages_per_replica=4)
        serve.run(build_app(settings, {"num_replicas": args.engines, "max_ongoing_requests": 64 + 4 * args.engines,
                                       "ray_actor_options": {"num_cpus": 1}}), name=APP, route_prefix="/")
        load_level(url, bodies, 1, 2, 60)  # warm-up

        def job(name: str, config: BatchJobConfig, beside=None) -> None:
            """Run the job (again as long as `beside`, the online levels, still runs)."""
            summaries: list = []
            done = threading.Event()

            def run_jobs():
                runs = 0
                while not summaries or (beside and not done.is_set()):
                    runs += 1
                    output = f"{config.output_uri}-{len(report['jobs'])}-{runs}"
                    summaries.append(run_batch_job(dataclasses.replace(config, output_uri=output)))

            with EngineMemory() as engines:
                runner = threading.Thread(target=run_jobs)
                runner.start()
                if beside:
                    beside()
                    done.set()
                runner.join()
            summary = summaries[0]
            report["jobs"].append({
                "job": name, "engine": summary.engine, "pages": summary.pages, "seconds": round(summary.seconds, 2),
                "pages_per_second": round(summary.pages_per_second, 4), "page_errors": summary.page_errors,
                "runs": len(summaries), "model_processes": engines.processes, "model_holders": sorted(engines.titles),
                "model_processes_peak_mib": round(engines.peak / 2**20)})

        common = dict(input_uri=str(source), model=args.model)
        own_actors = BatchJobConfig(**common, output_uri=str(work / "out-actors"), min_actors=args.engines,
                                    max_actors=args.engines)
        through_serve = BatchJobConfig(**common, output_uri=str(work / "out-serve"), serve_app=APP)
        # Warm-up, not reported: the session's first job starts Ray Data's workers and loads the
        # layout model in them. Then through Serve first: a job's own engine actor outlives its
        # job (Ray Data keeps the worker), and would be counted beside the replicas later.
        run_batch_job(dataclasses.replace(through_serve, output_uri=str(work / "out-warm-up")))
        job("through serve", through_serve)
        for concurrency in levels:
            report["online"].append({"with": "alone", **load_level(url, bodies, concurrency, args.requests,
                                                                    args.max_seconds)})

        def online_beside(label: str):
            def levels_beside() -> None:
                time.sleep(5)  # the job's first pages reach its engines
                for concurrency in levels:
                    report["online"].append({"with": label, **load_level(
                        url, bodies, concurrency, args.requests, args.max_seconds)})
            return levels_beside

        job("through serve, online beside", through_serve, beside=online_beside(SERVE_BESIDE))
        job("own actors", own_actors)
        # the control: the same job on its own actors, sharing the cores but not the replica
        job("own actors, online beside", own_actors, beside=online_beside(ACTORS_BESIDE))
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    _ratios(report)
    if args.json:
        print(json.dumps(report))
    else:
        _print(report)
    return 0


def _ratios(report: dict) -> None:
    """p50 with the job beside / alone, per concurrency; pages/s through Serve / own actors."""
    alone = {r["concurrency"]: r for r in report["online"] if r["with"] == "alone"}
    for row in report["online"]:
        base = alone.get(row["concurrency"])
        if row["with"] != "alone" and base and base["p50_s"] and row["p50_s"]:
            row["p50_vs_alone"] = round(row["p50_s"] / base["p50_s"], 3)
    jobs = {r["job"]: r for r in report["jobs"]}
    actors, through = jobs.get("own actors"), jobs.get("through serve")
    if actors and through and actors["pages_per_second"]:
        report["serve_vs_actors_pages_per_second"] = round(through["pages_per_second"] / actors["pages_per_second"], 3)


def _print(report: dict) -> None:
    print(f"engines: {report['engines']}")
    print(f"{'online':>18} {'conc':>5} {'ok/sent':>9} {'p50 s':>8} {'p99 s':>8} {'req/s':>8} {'p50/alone':>10}")
    for r in report["online"]:
        print(f"{r['with']:>18} {r['concurrency']:>5} {r['ok']:>4}/{r['requests']:<4} {r['p50_s']!s:>8} "
              f"{r['p99_s']!s:>8} {r['requests_per_second']:>8} {r.get('p50_vs_alone', ''):>10}")
    print(f"{'job':>30} {'pages':>5} {'s':>8} {'pages/s':>8} {'model procs':>11} {'their MiB':>9}")
    for r in report["jobs"]:
        print(f"{r['job']:>30} {r['pages']:>5} {r['seconds']:>8} {r['pages_per_second']:>8} {r['model_processes']:>11} "
              f"{r['model_processes_peak_mib']:>9}")
    if "serve_vs_actors_pages_per_second" in report:
        print(f"pages/s through serve / own actors: {report['serve_vs_actors_pages_per_second']}")
