"""The joint objective: causal next-token loss on the clean stream plus denoising loss on
the masked positions of two complementary corrupted streams, in one forward pass.

`Objective.NO_AR` drops the AR term (the paper's ablation); `Objective.AR_ONLY` trains
the plain causal model (the baseline), without corrupted streams at all.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gravityocr.model.decode.reading_drafts import NO_COPY, ReadingIndex
from gravityocr.model.decode.attention import JointLayout, complementary_mask_choice, joint_attention_mask, joint_position_ids, pad_square_masks
from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration
from gravityocr.model.network.processor import EncodedPrompt

IGNORE = -100


class Objective(str, enum.Enum):
    JOINT = "joint"
    NO_AR = "no_ar"
    AR_ONLY = "ar_only"


@dataclass
class TrainingSample:
    prompt: EncodedPrompt
    target_ids: list[int]  # the response, ending with eos
    # a model that copies its reading (model/decode/reading_drafts.py): the prompt's reading
    # with the eos, as the decoder sees it
    reading: list[int] | None = None


@dataclass
class JointBatch:
    input_ids: torch.Tensor  # (N, T)
    position_ids: torch.Tensor  # (3, N, T)
    attention_mask: torch.Tensor  # (N, 1, T, T) bool
    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    ar_targets: torch.Tensor  # (N, T): target of the logit at each position, IGNORE elsewhere
    denoise_targets: torch.Tensor  # (N, T)
    layouts: list[JointLayout]
    # (N, T) copy tokens of the clean stream's positions (NO_COPY elsewhere); None: the
    # model does not copy its reading
    copy_ids: torch.Tensor | None = None


@dataclass
class LossParts:
    total: torch.Tensor
    ar: torch.Tensor
    denoise: torch.Tensor


@dataclass(frozen=True)
class TargetCounts:
    """How many AR and denoising targets a whole step has: the micro-batches of a step divide
    their summed losses by these, so their losses add up to the step's mean loss."""

    ar: int
    denoise: int

    @classmethod
    def of(cls, batch: JointBatch) -> "TargetCounts":
        return cls(int((batch.ar_targets != IGNORE).sum()), int((batch.denoise_targets != IGNORE).sum()))


@dataclass
class MicroBatch:
    indices: list[int]  # the step batch's samples it holds
    batch: JointBatch


def build_joint_batch(
    model: GravityOcrForConditionalGeneration,
    samples: list[TrainingSample],
    objective: Objective = Objective.JOINT,
    block_size: int = 32,
    random_block_offset: bool = True,
    generator: torch.Generator | None = None,
    min_block_size: int = 0,
    pad_final_block: bool = False,
) -> JointBatch:
    """`min_block_size` > 0: each sample's block size is drawn from min_block_size..block_size,
    so blocks shorter than B, which decoding drafts where a block is cut short by the output
    budget (or by adaptive blocks), occur mid-response. `pad_final_block`: the last block is
    filled up past eos with masks that carry no target, in both streams, as a block of masks
    that runs past the end of a response does in decoding. Without it the only blocks
    shorter than B end at eos, and a drafter learns to write the end of the response at the
    end of any short block (the shipped model was seen closing short blocks with
    `</tr></table><eos>`)."""
    corrupted = objective != Objective.AR_ONLY
    pad_id = model.config.pad_token_id or 0
    copies = bool(getattr(model.config, "reading_copy", False))
    rows, positions, masks, ar_rows, denoise_rows, layouts, copy_rows = [], [], [], [], [], [], []
    for sample in samples:
        prefix = sample.prompt.input_ids
        target = torch.tensor(sample.target_ids, dtype=torch.long)
        size = block_size
        if corrupted and min_block_size > 0:
            size = int(torch.randint(min_block_size, block_size + 1, (1,), generator=generator))
        offset = int(torch.randint(size, (1,), generator=generator)) if random_block_offset else 0
        padding = (-(target.numel() + offset)) % size if corrupted and pad_final_block else 0
        real = target.numel()
        is_padding = torch.arange(real + padding) >= real
        target = torch.cat([target, target[-1:].expand(padding)])  # the clean stream repeats eos
        layout = JointLayout(prefix.shape[1], target.numel(), size, offset, corrupted)
        prefix_positions, first_response = model.rope_positions(prefix, sample.prompt.image_grid_thw)
        P, L = layout.prefix_len, layout.response_len

        ids = [prefix[0], target]
        ar_target = torch.full((layout.total_len,), IGNORE)
        ar_target[P - 1:P - 1 + real] = target[:real]
        denoise_target = torch.full((layout.total_len,), IGNORE)
        if corrupted:
            ratio = float(torch.rand((), generator=generator))
            masked_in_a = complementary_mask_choice(L, ratio, generator)
            for stream_masked, start in ((masked_in_a, P + L), (~masked_in_a, P + 2 * L)):
                ids.append(target.masked_fill(stream_masked | is_padding, model.mask_token_id))
                denoise_target[start:start + L] = target.masked_fill(~stream_masked | is_padding, IGNORE)
        rows.append(torch.cat(ids))
        if copies:
            # the last prompt position predicts token 0, the clean stream's token j-1 predicts
            # token j: each gets the copy token of the text before the token it predicts;
            # the corrupted streams draft without one, as draft passes do
            copy_row = torch.full((layout.total_len,), NO_COPY)
            if sample.reading is not None:
                index = ReadingIndex(sample.reading)
                copy_row[P - 1:P - 1 + real] = torch.tensor(index.copy_tokens(sample.target_ids[:real - 1]))
            copy_rows.append(copy_row)
        positions.append(joint_position_ids(prefix_positions[:, 0], first_response, layout))
        masks.append(joint_attention_mask(layout))
        ar_rows.append(ar_target)
        denoise_rows.append(denoise_target)
        layouts.append(layout)

    total = max(r.numel() for r in rows)

    def pad(tensors, value):
        return torch.stack([F.pad(t, (0, total - t.shape[-1]), value=value) for t in tensors])

    return JointBatch(
        input_ids=pad(rows, pad_id),
        position_ids=pad(positions, 0).permute(1, 0, 2).contiguous(),
        attention_mask=pad_square_masks(masks, total),
        pixel_values=torch.cat([s.prompt.pixel_values for s in samples]),
        image_grid_thw=torch.cat([s.prompt.image_grid_thw for s in samples]),
        ar_targets=pad(ar_rows, IGNORE),
        denoise_targets=pad(denoise_rows, IGNORE),
        layouts=layouts,
        copy_ids=pad(copy_rows, NO_COPY) if copies else None,
    )


def split_by_length(batch: JointBatch, max_tokens: int) -> list[MicroBatch]:
    """The batch's samples sorted by length and cut into groups of at most `max_tokens` padded
    tokens (a longer sample alone), each trimmed to its own longest sample. Why: a step mixes
    text lines of ~100 tokens with tables of ~800, and one padded batch spends 2x the decoder
    work and 3-4x the attention work of its real tokens (measured on the CPU recipe's mix).
    max_tokens 0 keeps the batch whole."""
    lengths = [layout.total_len for layout in batch.layouts]
    if max_tokens <= 0:
        return [MicroBatch(list(range(len(lengths))), batch)]
    groups: list[list[int]] = [[]]
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if groups[-1] and (len(groups[-1]) + 1) * lengths[index] > max_tokens:
            groups.append([])
        groups[-1].append(index)
    # Rows of pixel_values per image: GLM-OCR's patches (t*h*w) or the strip tower's cells
    # (t*h*w / 4): the same share of the batch's rows either way.
    sizes = batch.image_grid_thw.prod(dim=1).tolist()
    rows = [size * batch.pixel_values.shape[0] // max(1, sum(sizes)) for size in sizes]
    patch_starts = list(itertools.accumulate(rows, initial=0))
    micro_batches = []
    for group in groups:
        total = max(lengths[i] for i in group)
        rows = torch.tensor(group)
        micro_batches.append(MicroBatch(group, JointBatch(
            input_ids=batch.input_ids[rows, :total],
            position_ids=batch.position_ids[:, rows, :total],
            attention_mask=batch.attention_mask[rows][:, :, :total, :total],
            pixel_values=torch.cat([batch.pixel_values[patch_starts[i]:patch_starts[i + 1]] for i in group]),
            image_grid_thw=batch.image_grid_thw[rows],
            ar_targets=batch.ar_targets[rows, :total],
            denoise_targets=batch.denoise_targets[rows, :total],
            layouts=[batch.layouts[i] for i in group],
            copy_ids=None if batch.copy_ids is None else batch.copy_ids[rows, :total],
        )))
    return micro_batches


def joint_logits(model: GravityOcrForConditionalGeneration, batch: JointBatch) -> torch.Tensor:
    device = model.device
    image_embeds = torch.cat(model.encode_images(batch.pixel_values.to(device), batch.image_grid_thw.to(device)))
    copy_ids = None if batch.copy_ids is None else batch.copy_ids.to(device)
    embeds = model.embed(batch.input_ids.to(device), image_embeds, copy_ids)
    return model.logits_from_embeds(embeds, batch.position_ids.to(device), batch.attention_mask.to(device),
                                    copy_ids=copy_ids)


def joint_loss(
    model: GravityOcrForConditionalGeneration,
    batch: JointBatch,
    objective: Objective = Objective.JOINT,
    counts: TargetCounts | None = None,
) -> LossParts:
    """Mean losses per target token; with `counts` (a whole step's, for one of its
    micro-batches) the sums are divided by those instead."""
    counts = counts or TargetCounts.of(batch)
    logits = joint_logits(model, batch).float()
    vocab = logits.shape[-1]
    ar_targets = batch.ar_targets.to(logits.device)
    denoise_targets = batch.denoise_targets.to(logits.device)
    ar = F.cross_entropy(logits.view(-1, vocab), ar_targets.view(-1), ignore_index=IGNORE, reduction="sum") / counts.ar
    zero = logits.new_zeros(())
    if objective == Objective.AR_ONLY:
        return LossParts(total=ar, ar=ar, denoise=zero)
    denoise = F.cross_entropy(logits.view(-1, vocab), denoise_targets.view(-1), ignore_index=IGNORE,
                              reduction="sum") / counts.denoise
    total = denoise if objective == Objective.NO_AR else ar + denoise
    return LossParts(total=total, ar=ar, denoise=denoise)


def backward_in_micro_batches(model: GravityOcrForConditionalGeneration, batch: JointBatch, objective: Objective,
                              max_tokens: int, weight: float = 1.0) -> tuple[LossParts, int]:
    """Backpropagates `weight` times the batch's loss through `split_by_length` micro-batches
    (the gradient of one pass); returns the unweighted loss parts, summed over the
    micro-batches and detached, and how many micro-batches there were."""
    counts = TargetCounts.of(batch)
    micro_batches = split_by_length(batch, max_tokens)
    sums = []
    for micro in micro_batches:
        parts = joint_loss(model, micro.batch, objective, counts)
        (weight * parts.total).backward()
        sums.append(torch.stack([parts.total, parts.ar, parts.denoise]).detach())
    total, ar, denoise = torch.stack(sums).sum(dim=0)
    return LossParts(total, ar, denoise), len(micro_batches)
