"""`gravityocr bench serve`: latency p50/p99 and requests/s of the HTTP API at several
concurrencies, self-speculative vs AR, in one run against a local Ray Serve on 127.0.0.1.

The load is bounded: each level sends at most --requests requests and stops after
--max-seconds, whichever comes first. Requests are chat completions of held-out crops;
with --stream they stream (server-sent events) and the time to the first text is reported
beside the time to the whole answer.

The decoding flags are every command's (model/decode/settings.py), unset the product's
defaults. Each mode serves them with what it does not measure turned off: "ar" AR
decoding, "spec" self-speculative rounds (the product's default decoding, unless flags say
otherwise), "spec-all" (--spec-all) speculative rounds at every batch size.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import dataclasses
import io
import json
import socket
import statistics
import time
from pathlib import Path

import httpx

from gravityocr.model.decode.flags import add_model_argument
from gravityocr.model.decode.settings import DecodeSettings, add_decode_arguments, decode_settings_from_args
from gravityocr.model.evaluation.manifest import read_manifest
from gravityocr.serve.app import build_app
from gravityocr.serve.settings import ServeSettings

PROMPTS = {"text": "Text Recognition:", "table": "Table Recognition:", "formula": "Formula Recognition:"}
REAL = Path(__file__).resolve().parent.parent / "data" / "real"


def free_port() -> int:
    """A TCP port on 127.0.0.1 free when asked, for a server a bench starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chat_bodies(data: Path, limit: int) -> list[dict]:
    """Chat-completion bodies for the first `limit` crops of the manifest in `data` (pages left out)."""
    bodies = []
    for item in read_manifest(data)[:limit]:
        if item.type not in PROMPTS:
            continue
        buffer = io.BytesIO()
        item.load_image().save(buffer, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        bodies.append({"model": "gravityocr", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": PROMPTS[item.type]}]}]})
    return bodies


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _streamed(client: httpx.Client, url: str, body: dict) -> tuple[float | None, int]:
    """Seconds to the first text of a streamed answer, and the status."""
    start = time.perf_counter()
    first = None
    with client.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                return first, event["error"]["status"]
            if first is None and any(choice["delta"].get("content") for choice in event.get("choices", [])):
                first = time.perf_counter() - start
    return first, response.status_code


def load_level(url: str, bodies: list[dict], concurrency: int, requests: int, max_seconds: float,
               stream: bool = False) -> dict:
    latencies, firsts, statuses = [], [], []
    deadline = time.monotonic() + max_seconds
    with httpx.Client(timeout=300) as client:
        def one(index: int):
            if time.monotonic() > deadline:
                return None
            start = time.perf_counter()
            body = bodies[index % len(bodies)]
            if stream:
                first, status = _streamed(client, url, body)
            else:
                first, status = None, client.post(f"{url}/v1/chat/completions", json=body).status_code
            return time.perf_counter() - start, first, status

        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            for outcome in pool.map(one, range(requests)):
                if outcome:
                    latencies.append(outcome[0])
                    firsts.append(outcome[1])
                    statuses.append(outcome[2])
        elapsed = time.perf_counter() - started
    ok = [lat for lat, status in zip(latencies, statuses) if status == 200]
    row = {"concurrency": concurrency, "requests": len(statuses), "ok": len(ok),
           "p50_s": round(statistics.median(ok), 4) if ok else None,
           "p99_s": round(_percentile(ok, 0.99), 4) if ok else None,
           "requests_per_second": round(len(ok) / elapsed, 3)}
    if stream:
        first_ok = [f for f, status in zip(firsts, statuses) if status == 200 and f is not None]
        row["first_text_p50_s"] = round(statistics.median(first_ok), 4) if first_ok else None
    return row


def serve_modes(decode: DecodeSettings, spec_all: bool) -> dict[str, DecodeSettings]:
    """The settings each mode serves with (see the module docstring)."""
    spec = dataclasses.replace(decode, mode="spec")
    modes = {"ar": dataclasses.replace(spec, mode="ar"), "spec": spec}
    if spec_all:
        modes["spec-all"] = dataclasses.replace(spec, speculative_max_batch=0)
    return modes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gravityocr bench serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_argument(parser)
    parser.add_argument("--data", default=str(REAL), help="manifest directory of crops to send (default: data/real)")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--requests", type=int, default=64, help="requests per level at most")
    parser.add_argument("--max-seconds", type=float, default=120, help="time per level at most")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    parser.add_argument("--stream", action="store_true", help="stream the answers; report time to first text")
    parser.add_argument("--spec-all", action="store_true",
                        help="also serve speculating at every batch size (mode \"spec-all\"); \"spec\" is the "
                             "product's default, AR rounds past speculative_max_batch on a CPU")
    parser.add_argument("--json", action="store_true")
    add_decode_arguments(parser)
    args = parser.parse_args(argv)
    try:
        modes = serve_modes(decode_settings_from_args(args), args.spec_all)
    except ValueError as error:
        parser.error(str(error))

    import ray
    from ray import serve

    bodies = chat_bodies(Path(args.data), 200)
    port = free_port()
    ray.init(log_to_driver=False, include_dashboard=False)
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    rows = []
    try:
        for mode, decode in modes.items():
            settings = ServeSettings(model=args.model, decode=decode, threads=args.threads, max_concurrent_requests=64)
            serve.run(build_app(settings, {"ray_actor_options": {"num_cpus": 1}}), name=f"bench-{mode}",
                      route_prefix=f"/{mode}")
            url = f"http://127.0.0.1:{port}/{mode}"
            load_level(url, bodies, 1, 2, 60)  # warm-up
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                rows.append({"mode": mode, **load_level(url, bodies, concurrency, args.requests, args.max_seconds,
                                                        args.stream)})
            serve.delete(f"bench-{mode}")
    finally:
        serve.shutdown()
        ray.shutdown()
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        first = f" {'1st text p50':>12}" if args.stream else ""
        print(f"{'mode':>8} {'conc':>5} {'ok/sent':>9} {'p50 s':>8} {'p99 s':>8} {'req/s':>8}{first}")
        for r in rows:
            first = f" {r['first_text_p50_s']!s:>12}" if args.stream else ""
            print(f"{r['mode']:>8} {r['concurrency']:>5} {r['ok']:>4}/{r['requests']:<4} {r['p50_s']!s:>8} "
                  f"{r['p99_s']!s:>8} {r['requests_per_second']:>8}{first}")
    return 0
