"""`gravityocr bench ablation`: the paper's objective ablation at a matched budget.

Three arms start from the same weights and train for the same steps on the same crops
(same seeds, batch and learning-rate schedule): the joint objective, plain AR (the
baseline), and the joint layout without its AR term. Each is then read greedily (spec
decoding, checked equal to AR) on held-out crops of the same curriculum stage (seeds at
or above 10**9, never trained on). Prints the three scores and the ratios the paper
reports (joint / AR-only, no-AR / joint) with TPF, and the paired differences of the
per-crop scores with their standard errors, since the arms read the same crops; it never
judges them. Run again with the same --out, an arm that finished its steps is evaluated
again without retraining (e.g. on more held-out crops).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gravityocr.model.evaluation.report import evaluate
from gravityocr.model.training.joint_loss import Objective
from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer
from gravityocr.model.training.heldout import write_synthetic_set
from gravityocr.model.training.curriculum import stage_by_name
from gravityocr.model.training.train import CurriculumPhase, TrainConfig, Trainer

HELDOUT_SEED = 10**9 + 500_000  # above every training seed and apart from data/heldout's
ARMS = (Objective.JOINT, Objective.AR_ONLY, Objective.NO_AR)


@dataclass
class ArmResult:
    objective: str
    steps: int
    train_seconds: float | None  # None: trained by an earlier run of the bench
    final_loss: float
    overall: float
    scores: dict[str, float]
    tpf: float
    exact: bool | None
    item_scores: dict[str, float]


def arm_config(args, objective: Objective) -> TrainConfig:
    return TrainConfig(
        output_dir=str(Path(args.out) / objective.value), size="small", objective=objective.value,
        steps=args.steps, batch_size=args.batch_size, learning_rate=args.learning_rate,
        min_learning_rate=args.learning_rate / 10, warmup_steps=min(50, args.steps // 10),
        vision_frozen_steps=0, checkpoint_every=args.steps, shuffled_loss_every=10**9,
        threads=args.threads, init_from=args.init, seed=args.seed,
        curriculum=[CurriculumPhase(args.stage, args.steps)],
    )


def run_arm(args, objective: Objective, items) -> ArmResult:
    config = arm_config(args, objective)
    started = time.perf_counter()
    history = Trainer(config).run(progress_bar=False)
    seconds = time.perf_counter() - started if history else None
    recognizer = load_recognizer(Path(config.output_dir) / "checkpoint", dtype=getattr(torch, args.dtype))
    report = evaluate(recognizer, items, batch_size=32, check_exact=True)
    log = Path(config.output_dir) / "train_log.jsonl"
    tail = [json.loads(line)["loss"] for line in log.read_text().splitlines()[-10:]]
    return ArmResult(objective.value, config.steps, seconds, statistics.fmean(tail), report.overall, report.scores,
                     report.tpf, report.exact, {item.id: item.score for item in report.items})


def paired_difference(a: ArmResult, b: ArmResult) -> tuple[float, float]:
    """Mean of a's minus b's per-crop score, and its standard error."""
    differences = [a.item_scores[key] - b.item_scores[key] for key in a.item_scores]
    if len(differences) < 2:
        return statistics.fmean(differences), float("nan")
    return statistics.fmean(differences), statistics.stdev(differences) / math.sqrt(len(differences))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--init", default=str(DEFAULT_MODEL_DIR), help="weights every arm starts from")
    parser.add_argument("--stage", default="fonts-8-20", help="curriculum stage to train and evaluate on")
    parser.add_argument("--steps", type=int, default=300, help="training steps per arm (the matched budget)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--eval-items", type=int, default=64, help="held-out crops of the stage")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="evaluation precision")
    parser.add_argument("--out", required=True, help="working folder for the arms' checkpoints")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON object")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gravityocr bench ablation", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    items = write_synthetic_set(Path(args.out) / "heldout", HELDOUT_SEED, args.eval_items, stage_by_name(args.stage),
                                id_prefix=args.stage)
    results = {objective: run_arm(args, objective, items) for objective in ARMS}
    print(f"ablation: init {args.init}, stage {args.stage}, {args.steps} steps x batch {args.batch_size} per arm, "
          f"{len(items)} held-out crops")
    print(f"{'objective':<10} {'overall':>8} {'tpf':>6} {'exact':>6} {'loss':>7} {'train s':>8}")
    for result in results.values():
        seconds = "earlier" if result.train_seconds is None else f"{result.train_seconds:.1f}"
        print(f"{result.objective:<10} {result.overall:8.4f} {result.tpf:6.2f} {str(result.exact):>6} "
              f"{result.final_loss:7.3f} {seconds:>8}")
    joint, ar_only, no_ar = (results[o] for o in ARMS)
    ratios = {
        "joint_over_ar_only": joint.overall / ar_only.overall if ar_only.overall else float("nan"),
        "no_ar_over_joint": no_ar.overall / joint.overall if joint.overall else float("nan"),
    }
    differences = {"joint_minus_ar_only": paired_difference(joint, ar_only),
                   "no_ar_minus_joint": paired_difference(no_ar, joint)}
    print(f"joint / AR-only overall: {ratios['joint_over_ar_only']:.3f}   "
          f"no-AR / joint overall: {ratios['no_ar_over_joint']:.3f}")
    for name, (mean, error) in differences.items():
        print(f"{name.replace('_', ' ')}: {mean:+.4f} ± {error:.4f} (paired standard error, {len(items)} crops)")
    if args.json:
        arms = [{k: v for k, v in asdict(r).items() if k != "item_scores"} for r in results.values()]
        print(json.dumps({"arms": arms, **ratios, **{k: {"mean": m, "standard_error": e}
                                                      for k, (m, e) in differences.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
