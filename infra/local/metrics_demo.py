"""Drive every GravityOCR metric with plausible numbers on a running Ray cluster.

For trying the dashboards and the Prometheus setup without a model or documents: engine
actors on the engine group "decode" regions whose statistics follow the paper's shape
(tables accept most of a 32-token block, text about half, formulas less), page tasks on
the CPU group succeed or fail now and then, and the driver records request latencies.
It only calls the `gravityocr.metrics` API, exactly as the batch job and the Serve app do.

    source "$GRAVITYOCR_LOCAL_DIR/env.sh"    # after infra/local/cluster.sh up
    python infra/local/metrics_demo.py --seconds 300
"""

from __future__ import annotations

import argparse
import random
import time

import ray

from gravityocr import metrics

BLOCK_SIZE = 32
# Mean accepted drafts per round by content type (the paper: tables 25 of 32, text 15).
MEAN_ACCEPTED = {"text": 15, "table": 25, "formula": 10}
ERROR_REASONS = ("render", "layout", "decode_timeout")


def simulated_decode(rng: random.Random, content_type: str) -> tuple[int, int, list[int]]:
    """(committed tokens, forward passes, accepted drafts per round) of one region."""
    target = rng.randint(40, 400)
    committed, passes, accepted = 0, 1, []  # prefill
    while committed < target:
        a = max(0, min(BLOCK_SIZE - 1, int(rng.gauss(MEAN_ACCEPTED[content_type], 5))))
        accepted.append(a)
        committed += a + 2  # y, the accepted drafts, the bonus token
        passes += 2  # draft + verify
    return committed, passes, accepted


@ray.remote(num_cpus=0)
class DemoEngine:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.queue = 0
        metrics.engine_actor_started(device="cpu")

    def decode_page(self, regions: int) -> int:
        self.queue += regions
        metrics.set_queue_depth(self.queue)
        metrics.set_engine_batch_size(min(regions, 16))
        tokens = 0
        for _ in range(regions):
            content_type = self.rng.choice(list(MEAN_ACCEPTED))
            committed, passes, accepted = simulated_decode(self.rng, content_type)
            metrics.record_decode(content_type, committed, passes, accepted)
            tokens += committed
            self.queue -= 1
        metrics.set_queue_depth(self.queue)
        return tokens


@ray.remote(num_cpus=0)
def render_and_layout(seed: int) -> tuple[int, str | None]:
    """A page through the CPU stages: (regions found, error reason or None)."""
    rng = random.Random(seed)
    time.sleep(rng.uniform(0.01, 0.05))
    if rng.random() < 0.05:
        return 0, rng.choice(ERROR_REASONS[:2])
    return rng.randint(2, 12), None


def run(seconds: float, engines: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    actors = [DemoEngine.options(resources={"engine_worker": 0.01}).remote(seed + i) for i in range(engines)]
    deadline = time.monotonic() + seconds
    page = 0
    while time.monotonic() < deadline:
        pages = [render_and_layout.options(resources={"cpu_worker": 0.01}).remote(seed + page + i)
                 for i in range(4)]
        page += len(pages)
        results = ray.get(pages)
        decodes = []
        for i, (regions, error) in enumerate(results):
            if error is None:
                decodes.append(actors[i % len(actors)].decode_page.remote(regions))
        ray.get(decodes)
        for regions, error in results:
            metrics.record_page(error_reason=error)
        metrics.record_document(metrics.STATUS_OK if all(e is None for _, e in results) else metrics.STATUS_ERROR)
        status = 200 if rng.random() > 0.03 else rng.choice([422, 500, 503])
        metrics.observe_request_latency("/v1/ocr", status, rng.lognormvariate(-0.5, 0.6))
        metrics.observe_request_latency("/v1/ocr/batch", 200, rng.lognormvariate(1.0, 0.5))
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--engines", type=int, default=2)
    args = parser.parse_args(argv)
    ray.init(address="auto", logging_level="WARNING")  # RAY_ADDRESS and auth from env.sh
    run(args.seconds, args.engines)
    print("metrics demo done", flush=True)


if __name__ == "__main__":
    main()
