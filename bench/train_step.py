"""`gravityocr bench train-step`: seconds per training step (forward and backward) of a
recipe's real batches, one padded pass against length-sorted micro-batches of several sizes.

Every setting runs the same steps' batches (rendered once, before timing) from the same
weights, interleaved round by round so a busy machine slows them alike; the weights are
not updated. `max grad diff` is the largest difference from the one-pass gradient relative
to that gradient's largest entry: micro-batches must give the same gradient. Prints
figures; never judges them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from gravityocr.model.training.joint_loss import JointBatch, backward_in_micro_batches
from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer
from gravityocr.model.training.train import CropBatches, TrainConfig

# The training recipes live at the top of a checkout (recipes/), not in the installed package.
RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"


def gradient(model, batch: JointBatch, objective, max_tokens: int) -> tuple[list[torch.Tensor], int]:
    """The step's gradient computed through micro-batches of `max_tokens`, and how many there were."""
    model.zero_grad(set_to_none=True)
    _, count = backward_in_micro_batches(model, batch, objective, max_tokens)
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None], count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(RECIPES_DIR / "05-mixed.yaml"),
                        help="training recipe (YAML; default: the checkout's recipes/05-mixed.yaml)")
    parser.add_argument("--model", default=str(DEFAULT_MODEL_DIR), help="weights to time")
    parser.add_argument("--steps", type=int, default=3, help="the recipe's batches to time, from --first-step")
    parser.add_argument("--first-step", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2, help="timed passes over the batches per setting")
    parser.add_argument("--budgets", default="0,1000,2000,4000",
                        help="micro_batch_tokens settings, comma-separated (0: one padded pass)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", help="torch device (default: the recipe's)")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON object")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gravityocr bench train-step", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    budgets = [int(b) for b in args.budgets.split(",")]
    config = TrainConfig.from_file(args.config)
    recognizer = load_recognizer(args.model, dtype=torch.float32)
    device = torch.device(args.device or config.device)
    model = recognizer.model.to(device).train()
    loader = CropBatches(config, recognizer.processor, model, args.first_step)
    steps = range(args.first_step, args.first_step + args.steps)
    batches = [(loader.batch_for_step(step).joint, config.objective_at(step)) for step in steps]
    padding = [b.input_ids.numel() / sum(layout.total_len for layout in b.layouts) for b, _ in batches]
    reference = [gradient(model, batch, objective, 0)[0] for batch, objective in batches]  # also warms up

    seconds: dict[int, list[float]] = {budget: [] for budget in budgets}
    groups: dict[int, list[int]] = {}
    deviation: dict[int, float] = {}
    for _ in range(args.rounds):
        for budget in budgets:
            for (batch, objective), expected in zip(batches, reference):
                started = time.perf_counter()
                grads, count = gradient(model, batch, objective, budget)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds[budget].append(time.perf_counter() - started)
                groups.setdefault(budget, []).append(count)
                scale = max(g.abs().max().item() for g in expected)
                diff = max((g - e).abs().max().item() for g, e in zip(grads, expected)) / scale
                deviation[budget] = max(deviation.get(budget, 0.0), diff)

    print(f"train step: {args.config}, model {args.model}, steps {steps.start}-{steps.stop - 1} "
          f"(batch {config.batch_size}, padded/real tokens {statistics.fmean(padding):.2f}), "
          f"{args.rounds} rounds, {device}" + (f", {args.threads} threads" if device.type == "cpu" else ""))
    print(f"{'tokens':>7} {'micro':>6} {'s/step':>7} {'speed-up':>9} {'max grad diff':>14}")
    whole = statistics.median(seconds[budgets[0]])
    rows = []
    for budget in budgets:
        median = statistics.median(seconds[budget])
        row = {"micro_batch_tokens": budget, "micro_batches": statistics.fmean(groups[budget]),
               "seconds_per_step": median, "speed_up": whole / median, "max_grad_diff": deviation[budget]}
        rows.append(row)
        print(f"{budget:>7} {row['micro_batches']:6.1f} {median:7.2f} {row['speed_up']:8.2f}x "
              f"{row['max_grad_diff']:14.1e}")
    print(f"(speed-up against micro_batch_tokens={budgets[0]})")
    if args.json:
        print(json.dumps({"padding": statistics.fmean(padding), "settings": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
