"""`gravityocr train-strips`: the default reader — PP-OCRv6 strips under the text decoder —
trained on real documents from a corpus build (`gravityocr data build`).

The pretrained tower stays frozen, so its token features are computed once per item and
cached to disk (`cache` step, resumable, chunk by chunk); training then runs the
projection and the text decoder alone, tens of samples a second on a CPU. The text decoder
and the mask embedding start from a trained recogniser (`init_from`), so only the
projection into the decoder starts fresh: it trains alone first (`projection_steps`), then
everything but the tower trains with the joint objective (clean stream + two complementary
corrupted streams, model/training/joint_loss.py), the one the self-speculative decoder needs.

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
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from gravityocr.model.training.joint_loss import Objective, TrainingSample, backward_in_micro_batches, build_joint_batch
from gravityocr.model.network.loading import Recognizer, load_recognizer, reading_placeholder_id, save_recognizer
from gravityocr.model.evaluation.scores import score
from gravityocr.model.network.modeling import STRIP_TOWER, GravityOcrForConditionalGeneration, vision_tower_of
from gravityocr.model.network.ppocr_tower import load_ppocr_recognizer as load_tower
from gravityocr.model.network.processor import EncodedPrompt, OcrProcessor
from gravityocr.model.training.recipes import read_recipe
from gravityocr.model.training.schedule import LearningRateSchedule
from gravityocr.model.network.strip_vision import MERGE, ReadingPrefix, StripImageProcessor, reading_head_weights
from gravityocr.model.decode.reading_drafts import reading_with_eos


@dataclass
class StripTrainConfig:
    corpus: str = "runs/corpus"  # a `gravityocr data build` directory
    cache: str = "runs/strip-features"  # token features of the frozen tower, by chunk
    output_dir: str = "runs/strips"
    init_from: str = "model/default"  # text decoder, mask embedding, tokenizer
    tower_weights: str = ""  # `convert_onnx` output; "" converts rapidocr's bundled file
    reading_prefix: bool = False  # the decoder also reads the classifier's text (model/network/strip_vision.py)
    reading_copy: bool = False  # and gets the reading's token at its place as input (model/decode/reading_drafts.py)
    vertical_detail: bool = False  # the backbone map's rows kept apart (model/network/strip_vision.py)
    # Draw items of a type in proportion to their text's length (each type keeps its share of
    # the batch): a corpus build's text items are mostly words and short lines, a page's are long.
    sample_by_length: bool = False
    # Each type's share of the draws (types without one are not drawn): a few text lines beside
    # many formulas keep the reader of lines while formulas are learned. None: shares by count.
    type_shares: dict[str, float] | None = None
    types: tuple[str, ...] = ("text", "table", "formula")
    max_target_tokens: int = 400  # longer targets are left out of training
    max_visual_tokens: int = 1200  # so are larger images (a whole page of table)
    micro_batch_tokens: int = 6000  # a step runs as length-sorted micro-batches of at most this many
    validation_items: int = 120  # items held out of the cache's last chunk, read greedily
    validation_set: str = ""  # validate on this evaluation set's items of `types` instead (data/dev)
    steps: int = 6000
    projection_steps: int = 300
    batch_size: int = 24
    learning_rate: float = 3e-4
    projection_learning_rate: float = 1e-3
    min_learning_rate: float = 3e-5
    warmup_steps: int = 50
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    block_size: int = 32
    min_block_size: int = 8
    seed: int = 0
    threads: int = 1
    checkpoint_every: int = 250
    validate_every: int = 500
    max_seconds: float = 0.0  # >0: stop (with a checkpoint) after this long
    stop_step: int = 0  # >0: stop (with a checkpoint) at this step of the `steps`-long schedule

    @classmethod
    def from_file(cls, path: str | Path) -> "StripTrainConfig":
        return read_recipe(cls, path)

    def validate(self) -> None:
        self.types = tuple(self.types)
        if self.projection_steps >= self.steps:
            raise ValueError("projection_steps must be fewer than steps")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.type_shares is not None and (set(self.type_shares) - set(self.types)
                                             or any(share < 0 for share in self.type_shares.values())
                                             or not sum(self.type_shares.values()) > 0):
            raise ValueError(f"type_shares must give non-negative shares of some of types {list(self.types)}, "
                             f"got {self.type_shares}")


# --- the starting model -------------------------------------------------------------------

def start_model(init_from: str | Path, tower_weights: str | Path, reading_prefix: bool = False,
                reading_copy: bool = False, vertical_detail: bool = False) -> Recognizer:
    """`init_from`'s text side under a strip tower with pretrained PP-OCRv6 weights. A strip
    model's own projections are kept (training continues; one saved before the reading hint
    existed loads with the hint's projection at zero); otherwise they start fresh, the
    hint's at zero. The reading hint's classifier always comes from `tower_weights`.
    `reading_prefix` adds the reading prefix, `reading_copy` the copy path (zero at the
    start); a model that has either keeps it. `vertical_detail` adds the map's rows (zero at the
    start)."""
    source = load_recognizer(init_from)
    config = source.model.config
    continues = vision_tower_of(config) == STRIP_TOWER
    config.vision_tower = STRIP_TOWER
    tokenizer = source.processor.tokenizer
    if reading_prefix and ReadingPrefix.of(config) is None:
        config.reading_prefix = asdict(ReadingPrefix.for_tokenizer(tokenizer))
    if reading_copy:
        if ReadingPrefix.of(config) is None:
            raise ValueError("reading_copy needs a model with a reading prefix (reading_prefix: true)")
        config.reading_copy = True
    if vertical_detail:
        config.strip_vertical_detail = True
    model = GravityOcrForConditionalGeneration(config)
    kept = {k: v for k, v in source.model.state_dict().items()
            if not k.startswith(("model.visual.", "strip_vision.reading_head."))}
    missing, unexpected = model.load_state_dict(kept, strict=False)
    if unexpected or any(not k.startswith(("strip_vision.", "reading_copy.")) for k in missing):
        raise ValueError(f"text weights do not fit: missing {missing}, unexpected {unexpected}")
    tower = load_tower(tower_weights)
    vision = model.strip_vision
    vision.recognizer.load_state_dict(
        {k: v for k, v in tower.state_dict().items() if not k.startswith("head.")}, strict=True)
    weight, bias = reading_head_weights(tower.head.fc, tower.characters, source.processor.tokenizer.get_vocab(),
                                        config.text_config.vocab_size)
    with torch.no_grad():
        vision.reading_head.weight.copy_(weight)
        vision.reading_head.bias.copy_(bias)
        if not continues:  # visual tokens at the scale the decoder's own tokens have
            vision.projection.weight.mul_(0.35)
            vision.projection.bias.zero_()
    processor = OcrProcessor(tokenizer, StripImageProcessor(), source.processor.template,
                             max_context=config.text_config.max_position_embeddings,
                             reading_placeholder_id=reading_placeholder_id(config))
    return Recognizer(model.eval(), processor)


def default_tower_weights(cache_dir: Path) -> Path:
    from gravityocr.model.network.ppocr_tower import convert_onnx, rapidocr_model_path

    path = cache_dir / "ppocr_rec.safetensors"
    if not path.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        convert_onnx(rapidocr_model_path(), path)
    return path


# --- the feature cache -------------------------------------------------------------------

@dataclass
class CachedItem:
    id: str
    type: str
    features: torch.Tensor  # (tokens, 1512) float16
    grid: torch.Tensor  # (1, 3)
    target_ids: list[int]
    text: str


def build_feature_cache(config: StripTrainConfig, recognizer: Recognizer, log=print) -> None:
    """Token features of every corpus item of the configured types, one cache file per corpus
    shard; shards already cached are skipped and shards that appeared meanwhile are picked up,
    so a stopped cache build resumes and a growing corpus is followed until it stops growing."""
    import io

    import pyarrow.parquet as pq
    from PIL import Image

    cache = Path(config.cache)
    cache.mkdir(parents=True, exist_ok=True)
    corpus = Path(config.corpus)
    while True:
        shards = sorted(s for s in corpus.glob("shards/**/*.parquet") if s.parts[-3] in config.types)
        todo = [s for s in shards if not (cache / _cache_name(corpus, s)).exists()]
        if not todo:
            return
        random.Random(config.seed).shuffle(todo)  # the cache grows evenly over packages and types
        for shard in todo:
            started = time.perf_counter()
            items = []
            with torch.inference_mode():
                for row in pq.read_table(shard).to_pylist():
                    image = Image.open(io.BytesIO(row["image"])).convert("RGB")
                    item = cached_item(recognizer, config, row["id"], row["type"], row["text"], image)
                    if item is not None:
                        items.append(item)
            path = cache / _cache_name(corpus, shard)
            partial = path.with_suffix(".partial")
            torch.save([asdict(item) for item in items], partial)
            partial.rename(path)
            rate = len(items) / max(time.perf_counter() - started, 1e-9)
            log(f"{path.name}: {len(items)} items, {rate:.1f}/s")


def cached_item(recognizer: Recognizer, config: StripTrainConfig, item_id: str, type: str, text: str,
                image) -> CachedItem | None:
    """One item's tower features and target, or None when its target is too long to train on."""
    processor = recognizer.processor
    target = processor.tokenizer.encode(text, add_special_tokens=False) + [processor.eos_token_ids[0]]
    if len(target) > config.max_target_tokens:
        return None
    pixels = processor.image_processor(images=[image])
    features = recognizer.model.strip_vision.token_features(pixels["pixel_values"], pixels["image_grid_thw"])[0]
    return CachedItem(item_id, type, features.half(), pixels["image_grid_thw"], target, text)


@torch.inference_mode()
def evaluation_set_items(config: StripTrainConfig, recognizer: Recognizer) -> list[CachedItem]:
    """The items of `config.validation_set` (an evaluation manifest) of the configured types,
    with their tower features, in manifest order."""
    from PIL import Image

    from gravityocr.model.evaluation.manifest import read_manifest

    items = []
    for entry in read_manifest(config.validation_set):
        if entry.type in config.types:
            item = cached_item(recognizer, config, entry.id, entry.type, entry.text,
                               Image.open(entry.image_path).convert("RGB"))
            if item is not None:
                items.append(item)
    return items


def _cache_name(corpus: Path, shard: Path) -> str:
    return shard.relative_to(corpus / "shards").as_posix().replace("/", "--").replace(".parquet", ".pt")


def _held_out(item_id: str) -> bool:
    return int(hashlib.sha1(item_id.encode()).hexdigest()[:4], 16) % 50 == 0


def read_cache(cache: Path, max_visual_tokens: int | None = None) -> list[CachedItem]:
    items = []
    for path in sorted(Path(cache).glob("*.pt")):
        items += [CachedItem(**record) for record in torch.load(path, weights_only=False)]
    if max_visual_tokens is not None:
        items = [item for item in items if item.features.shape[0] <= max_visual_tokens]
    return items


class CachedTowerView(nn.Module):
    """The recogniser as the joint loss sees it, with the frozen tower's output given
    instead of pixels: `encode_images` only projects cached token features."""

    def __init__(self, model: GravityOcrForConditionalGeneration):
        super().__init__()
        self.model = model
        self.config = model.config
        self.mask_token_id = model.mask_token_id

    @property
    def device(self):
        return self.model.device

    def encode_images(self, features: torch.Tensor, image_grid_thw: torch.Tensor,
                      readings: list | None = None, frames: list | None = None) -> list[torch.Tensor]:
        counts = (image_grid_thw.prod(dim=1) // 4).tolist()
        return self.model.embed_strip_features(list(features.float().split(counts)), image_grid_thw, readings, frames)

    @property
    def copies_reading(self) -> bool:
        return self.model.copies_reading

    @property
    def ctc_prefix_weight(self) -> float:
        return self.model.ctc_prefix_weight

    def embed(self, *args, **kwargs):
        return self.model.embed(*args, **kwargs)

    def logits_from_embeds(self, *args, **kwargs):
        return self.model.logits_from_embeds(*args, **kwargs)

    def rope_positions(self, *args, **kwargs):
        return self.model.rope_positions(*args, **kwargs)


def to_sample(item: CachedItem, processor: OcrProcessor,
              model: GravityOcrForConditionalGeneration | None = None) -> TrainingSample:
    """The item as a training sample; with a `model` that copies its reading, with the reading
    (what the frozen classifier reads from the cached features, the eos after it)."""
    ids = processor.prompt_ids_for(item.grid, item.type)
    prompt = EncodedPrompt(torch.tensor([ids]), item.features, item.grid, item.type)
    reading = None
    if model is not None and model.copies_reading:
        vision, (_, grid_h, grid_w) = model.strip_vision, item.grid[0].tolist()
        with torch.no_grad():
            read = vision.reading(vision.reading_logits(item.features.float()), grid_h // MERGE, grid_w // MERGE,
                                  model.reading_prefix)
        reading = reading_with_eos(read, frozenset(processor.eos_token_ids))
    return TrainingSample(prompt, item.target_ids, reading)


# --- training -------------------------------------------------------------------------------

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
            save_recognizer(Recognizer(model, recognizer.processor), checkpoint)
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
