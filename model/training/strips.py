"""`gravityocr train-strips`: the default reader — PP-OCRv6 strips under the text decoder —
trained on real documents from a corpus build (`gravityocr data build`).

The pretrained tower stays frozen, so its token features are computed once per item and
cached to disk (model/training/strip_feature_cache.py); training then runs the projection and
the text decoder alone, tens of samples a second on a CPU. Only the projection into the
decoder starts fresh (model/training/strip_start.py): it trains alone first
(`projection_steps`), then everything but the tower trains with the joint objective (clean
stream + two complementary corrupted streams, model/training/joint_loss.py), the one the
self-speculative decoder needs.

Checkpoints (weights in Hugging Face format plus the optimiser) are written every
`checkpoint_every` steps; a run started again with the same output directory resumes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from collections import Counter
from pathlib import Path

import torch

from gravityocr.model.training.joint_loss import Objective, backward_in_micro_batches, build_joint_batch
from gravityocr.model.network.loading import Recognizer, load_recognizer, save_recognizer
from gravityocr.model.evaluation.scores import score
from gravityocr.model.training.schedule import LearningRateSchedule
from gravityocr.model.training.strip_feature_cache import (
    CachedItem, CachedTowerView, build_feature_cache, evaluation_set_items, read_cache, to_sample,
)
from gravityocr.model.training.strip_start import default_tower_weights, start_model
from gravityocr.model.training.strip_train_config import StripTrainConfig


def _held_out(item_id: str) -> bool:
    return int(hashlib.sha1(item_id.encode()).hexdigest()[:4], 16) % 50 == 0


SHORTEST_WEIGHT, LONGEST_WEIGHT = 8, 160  # characters: the length weight's floor and cap


def length_weights(items: list[CachedItem]) -> list[float]:
    """Sampling weights in proportion to each item's text length (clamped), normalised so
    that every type keeps the share of draws its item count gives it."""
    clamped = [min(max(len(item.text), SHORTEST_WEIGHT), LONGEST_WEIGHT) for item in items]
    by_type: Counter[str] = Counter()
    for item, length in zip(items, clamped):
        by_type[item.type] += length
    counts = Counter(item.type for item in items)
    return [counts[item.type] * length / by_type[item.type] for item, length in zip(items, clamped)]

def sampling_weights(items: list[CachedItem], config: StripTrainConfig) -> list[float] | None:
    """Per item, its weight in the draws (`sample_by_length`, `type_shares`); None: uniform."""
    if not config.sample_by_length and config.type_shares is None:
        return None
    weights = length_weights(items) if config.sample_by_length else [1.0] * len(items)
    if config.type_shares is None:
        return weights
    by_type: Counter[str] = Counter()
    for item, weight in zip(items, weights):
        by_type[item.type] += weight
    return [config.type_shares.get(item.type, 0.0) * weight / by_type[item.type]
            for item, weight in zip(items, weights)]


@torch.no_grad()
def validate(recognizer: Recognizer, items: list[CachedItem]) -> dict[str, float]:
    """Greedy reading of held-out cached items: mean score by type."""
    from gravityocr.model.decode.reference import greedy_decode

    view = CachedTowerView(recognizer.model.eval())
    eos = set(recognizer.processor.eos_token_ids)
    scores: dict[str, list[float]] = {}
    for item in items:
        prompt = to_sample(item, recognizer.processor).prompt
        result = greedy_decode(view, prompt, len(item.target_ids) + 20, eos)
        text = recognizer.processor.decode(result.token_ids)
        scores.setdefault(item.type, []).append(score(item.type, text, item.text))
    recognizer.model.train()
    return {t: sum(v) / len(v) for t, v in scores.items()}


def train(config: StripTrainConfig, log=print) -> Path:
    config.validate()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    output = Path(config.output_dir)
    checkpoint = output / "checkpoint"
    if (checkpoint / "trainer_state.pt").exists():
        recognizer = load_recognizer(checkpoint)
        state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
    else:
        tower = Path(config.tower_weights) if config.tower_weights else default_tower_weights(output)
        recognizer = start_model(config.init_from, tower, config.reading_prefix, config.reading_copy,
                                 config.vertical_detail)
        state = None
    model = recognizer.model.train()
    vision = model.strip_vision
    vision.recognizer.requires_grad_(False)
    vision.reading_head.requires_grad_(False)
    # the modules that start fresh train at the projection's rate
    fresh = [vision.norm, vision.projection, vision.reading_projection]
    if vision.vertical_detail:
        fresh += [vision.vertical_norm, vision.vertical_projection]
    if model.copies_reading:
        fresh.append(model.reading_copy)
    projection = [p for module in fresh for p in module.parameters() if p.requires_grad]
    projected = {id(p) for p in projection}
    rest = [p for n, p in model.named_parameters() if p.requires_grad and id(p) not in projected]
    optimizer = torch.optim.AdamW([{"params": projection, "lr_base": config.projection_learning_rate,
                                    "during_projection_steps": True},
                                   {"params": rest, "lr_base": config.learning_rate, "during_projection_steps": False}],
                                  lr=config.learning_rate, weight_decay=config.weight_decay)
    step = 0
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        for group, flag in zip(optimizer.param_groups, (True, False)):  # the groups' roles, not saved state
            group["during_projection_steps"] = flag
        step = state["step"]
    items = [i for i in read_cache(Path(config.cache), config.max_visual_tokens) if i.type in config.types]
    if len(items) <= config.validation_items:
        raise ValueError(f"{len(items)} cached items: build the feature cache first (gravityocr train-strips --cache-only)")
    if config.validation_set:
        held_out = evaluation_set_items(config, recognizer)[:config.validation_items]
    else:
        # held out: a fixed share of items by id, whichever cache files exist when the run starts
        held_out = sorted((i for i in items if _held_out(i.id)), key=lambda i: i.id)[:config.validation_items]
    held_out_ids = {item.id for item in held_out}
    # a standard formula may recur in a training package: what is validated on is not trained on
    held_out_texts = {item.text for item in held_out} if config.validation_set else set()
    trained = lambda item: item.type in config.types and item.id not in held_out_ids and item.text not in held_out_texts
    items = [i for i in items if trained(i)]
    log(f"{len(items)} training items, {len(held_out)} held out; starting at step {step}")
    view = CachedTowerView(model)
    rng = random.Random(config.seed * 1000 + step)
    generator = torch.Generator().manual_seed(config.seed * 1000 + step)
    weights = sampling_weights(items, config)
    log_path = output / "train_log.jsonl"
    output.mkdir(parents=True, exist_ok=True)
    # one schedule for both groups, as a multiple of each group's own peak rate
    schedule = LearningRateSchedule(1.0, config.min_learning_rate / config.learning_rate, config.warmup_steps,
                                    config.steps)
    started = time.perf_counter()
    while step < config.steps:
        projection_only = step < config.projection_steps
        for group in optimizer.param_groups:
            trains = group["during_projection_steps"] or not projection_only
            group["lr"] = group["lr_base"] * schedule.rate(step) if trains else 0.0
        chosen = (rng.choices(items, weights, k=config.batch_size) if weights is not None
                  else rng.sample(items, config.batch_size))
        samples = [to_sample(item, recognizer.processor, model) for item in chosen]
        objective = Objective.AR_ONLY if projection_only else Objective.JOINT
        batch = build_joint_batch(view, samples, objective, config.block_size, generator=generator,
                                  min_block_size=config.min_block_size, pad_final_block=True)
        optimizer.zero_grad(set_to_none=True)
        parts, _ = backward_in_micro_batches(view, batch, objective, config.micro_batch_tokens)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm)
        optimizer.step()
        step += 1
        record = {"step": step, "ar": round(parts.ar.item(), 4), "denoise": round(parts.denoise.item(), 4),
                  "seconds": round(time.perf_counter() - started, 1)}
        out_of_time = bool(config.max_seconds and time.perf_counter() - started > config.max_seconds)
        out_of_time = out_of_time or step == config.stop_step
        if step % config.validate_every == 0 or step == config.steps or out_of_time:
            record["validation"] = validate(recognizer, held_out)
            # the cache may still be growing beside a long run: take in its new files
            items = [i for i in read_cache(Path(config.cache), config.max_visual_tokens) if trained(i)]
            weights = sampling_weights(items, config)
        with log_path.open("a") as stream:
            stream.write(json.dumps(record) + "\n")
        if step % 50 == 0 or "validation" in record:
            log(json.dumps(record))
        if step % config.checkpoint_every == 0 or step == config.steps or out_of_time:
            save_recognizer(Recognizer(model, recognizer.processor, recognizer.lexicon), checkpoint)
            torch.save({"optimizer": optimizer.state_dict(), "step": step}, checkpoint / "trainer_state.pt")
        if out_of_time:
            break
    return checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="recipe YAML (recipes/strips.yaml)")
    parser.add_argument("--cache-only", action="store_true", help="build the feature cache and stop")
    parser.add_argument("--max-seconds", type=float, default=None, help="this invocation's time budget")
    parser.add_argument("--stop-step", type=int, default=None, help="stop at this step of the schedule")
    parser.add_argument("--output-dir", default=None,
                        help="where the checkpoint (checkpoint/, resumed from when present), the training log "
                             "(train_log.jsonl) and, unless the config names tower_weights, the tower converted "
                             "from rapidocr's file go (overrides the config's output_dir; its default: "
                             f"{StripTrainConfig.output_dir})")


def run(args) -> int:
    config = StripTrainConfig.from_file(args.config)
    if args.max_seconds is not None:
        config.max_seconds = args.max_seconds
    if args.stop_step is not None:
        config.stop_step = args.stop_step
    if args.output_dir:
        config.output_dir = args.output_dir
    torch.set_num_threads(config.threads)
    if args.cache_only:
        tower = Path(config.tower_weights) if config.tower_weights else default_tower_weights(Path(config.output_dir))
        build_feature_cache(config, start_model(config.init_from, tower, vertical_detail=config.vertical_detail))
        return 0
    train(config)
    return 0
