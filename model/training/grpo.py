"""`gravityocr grpo`: GRPO through the causal AR path with task-aware OCR rewards, the
paper's last training stage.

For each synthetic crop a group of responses is sampled from the AR path and scored against
the target with its content type's own metric (edit similarity for text, TEDS with cell
content for tables, canonical-LaTeX edit similarity for formulas). Each response's advantage
is its reward standardised within its group, and the loss raises the AR log-probability of
the responses that beat their group. Only AR log-probabilities enter the policy loss; the
drafter shares the weights, so with `denoise_weight` > 0 the step also takes the denoising
term of the joint objective on its crops' true targets, to keep the drafts agreeing with the
moving verifier (docs/training-log.md: what the drafts lost without it).
One update per sampled batch, so the clipped importance ratio of PPO is always 1 and the
loss is the plain policy gradient; an optional k3 KL term keeps the policy near its start.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from gravityocr.model.training import curriculum, synthetic
from gravityocr.model.training.joint_loss import IGNORE, JointBatch, Objective, TargetCounts, TrainingSample, backward_in_micro_batches, \
    build_joint_batch, joint_logits, split_by_length
from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer
from gravityocr.model.evaluation.scores import score
from gravityocr.model.training.recipes import add_run_arguments, read_recipe, run_recipe
from gravityocr.model.training.rollouts import sample_group
from gravityocr.model.training.schedule import LearningRateSchedule
from gravityocr.model.training.train import drop_log_records_after, parameter_groups, write_checkpoint


@dataclass
class CropSource:
    stage: str  # a curriculum.CURRICULUM stage name
    kind: str | None = None  # only this content type of the stage; None: the stage's own mix


@dataclass
class GrpoConfig:
    output_dir: str = "runs/grpo"
    init_from: str = str(DEFAULT_MODEL_DIR)
    steps: int = 500
    prompts_per_step: int = 4
    group_size: int = 8
    temperature: float = 1.0
    extra_tokens: int = 16  # a response may run this far past its target's length before it is cut
    learning_rate: float = 2e-5  # constant after the warm-up
    warmup_steps: int = 10
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    vision_lr_scale: float = 0.1
    kl_weight: float = 0.0  # >0: k3 KL to the starting weights (one more forward pass a step)
    micro_batch_tokens: int = 0  # >0: the loss pass in length-sorted micro-batches of this many tokens
    denoise_weight: float = 0.0  # >0: plus this times the denoising loss on the crops' true targets
    block_size: int = 32  # draft block of that denoising term
    seed: int = 0
    threads: int = 1
    device: str = "cpu"
    max_seconds: float = 0.0  # >0: stop (after a checkpoint) once this invocation has run this long
    checkpoint_every: int = 25
    sources: list[CropSource] = field(default_factory=lambda: [CropSource("hard")])

    @classmethod
    def from_file(cls, path: str | Path) -> "GrpoConfig":
        return read_recipe(cls, path, {"sources": CropSource})

    def validate(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be at least 2 (advantages compare a group's members), got {self.group_size}")
        if self.prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be at least 1, got {self.prompts_per_step}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if self.micro_batch_tokens < 0:
            raise ValueError(f"micro_batch_tokens must be 0 (one pass) or positive, got {self.micro_batch_tokens}")
        if self.denoise_weight < 0:
            raise ValueError(f"denoise_weight must be 0 (off) or positive, got {self.denoise_weight}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be at least 2, got {self.block_size}")
        if not self.sources:
            raise ValueError("sources must name at least one stage to draw crops from")
        for source in self.sources:
            stage = curriculum.stage_by_name(source.stage)
            if source.kind is not None and stage.type_weights.get(source.kind, 0) <= 0:
                raise ValueError(f"stage {source.stage!r} has no {source.kind!r} crops (it has {sorted(stage.type_weights)})")


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Rewards (groups, members) standardised within each group; a group whose members all
    scored alike teaches nothing and gets zeros."""
    spread = rewards.std(dim=1, unbiased=False, keepdim=True)
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return torch.where(spread > 1e-6, centred / spread.clamp_min(1e-6), torch.zeros_like(centred))


def response_log_probs(model, batch: JointBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token AR log-probabilities of an AR-only batch's responses (N, T), and where the
    response tokens are (N, T) bool."""
    logits = joint_logits(model, batch).float() / temperature
    targets = batch.ar_targets.to(logits.device)
    taken = targets != IGNORE
    log_probs = -F.cross_entropy(logits.transpose(1, 2), targets.clamp_min(0), reduction="none")
    return log_probs * taken, taken


def policy_loss(model, batch: JointBatch, advantages: torch.Tensor, tokens: int, temperature: float = 1.0,
                reference=None, kl_weight: float = 0.0) -> tuple[torch.Tensor, float]:
    """The policy-gradient loss of sampled responses with these advantages (one per row),
    summed over tokens and divided by `tokens` (the whole step's response tokens), plus the
    weighted k3 KL to `reference` when one is given; and that KL's value."""
    log_probs, taken = response_log_probs(model, batch, temperature)
    loss = -(advantages.to(log_probs.device)[:, None] * log_probs).sum() / tokens
    if reference is None:
        return loss, 0.0
    with torch.no_grad():
        reference_log_probs, _ = response_log_probs(reference, batch, temperature)
    gap = reference_log_probs - log_probs
    kl = ((gap.exp() - gap - 1) * taken).sum() / tokens  # k3: unbiased and never negative
    return loss + kl_weight * kl, float(kl.detach())


@dataclass
class GrpoProgress:
    step: int
    reward: float  # mean over every sampled response of the step
    reward_by_type: dict[str, float]
    loss: float
    kl: float
    denoise: float  # the drafter's denoising loss on the crops' true targets (0 when off)
    informative_groups: float  # share of groups whose members scored differently
    response_tokens: float  # mean sampled length
    seconds: float


class GrpoTrainer:
    def __init__(self, config: GrpoConfig):
        config.validate()
        self.config = config
        self.output = Path(config.output_dir)
        self.checkpoint_dir = self.output / "checkpoint"
        self.log_path = self.output / "grpo_log.jsonl"
        torch.set_num_threads(config.threads)
        resuming = (self.checkpoint_dir / "trainer_state.pt").exists()
        self.recognizer = load_recognizer(self.checkpoint_dir if resuming else config.init_from)
        self.model = self.recognizer.model.to(config.device).train()
        self.processor = self.recognizer.processor
        self.reference = None
        if config.kl_weight > 0:
            reference = load_recognizer(config.init_from).model if resuming else copy.deepcopy(self.model)
            self.reference = reference.to(config.device).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(parameter_groups(self.model, config), lr=config.learning_rate,
                                           weight_decay=config.weight_decay)
        self.schedule = LearningRateSchedule(config.learning_rate, config.learning_rate, config.warmup_steps,
                                             config.steps)
        self.step = 0
        if resuming:
            state = torch.load(self.checkpoint_dir / "trainer_state.pt", weights_only=False)
            self.optimizer.load_state_dict(state["optimizer"])
            self.step = state["step"]

    def crop_for(self, step: int, index: int) -> synthetic.SyntheticCrop:
        """The index-th crop of `step`: a function of the two alone, so a resumed run sees the
        crops an uninterrupted one would (seeds below 10^9, apart from the held-out set's)."""
        seed = (self.config.seed * 1_000_003 + step * self.config.prompts_per_step + index) % 10**9
        source = random.Random(seed).choice(self.config.sources)
        return synthetic.generate_crop(seed, curriculum.stage_by_name(source.stage), source.kind)

    def step_generator(self, step: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.config.seed * 1_000_003 + step)

    def rollouts(self, step: int) -> tuple[list[TrainingSample], list[TrainingSample], list[str], torch.Tensor]:
        """Every prompt's group of sampled responses as training samples, each prompt with its
        true target, the prompts' content types, and the rewards (prompts, group)."""
        self.model.eval()
        generator = self.step_generator(step)
        samples, truths, types, rewards = [], [], [], []
        for index in range(self.config.prompts_per_step):
            crop = self.crop_for(step, index)
            prompt = self.processor.encode(crop.image, crop.type)
            target = self.processor.tokenizer.encode(crop.text, add_special_tokens=False) + self.processor.eos_token_ids
            responses = sample_group(self.model, prompt, self.config.group_size,
                                     len(target) + self.config.extra_tokens, set(self.processor.eos_token_ids),
                                     self.config.temperature, generator)
            samples += [TrainingSample(prompt, response) for response in responses]
            truths.append(TrainingSample(prompt, target))
            types.append(crop.type)
            rewards.append([score(crop.type, self.processor.decode(response), crop.text) for response in responses])
        self.model.train()
        return samples, truths, types, torch.tensor(rewards, dtype=torch.float32)

    def drafter_loss_backward(self, truths: list[TrainingSample], step: int) -> float:
        """Backpropagates the weighted denoising loss of the crops' true targets; returns that loss."""
        batch = build_joint_batch(self.model, truths, Objective.NO_AR, self.config.block_size,
                                  generator=self.step_generator(step))
        parts, _ = backward_in_micro_batches(self.model, batch, Objective.NO_AR, self.config.micro_batch_tokens,
                                             self.config.denoise_weight)
        return float(parts.denoise)

    def train_step(self) -> GrpoProgress:
        started = time.perf_counter()
        samples, truths, types, rewards = self.rollouts(self.step)
        advantages = group_advantages(rewards).flatten()
        lr = self.schedule.rate(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        self.optimizer.zero_grad(set_to_none=True)
        learning = [i for i in range(len(samples)) if advantages[i] != 0]  # zero advantage: no gradient
        loss_total, kl_total, denoise = 0.0, 0.0, 0.0
        if learning:
            batch = build_joint_batch(self.model, [samples[i] for i in learning], Objective.AR_ONLY,
                                      random_block_offset=False)
            tokens = TargetCounts.of(batch).ar
            for micro in split_by_length(batch, self.config.micro_batch_tokens):
                loss, kl = policy_loss(self.model, micro.batch, advantages[[learning[i] for i in micro.indices]],
                                       tokens, self.config.temperature, self.reference, self.config.kl_weight)
                loss.backward()
                loss_total += float(loss.detach())
                kl_total += kl
        if self.config.denoise_weight > 0:
            denoise = self.drafter_loss_backward(truths, self.step)
        if learning or self.config.denoise_weight > 0:
            torch.nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]],
                                           self.config.clip_norm)
            self.optimizer.step()
        self.step += 1
        by_type = {kind: float(rewards[[i for i, t in enumerate(types) if t == kind]].mean())
                   for kind in sorted(set(types))}
        informative = float((rewards.std(dim=1, unbiased=False) > 1e-6).float().mean())
        lengths = sum(len(sample.target_ids) for sample in samples) / len(samples)
        return GrpoProgress(self.step, float(rewards.mean()), by_type, loss_total, kl_total, denoise, informative,
                            lengths, time.perf_counter() - started)

    def save_checkpoint(self) -> None:
        write_checkpoint(self.checkpoint_dir, self.recognizer, {
            "optimizer": self.optimizer.state_dict(), "step": self.step, "config": dataclasses.asdict(self.config)})

    def run(self, progress_bar: bool = True) -> list[GrpoProgress]:
        self.output.mkdir(parents=True, exist_ok=True)
        drop_log_records_after(self.log_path, self.step)
        (self.output / "grpo_config.json").write_text(json.dumps(dataclasses.asdict(self.config), indent=2))
        history: list[GrpoProgress] = []
        bar = tqdm(total=self.config.steps, initial=self.step, disable=not progress_bar, unit="step", dynamic_ncols=True)
        started = time.perf_counter()
        with self.log_path.open("a") as log:
            while self.step < self.config.steps:
                record = self.train_step()
                history.append(record)
                log.write(json.dumps(dataclasses.asdict(record)) + "\n")
                log.flush()
                bar.set_postfix({"reward": f"{record.reward:.3f}", "loss": f"{record.loss:.3f}"})
                bar.update(1)
                out_of_time = 0 < self.config.max_seconds <= time.perf_counter() - started
                if self.step % self.config.checkpoint_every == 0 or self.step >= self.config.steps or out_of_time:
                    self.save_checkpoint()
                if out_of_time:
                    break
        bar.close()
        return history


def add_arguments(parser) -> None:
    add_run_arguments(parser, "grpo_log.jsonl")


def run(args) -> int:
    return run_recipe(args, GrpoConfig, {"sources": CropSource}, GrpoTrainer,
                      ("output_dir", "init_from", "seed", "steps", "threads", "device", "max_seconds"))
