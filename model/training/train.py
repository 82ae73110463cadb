"""`gravityocr train`: the joint objective on a stream of synthetic crops, on CPU or GPU.

Checkpoints are written atomically as training goes (weights in Hugging Face format plus
the optimiser state), and a run resumes from the last one with the same data order.

Two measured facts shape the recipe (docs/training-the-small-model.md):
- trained from scratch together with the decoder, the vision tower collapses to the same
  output for every image; so it starts frozen at its random init and is unfrozen later
  at a fraction of the learning rate, biases kept frozen;
- the loss with images shuffled across the batch is logged next to the real loss: while
  they are equal the model is not reading.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from tqdm import tqdm

from gravityocr.model.training import curriculum, synthetic
from gravityocr.model.network.configs import SMALL, TINY, build_config
from gravityocr.model.training.joint_loss import (JointBatch, Objective, TargetCounts, TrainingSample, build_joint_batch, joint_loss,
                         split_by_length)
from gravityocr.model.network.loading import Recognizer, load_recognizer, save_recognizer
from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration
from gravityocr.model.network.processor import OcrProcessor, make_image_processor
from gravityocr.model.training.recipes import add_run_arguments, read_recipe, run_recipe
from gravityocr.model.training.schedule import LearningRateSchedule, TimeBudget
from gravityocr.model.network.tokenizer import build_char_tokenizer

SIZES = {"tiny": TINY, "small": SMALL}


@dataclass
class CurriculumPhase:
    stage: str  # a curriculum.CURRICULUM stage name
    steps: int  # steps spent in this phase (the last phase runs until the end)
    objective: str | None = None  # overrides TrainConfig.objective (e.g. plain AR until the model reads)
    kind: str | None = None  # only this content type of the stage ("text", "table", "formula")


@dataclass
class TrainConfig:
    output_dir: str = "runs/default"
    size: str = "small"
    objective: str = "joint"
    steps: int = 20000
    batch_size: int = 16
    learning_rate: float = 2e-3
    min_learning_rate: float = 2e-4
    warmup_steps: int = 100
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    block_size: int = 32
    # joint_loss.build_joint_batch: blocks of min_block_size..block_size (0: all block_size),
    # the last block filled up past eos with masks
    min_block_size: int = 0
    pad_final_block: bool = False
    seed: int = 0
    threads: int = 0  # 0: GRAVITYOCR_THREADS, else 1 (on a shared 2-core box one thread beats two)
    device: str = "cpu"
    data_workers: int = 1  # processes rendering crops; a GPU needs many to stay busy
    max_seconds: float = 0.0  # >0: this invocation's time budget; the step count is re-planned to fit it
    vision_frozen_steps: int = 300
    vision_lr_scale: float = 0.1
    replay_fraction: float = 0.25  # share of each batch drawn from earlier curriculum phases
    checkpoint_every: int = 200
    shuffled_loss_every: int = 50
    init_from: str | None = None  # start from these weights (a fresh optimiser)
    max_pixels: int = 28 * 28 * 1024
    # >0: a step runs as length-sorted micro-batches of at most this many padded tokens (same
    # gradient, far less padding when text lines and tables share a batch); 0: one pass
    micro_batch_tokens: int = 0
    curriculum: list[CurriculumPhase] = field(default_factory=lambda: [
        CurriculumPhase(stage.name, 600) for stage in curriculum.CURRICULUM
    ])

    @classmethod
    def from_file(cls, path: str | Path) -> "TrainConfig":
        return read_recipe(cls, path, {"curriculum": CurriculumPhase})

    def validate(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"size must be one of {sorted(SIZES)}, got {self.size!r}")
        Objective(self.objective)
        for phase in self.curriculum:
            stage = curriculum.stage_by_name(phase.stage)
            Objective(phase.objective or self.objective)
            if phase.kind is not None and stage.type_weights.get(phase.kind, 0) <= 0:
                raise ValueError(f"stage {phase.stage!r} has no {phase.kind!r} crops "
                                 f"(it has {sorted(stage.type_weights)})")
        if not self.curriculum:
            raise ValueError("curriculum must have at least one phase")
        if self.data_workers < 1:
            raise ValueError(f"data_workers must be at least 1, got {self.data_workers}")
        if self.micro_batch_tokens < 0:
            raise ValueError(f"micro_batch_tokens must be 0 (one pass) or positive, got {self.micro_batch_tokens}")
        if self.min_block_size and not 2 <= self.min_block_size <= self.block_size:
            raise ValueError(f"min_block_size must be 0 or in 2..block_size ({self.block_size}), "
                             f"got {self.min_block_size}")

    def phase_at(self, step: int) -> int:
        start = 0
        for index, phase in enumerate(self.curriculum):
            start += phase.steps
            if step < start:
                return index
        return len(self.curriculum) - 1

    def objective_at(self, step: int) -> Objective:
        return Objective(self.curriculum[self.phase_at(step)].objective or self.objective)

    def resolved_threads(self) -> int:
        return self.threads or int(os.environ.get("GRAVITYOCR_THREADS", "1"))


@dataclass
class StepLosses:
    """One step's losses, summed over its micro-batches."""

    total: float
    ar: float
    denoise: float


@dataclass
class TrainProgress:
    step: int
    loss: float
    ar_loss: float
    denoise_loss: float
    shuffled_loss: float | None
    samples_per_second: float
    phase: str


def sample_for_step(config: TrainConfig, step: int, index: int) -> tuple[int, curriculum.CurriculumStage, str | None]:
    """Which crop the index-th sample of `step` is (seed, stage, content type or None for
    the stage's mix): deterministic, so a resumed run sees exactly the data an uninterrupted
    one would."""
    seed = config.seed * 1_000_003 + step * config.batch_size + index
    rng = random.Random(seed)
    phase = config.phase_at(step)
    if phase > 0 and rng.random() < config.replay_fraction:
        phase = rng.randrange(phase)
    chosen = config.curriculum[phase]
    return seed % 10**9, curriculum.stage_by_name(chosen.stage), chosen.kind


def encode_crop(processor: OcrProcessor, crop: synthetic.SyntheticCrop) -> TrainingSample:
    prompt = processor.encode(crop.image, crop.type)
    text_ids = processor.tokenizer.encode(crop.text, add_special_tokens=False)
    return TrainingSample(prompt, text_ids + processor.eos_token_ids)


@dataclass
class StepBatch:
    """One step's training input, built in a loader worker so the training process only
    moves tensors to the device (measured on an H200: building joint batches in the main
    process capped a step of 64 crops at ~2.5/s, the GPU mostly idle)."""

    step: int
    joint: JointBatch
    shuffled: JointBatch | None  # AR-only batch with images rolled across samples, on logging steps


def shuffled_image_samples(samples: list[TrainingSample]) -> list[TrainingSample]:
    """Each sample given the next sample's image (rolled prompts keep lengths consistent)."""
    return [TrainingSample(samples[(i + 1) % len(samples)].prompt, sample.target_ids)
            for i, sample in enumerate(samples)]


def step_generator(config: TrainConfig, step: int) -> torch.Generator:
    """Corruption ratios and block offsets of one step: a function of the step alone, so a
    resumed run, and any number of workers, draw what an uninterrupted run would."""
    return torch.Generator().manual_seed(config.seed * 1_000_003 + step)


class CropBatches(torch.utils.data.IterableDataset):
    """Renders, encodes and lays out the batches of steps [start, end) in worker processes
    (end: the configured step count unless given; a time budget may end the run earlier).

    Worker k of n takes steps start+k, start+k+n, ...: the loader reads its workers in
    turn, so batches arrive in step order whatever the number of workers. The model is
    read only for its token ids and rope positions (no weights, no device)."""

    def __init__(self, config: TrainConfig, processor: OcrProcessor, model: GravityOcrForConditionalGeneration,
                 start: int, end: int | None = None):
        self.config, self.processor, self.model, self.start = config, processor, model, start
        self.end = config.steps if end is None else end

    def batch_for_step(self, step: int) -> StepBatch:
        samples = []
        for index in range(self.config.batch_size):
            seed, stage, kind = sample_for_step(self.config, step, index)
            samples.append(encode_crop(self.processor, synthetic.generate_crop(seed, stage, kind)))
        joint = build_joint_batch(self.model, samples, self.config.objective_at(step), self.config.block_size,
                                  generator=step_generator(self.config, step),
                                  min_block_size=self.config.min_block_size,
                                  pad_final_block=self.config.pad_final_block)
        shuffled = None
        if step % self.config.shuffled_loss_every == 0:
            shuffled = build_joint_batch(self.model, shuffled_image_samples(samples), Objective.AR_ONLY,
                                         self.config.block_size, random_block_offset=False)
        return StepBatch(step, joint, shuffled)

    def __iter__(self) -> Iterator[StepBatch]:
        worker = torch.utils.data.get_worker_info()
        index, count = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        if worker is not None:
            torch.set_num_threads(1)  # rendering is single-threaded; many workers share the cores
        for step in range(self.start + index, self.end, count):
            yield self.batch_for_step(step)


def rescale_fresh_model(model: GravityOcrForConditionalGeneration) -> None:
    """Init scales that let a from-scratch model use its image (measured: GLM's post-block
    norms with gain 1 swamp token vectors initialised at std 0.02)."""
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 0.1)
        model.mask_embedding.normal_(0.0, 0.1)
        for layer in model.model.language_model.layers:
            layer.post_self_attn_layernorm.weight.fill_(0.05)
            layer.post_mlp_layernorm.weight.fill_(0.05)


def build_fresh_recognizer(config: TrainConfig) -> Recognizer:
    torch.manual_seed(config.seed)
    tokenizer = build_char_tokenizer()
    model = GravityOcrForConditionalGeneration(build_config(tokenizer, SIZES[config.size]))
    rescale_fresh_model(model)
    image_processor = make_image_processor(patch_size=model.config.vision_config.patch_size,
                                           max_pixels=config.max_pixels)
    processor = OcrProcessor(tokenizer, image_processor, max_context=model.config.text_config.max_position_embeddings)
    return Recognizer(model, processor)


def parameter_groups(model: GravityOcrForConditionalGeneration, config: TrainConfig) -> list[dict]:
    """GLM-OCR's vision tower trains at `vision_lr_scale`; the pretrained PP-OCRv6 strip
    tower and its reading classifier stay frozen (only their projections into the decoder
    train)."""
    vision_weights, decoder = [], []
    for name, parameter in model.named_parameters():
        if name.startswith(("strip_vision.recognizer.", "strip_vision.reading_head.")):
            parameter.requires_grad_(False)
        elif name.startswith("model.visual."):
            if name.endswith(".bias"):
                parameter.requires_grad_(False)  # measured: trainable vision biases feed the collapse
            else:
                vision_weights.append(parameter)
        else:
            decoder.append(parameter)
    return [
        {"params": decoder, "lr_scale": 1.0},
        {"params": vision_weights, "lr_scale": config.vision_lr_scale},
    ]


def set_vision_trainable(model: GravityOcrForConditionalGeneration, trainable: bool) -> None:
    """GLM-OCR's vision tower only: a strip tower stays frozen (see `parameter_groups`)."""
    if not hasattr(model.model, "visual"):
        return
    for name, parameter in model.model.visual.named_parameters():
        parameter.requires_grad_(trainable and not name.endswith(".bias"))


class Trainer:
    def __init__(self, config: TrainConfig):
        config.validate()
        self.config = config
        self.output = Path(config.output_dir)
        self.checkpoint_dir = self.output / "checkpoint"
        torch.set_num_threads(config.resolved_threads())
        self.step = 0
        if (self.checkpoint_dir / "trainer_state.pt").exists():
            self.recognizer = load_recognizer(self.checkpoint_dir)
        else:
            self.recognizer = load_recognizer(config.init_from) if config.init_from else build_fresh_recognizer(config)
        self.model = self.recognizer.model.to(config.device).train()
        groups = parameter_groups(self.model, config)
        self.optimizer = torch.optim.AdamW(groups, lr=config.learning_rate, weight_decay=config.weight_decay)
        self.requested_steps = config.steps  # before a time budget shortens the run
        plan = {"end_step": config.steps}
        if (self.checkpoint_dir / "trainer_state.pt").exists():
            state = torch.load(self.checkpoint_dir / "trainer_state.pt", weights_only=False)
            self.optimizer.load_state_dict(state["optimizer"])
            self.step = state["step"]
            # Asked for the same run again: go on with its plan (a budget may have shortened it)
            # rather than with the schedule of the configured length until the budget re-plans.
            if state.get("requested_steps") == config.steps:
                plan = state["schedule"]
                config.steps = plan["end_step"]
        self.schedule = LearningRateSchedule(config.learning_rate, config.min_learning_rate, config.warmup_steps, **plan)
        self.log_path = self.output / "train_log.jsonl"

    def _vision_trainable_now(self) -> bool:
        return self.step >= self.config.vision_frozen_steps

    def train_step(self, batch: StepBatch) -> StepLosses:
        if batch.step != self.step:
            raise RuntimeError(f"the loader delivered step {batch.step} for step {self.step}")
        set_vision_trainable(self.model, self._vision_trainable_now())
        lr = self.schedule.rate(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        objective = self.config.objective_at(self.step)
        counts = TargetCounts.of(batch.joint)
        self.optimizer.zero_grad(set_to_none=True)
        sums = []  # each micro-batch's losses (StepLosses' order): they add up to the step's
        for micro in split_by_length(batch.joint, self.config.micro_batch_tokens):
            parts = joint_loss(self.model, micro.batch, objective, counts)
            parts.total.backward()
            sums.append(torch.stack([parts.total, parts.ar, parts.denoise]).detach())
        torch.nn.utils.clip_grad_norm_([p for group in self.optimizer.param_groups for p in group["params"]],
                                       self.config.clip_norm)
        self.optimizer.step()
        return StepLosses(*torch.stack(sums).sum(dim=0).tolist())

    @torch.no_grad()
    def shuffled_image_loss(self, shuffled: JointBatch) -> float:
        """AR loss with each sample given another sample's image: equal to the real loss
        while the model ignores the image."""
        return joint_loss(self.model, shuffled, Objective.AR_ONLY).ar.item()

    def save_checkpoint(self) -> None:
        write_checkpoint(self.checkpoint_dir, self.recognizer, {
            "optimizer": self.optimizer.state_dict(), "step": self.step,
            "requested_steps": self.requested_steps, "schedule": self.schedule.plan(),
            "config": dataclasses.asdict(self.config)})

    def replan(self, end_step: int) -> None:
        """End the run at `end_step`; the learning rate goes on from where it is."""
        self.config.steps = end_step
        self.schedule.retarget(self.step, end_step)
        self._write_config()

    def _write_config(self) -> None:
        (self.output / "train_config.json").write_text(json.dumps(dataclasses.asdict(self.config), indent=2))

    def run(self, progress_bar: bool = True) -> list[TrainProgress]:
        self.output.mkdir(parents=True, exist_ok=True)
        drop_log_records_after(self.log_path, self.step)
        self._write_config()
        if self.step >= self.config.steps:
            return []  # the plan is done (a time budget may have ended it before the steps asked for)
        loader = torch.utils.data.DataLoader(
            CropBatches(self.config, self.recognizer.processor, self.model, self.step, self.requested_steps),
            batch_size=None,
            num_workers=self.config.data_workers, prefetch_factor=4, persistent_workers=False,
            # forked workers share the model object unpickled, never touching its (GPU) weights
            multiprocessing_context="fork" if "fork" in multiprocessing.get_all_start_methods() else None,
        )
        history: list[TrainProgress] = []
        bar = tqdm(total=self.config.steps, initial=self.step, disable=not progress_bar, unit="step", dynamic_ncols=True)
        started = time.perf_counter()
        first_step = self.step
        budget = TimeBudget(self.config.max_seconds, first_step, self.requested_steps) if self.config.max_seconds > 0 else None
        with self.log_path.open("a") as log:
            for batch in loader:
                losses = self.train_step(batch)
                loss, ar, denoise = losses.total, losses.ar, losses.denoise
                shuffled = self.shuffled_image_loss(batch.shuffled) if batch.shuffled is not None else None
                self.step += 1
                elapsed = time.perf_counter() - started
                rate = (self.step - first_step) * self.config.batch_size / max(elapsed, 1e-9)
                record = TrainProgress(self.step, loss, ar, denoise, shuffled, rate,
                                       self.config.curriculum[self.config.phase_at(self.step - 1)].stage)
                history.append(record)
                log.write(json.dumps(dataclasses.asdict(record)) + "\n")
                log.flush()
                postfix = {"loss": f"{loss:.3f}", "ar": f"{ar:.3f}", "samples/s": f"{rate:.1f}", "phase": record.phase}
                if shuffled is not None:
                    postfix["ar_shuffled"] = f"{shuffled:.3f}"
                bar.set_postfix(postfix)
                bar.update(1)
                if budget is not None:
                    end_step = budget.planned_end(self.step, elapsed, self.config.steps)
                    if end_step != self.config.steps:
                        self.replan(end_step)
                        bar.total = end_step
                if self.step % self.config.checkpoint_every == 0 or self.step >= self.config.steps:
                    self.save_checkpoint()
                if self.step >= self.config.steps:
                    break  # a re-planned budget ends before the loader's last batch
        bar.close()
        return history


def write_checkpoint(directory: Path, recognizer: Recognizer, state: dict) -> None:
    """Weights (Hugging Face format) and `state` as trainer_state.pt, swapped in whole: a run
    killed at any moment leaves the previous checkpoint or this one, never half of each."""
    staging = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    save_recognizer(recognizer, staging)
    torch.save(state, staging / "trainer_state.pt")
    previous = directory.with_name(directory.name + ".old")
    shutil.rmtree(previous, ignore_errors=True)
    if directory.exists():
        directory.rename(previous)
    staging.rename(directory)
    shutil.rmtree(previous, ignore_errors=True)


def drop_log_records_after(log_path: Path, step: int) -> None:
    """Steps logged after the last checkpoint are redone on resume: keep one record per step."""
    if not log_path.exists():
        return
    kept = [line for line in log_path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
    log_path.write_text("".join(line + "\n" for line in kept))


def add_arguments(parser) -> None:
    add_run_arguments(parser, "train_log.jsonl")
    parser.add_argument("--data-workers", type=int, help="crop-rendering processes (overrides the config)")


def run(args) -> int:
    return run_recipe(args, TrainConfig, {"curriculum": CurriculumPhase}, Trainer,
                      ("output_dir", "init_from", "seed", "steps", "threads", "device", "data_workers", "max_seconds"))
