"""The batched passes as data: what each row feeds the decoder, where it sits, what it sees.

Every pass of the engine is a `PassLayout` run by `ModelRunner.run`: the prefill of
newcomers (image + prompt, then the masks that draft the first round or the reading's
first tokens to verify), a draft pass
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
    image_embeds: torch.Tensor | None = None  # prefill: what fills the rows' image placeholders
    first_positions: list[int] | None = None  # prefill: each row's first response position
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


def prefill_layout(model, sequences: list[Sequence], image_embeds: torch.Tensor, blocks: list[int],
                   drafts: list[list[int]], mask_id: int, pad_id: int, device: torch.device) -> PassLayout:
    """Image + prompt of each newcomer (prompts right-padded), each followed either by its
    `blocks[i]` masks, which see their prompt and each other, or by `drafts[i]` under
    causal attention (a verify pass of its first tokens; none: neither). The logits wanted:
    each row's last prompt token (its first response token), then its masks after the
    first (drafts for the tokens after that one; d_1 drafts the first token itself), or
    each of its drafts (the greedy token after it). `image_embeds`: what fills the rows'
    image placeholders, from `ModelRunner.encode`."""
    prompts = [s.request.prompt for s in sequences]
    lengths = [p.length for p in prompts]
    tails = [block if block else len(row_drafts) for block, row_drafts in zip(blocks, drafts)]
    n, width = len(prompts), max(length + tail for length, tail in zip(lengths, tails))
    ids = torch.full((n, width), pad_id, dtype=torch.long, device=device)
    positions = torch.zeros(3, n, width, dtype=torch.long, device=device)
    first_positions = []  # rope position of each row's first response token
    wanted = []  # per row: the positions whose logits are wanted
    for i, prompt in enumerate(prompts):
        prompt_ids = prompt.input_ids.to(device)
        rope, first = model.rope_positions(prompt_ids, prompt.image_grid_thw.to(device))
        length = prompt.length
        ids[i, :length] = prompt_ids[0]
        if blocks[i]:
            ids[i, length:length + blocks[i]] = mask_id
            wanted.append([length - 1] + list(range(length + 1, length + blocks[i])))
        else:
            ids[i, length:length + len(drafts[i])] = torch.tensor(drafts[i], dtype=torch.long, device=device)
            wanted.append(list(range(length - 1, length + len(drafts[i]))))
        positions[:, i, :length] = rope[:, 0]
        positions[:, i, length:] = first + torch.arange(width - length, device=device)
        first_positions.append(first)
    slots = [s.slot for s in sequences]
    if slots != list(range(slots[0], slots[0] + n)):
        raise RuntimeError(f"newcomers must take consecutive slots, got {slots}")
    length_tensor, block_tensor = _as_tensor(lengths, device), _as_tensor(blocks, device)
    t = torch.arange(width, device=device)
    query, key = t[None, :, None], t[None, None, :]
    start, end = length_tensor[:, None, None], (length_tensor + block_tensor)[:, None, None]
    is_mask = (query >= start) & (query < end)
    # the prompt and drafts causal; the masks see the prompt and each other; padding what is before it
    pattern = torch.where(is_mask, key < end, key <= query)
    # Logits only where needed: over whole prompts they would be rows x width x vocabulary.
    # Rows with fewer wanted positions repeat their last one; its logits are not read.
    k = max(len(row) for row in wanted)
    columns = _as_tensor([row + row[-1:] * (k - len(row)) for row in wanted], device)
    return PassLayout(ids, positions, [0] * n, pattern, first_slot=slots[0], columns=columns,
                      image_embeds=image_embeds, first_positions=first_positions)


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
