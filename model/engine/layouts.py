"""The batched passes as data: what each row feeds the decoder, where it sits, what it sees.

Every pass of the engine is a `PassLayout` run by `ModelRunner.run`: the prefill of
newcomers (image + prompt, then the masks that draft the first round), a draft pass
[x, M x b], a verify pass [y, d_2..d_b] and an AR step [x]. Rows have different cache
lengths, prompt lengths and blocks; inputs are padded to a rectangle and the pattern gives
each row exactly the attention the single-sequence reference (`model/decode/reference.py`) gives it,
so every committed token is the same argmax. Padding only ever comes after a row's real
tokens and is never attended to by them; its KV lands beyond the row's length and is
dropped like a rejected draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gravityocr.model.decode.reading_drafts import ReadingIndex
from gravityocr.model.engine.sequence import Sequence


@dataclass
class PassLayout:
    """One batched forward pass over n rows in consecutive cache slots from `first_slot`.

    Row i writes the KV of its q new tokens after its `past[i]` cached tokens and sees its
    cache, and among the new tokens what `pattern` allows ((n, q, q) or (q, q) for all
    rows; every query row allows at least one key). `columns` picks the positions whose
    logits are wanted (None: all q)."""

    ids: torch.Tensor  # (n, q) token ids (mask and image placeholders included)
    positions: torch.Tensor  # (3, n, q) rope positions
    past: list[int]  # per row: cached tokens before the new ones (host values)
    pattern: torch.Tensor
    first_slot: int = 0
    columns: torch.Tensor | None = None  # (n, k) indices into the q new tokens
    pixel_values: torch.Tensor | None = None  # prefill: the rows' images, concatenated
    image_grid_thw: torch.Tensor | None = None
    first_positions: list[int] | None = None  # prefill: each row's first response position
    # written by `ModelRunner.run` for a prefill of a model with a reading prefix: each row's
    # reading with the eos, what reading drafts and copy tokens are read from
    # (model/decode/reading_drafts.py)
    readings: list[ReadingIndex] | None = None
    # (n, q) each position's copy token, for a model that copies its reading (NO_COPY: none)
    copy_ids: torch.Tensor | None = None


def _as_tensor(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def _causal(n: int, device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def running_rows(sequences: list[Sequence], cache_lengths: list[int]) -> list[int]:
    """The cached lengths of the running sequences, which must fill slots 0..n-1 in order
    (every pass reads the cache as a view of its first n slots)."""
    slots = [s.slot for s in sequences]
    if slots != list(range(len(slots))):
        raise RuntimeError(f"running sequences must fill slots 0..n-1, got {slots}")
    return [cache_lengths[slot] for slot in slots]


def prefill_layout(model, sequences: list[Sequence], blocks: list[int], mask_id: int, pad_id: int,
                   device: torch.device) -> PassLayout:
    """Image + prompt of each newcomer (prompts right-padded), each followed by its
    `blocks[i]` masks (none: 0), which see their prompt and each other. The logits wanted:
    each row's last prompt token (its first response token), then its masks after the
    first (drafts for the tokens after that one; d_1 drafts the first token itself)."""
    prompts = [s.request.prompt for s in sequences]
    lengths = [p.length for p in prompts]
    n, width = len(prompts), max(length + block for length, block in zip(lengths, blocks))
    ids = torch.full((n, width), pad_id, dtype=torch.long, device=device)
    positions = torch.zeros(3, n, width, dtype=torch.long, device=device)
    first_positions = []  # rope position of each row's first response token
    for i, prompt in enumerate(prompts):
        prompt_ids = prompt.input_ids.to(device)
        rope, first = model.rope_positions(prompt_ids, prompt.image_grid_thw.to(device))
        ids[i, :prompt.length] = prompt_ids[0]
        ids[i, prompt.length:prompt.length + blocks[i]] = mask_id
        positions[:, i, :prompt.length] = rope[:, 0]
        positions[:, i, prompt.length:] = first + torch.arange(width - prompt.length, device=device)
        first_positions.append(first)
    slots = [s.slot for s in sequences]
    if slots != list(range(slots[0], slots[0] + n)):
        raise RuntimeError(f"newcomers must take consecutive slots, got {slots}")
    length_tensor, block_tensor = _as_tensor(lengths, device), _as_tensor(blocks, device)
    t = torch.arange(width, device=device)
    query, key = t[None, :, None], t[None, None, :]
    start, end = length_tensor[:, None, None], (length_tensor + block_tensor)[:, None, None]
    is_mask = (query >= start) & (query < end)
    # the prompt causal; the masks see the prompt and each other; padding what is before it
    pattern = torch.where(is_mask, key < end, key <= query)
    # Logits only where needed: over whole prompts they would be rows x width x vocabulary.
    columns = (length_tensor - 1)[:, None] + torch.cat(
        [torch.zeros(1, dtype=torch.long, device=device), torch.arange(2, max(max(blocks), 1) + 1, device=device)])
    return PassLayout(ids, positions, [0] * n, pattern, first_slot=slots[0], columns=columns.clamp(max=width - 1),
                      pixel_values=torch.cat([p.pixel_values for p in prompts]),
                      image_grid_thw=torch.cat([p.image_grid_thw for p in prompts]), first_positions=first_positions)


def draft_layout(last_tokens: torch.Tensor, x_positions: torch.Tensor, past: list[int], blocks: torch.Tensor,
                 width: int, mask_id: int) -> PassLayout:
    """[x, M x width] per row: x sees itself (and the cache); the row's b real masks see x
    and each other, never the padding masks beyond b; padding masks see everything, so
    that their softmax rows are not empty."""
    n, device = last_tokens.shape[0], last_tokens.device
    ids = torch.cat([last_tokens[:, None], torch.full((n, width), mask_id, device=device)], 1)
    positions = (x_positions[:, None] + torch.arange(1 + width, device=device))[None].expand(3, n, -1)
    t = torch.arange(1 + width, device=device)
    query, key, b = t[None, :, None], t[None, None, :], blocks[:, None, None]
    is_real_mask = (query >= 1) & (query <= b)
    pattern = torch.where(query == 0, key == 0, torch.where(is_real_mask, key <= b, torch.ones_like(is_real_mask)))
    return PassLayout(ids, positions, past, pattern)


def verify_layout(y: torch.Tensor, drafts: torch.Tensor, y_positions: torch.Tensor, past: list[int]) -> PassLayout:
    """[y, d_2..d_width] per row under causal attention, y at `y_positions`, after `past`
    cached tokens."""
    ids = torch.cat([y[:, None], drafts], 1)
    n, q = ids.shape
    positions = (y_positions[:, None] + torch.arange(q, device=ids.device))[None].expand(3, n, -1)
    return PassLayout(ids, positions, past, _causal(q, ids.device))


def ar_layout(last_tokens: torch.Tensor, x_positions: torch.Tensor, past: list[int]) -> PassLayout:
    """[x] per row: one greedy token each."""
    n = last_tokens.shape[0]
    return PassLayout(last_tokens[:, None], x_positions.view(1, n, 1).expand(3, n, 1), past,
                      torch.ones(1, 1, dtype=torch.bool, device=last_tokens.device))
