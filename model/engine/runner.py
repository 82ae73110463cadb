"""The batched forward passes: prefill of newcomers, a self-speculative round (draft +
verify) and a plain AR step, for many sequences at once over the slot cache.

Rows have different cache lengths, prompt lengths and draft blocks; inputs are padded to
a rectangle and the 4-D mask gives each row exactly the attention the single-sequence
reference (`decoding.py`) gives it, so every committed token is the same argmax.
Padding tokens only ever come after a row's real tokens and are never attended to by
them; their KV lands beyond the row's length and is dropped like a rejected draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..structured_drafts import kept_to_structure
from .config import EngineConfig
from .kv_cache import SlotKVCache, rows_attention_mask
from .sequence import Sequence


@dataclass
class SpeculativeRoundOutput:
    """Per row: the AR token y (None for a row that verified drafts it came with, without a
    draft pass), how many drafts were accepted, and what to commit after y (accepted drafts
    + the bonus token), unless the sequence finishes at y."""

    y: list[int | None]
    accepted: list[int]
    after_y: list[list[int]]


@dataclass
class PrefillOutput:
    """Per newcomer: its first response token and the drafts for the tokens after it."""

    first_tokens: list[int]
    drafts: list[list[int]]


def _causal(n: int, device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _draft_pattern(blocks: torch.Tensor, width: int) -> torch.Tensor:
    """(n, 1+width, 1+width) attention among the draft input [x, M x width] of each row:
    x sees itself; the row's b real masks see x and each other (never the padding masks
    beyond b); padding masks see everything, so that their softmax rows are not empty."""
    t = torch.arange(1 + width, device=blocks.device)
    query, key = t[None, :, None], t[None, None, :]
    b = blocks[:, None, None]
    is_real_mask = (query >= 1) & (query <= b)
    return torch.where(query == 0, key == 0, torch.where(is_real_mask, key <= b, torch.ones_like(is_real_mask)))


def _prefill_pattern(lengths: torch.Tensor, blocks: torch.Tensor, width: int) -> torch.Tensor:
    """(n, width, width) attention in the prefill of [prompt, M x block, padding] rows: the
    prompt is causal; the masks see the prompt and each other; padding sees what is
    before it (never seen itself)."""
    t = torch.arange(width, device=lengths.device)
    query, key = t[None, :, None], t[None, None, :]
    length, end = lengths[:, None, None], (lengths + blocks)[:, None, None]
    is_mask = (query >= length) & (query < end)
    return torch.where(is_mask, key < end, key <= query)


class ModelRunner:
    """Owns the model and the slot cache; runs passes, keeps the KV of committed tokens."""

    def __init__(self, model, config: EngineConfig):
        self.model = model
        self.config = config
        self.device = torch.device(config.device)
        self.cache = SlotKVCache.for_model(model.config.text_config, config)
        self.mask_id = model.mask_token_id
        self.pad_id = model.config.pad_token_id or 0
        self.batched_passes = 0

    def _logits(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.batched_passes += 1
        return self.model.logits_from_embeds(self.model.embed(ids), positions, mask, self.cache)

    def _rows(self, sequences: list[Sequence]):
        """Host and device views of the rows; the rows are slots 0..n-1 in order."""
        slots = [s.slot for s in sequences]
        if slots != list(range(len(slots))):
            raise RuntimeError(f"running sequences must fill slots 0..n-1, got {slots}")
        past = [self.cache.lengths[s] for s in slots]
        as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=self.device)
        return slots, past, as_tensor(past), as_tensor([s.tokens[-1] for s in sequences]), \
            as_tensor([s.x_position for s in sequences])

    @torch.no_grad()
    def prefill(self, sequences: list[Sequence], blocks: list[int]) -> PrefillOutput:
        """Image + prompt of each newcomer into its slot (images encoded as one batch,
        prompts right-padded), each followed by its `blocks[i]` masks (none: 0), which see
        their prompt and each other and whose KV is dropped; returns each one's first
        response token and the masks' drafts for the tokens after it."""
        model, device = self.model, self.device
        prompts = [s.request.prompt for s in sequences]
        lengths = [p.length for p in prompts]
        n, width = len(prompts), max(length + block for length, block in zip(lengths, blocks))
        ids = torch.full((n, width), self.pad_id, dtype=torch.long, device=device)
        positions = torch.zeros(3, n, width, dtype=torch.long, device=device)
        for i, (sequence, prompt) in enumerate(zip(sequences, prompts)):
            prompt_ids = prompt.input_ids.to(device)
            rope, first = model.rope_positions(prompt_ids, prompt.image_grid_thw.to(device))
            ids[i, :prompt.length] = prompt_ids[0]
            ids[i, prompt.length:prompt.length + blocks[i]] = self.mask_id
            positions[:, i, :prompt.length] = rope[:, 0]
            positions[:, i, prompt.length:] = first + torch.arange(width - prompt.length, device=device)
            sequence.first_position = first
        pixels = torch.cat([p.pixel_values for p in prompts]).to(device, self.config.dtype)
        grids = torch.cat([p.image_grid_thw for p in prompts]).to(device)
        image_embeds = torch.cat(model.encode_images(pixels, grids))
        embeds = model.embed(ids, image_embeds)

        slots = [s.slot for s in sequences]
        if slots != list(range(slots[0], slots[0] + n)):
            raise RuntimeError(f"newcomers must take consecutive slots, got {slots}")
        past = torch.zeros(n, dtype=torch.long, device=device)
        self.cache.plan(past, width, width, first_slot=slots[0])
        length_tensor = torch.tensor(lengths, dtype=torch.long, device=device)
        block_tensor = torch.tensor(blocks, dtype=torch.long, device=device)
        mask = rows_attention_mask(past, _prefill_pattern(length_tensor, block_tensor, width), width)
        self.batched_passes += 1
        # The LM head runs on each row's last prompt token and its masks only: over whole
        # prompts it would be rows x width x vocabulary logits, gigabytes at GLM-OCR's vocabulary.
        hidden = model.model.language_model(
            inputs_embeds=embeds, position_ids=positions, attention_mask=mask, cache=self.cache, use_cache=True,
        ).last_hidden_state
        # Columns: the last prompt token, then the masks after the first (which drafts the
        # first token itself); past a row's block they only pad.
        columns = (length_tensor - 1)[:, None] + torch.cat(
            [torch.zeros(1, dtype=torch.long, device=device), torch.arange(2, max(max(blocks), 1) + 1, device=device)])
        picked = hidden.gather(1, columns.clamp(max=width - 1)[..., None].expand(-1, -1, hidden.shape[-1]))
        logits = model.lm_head(picked)
        rows = logits.argmax(-1).tolist()  # the one device-to-host transfer
        for slot, length in zip(slots, lengths):
            self.cache.lengths[slot] = length
        output = PrefillOutput([], [])
        for row, block in zip(rows, blocks):
            output.first_tokens.append(row[0])
            output.drafts.append(row[1:block])
        return output

    @torch.no_grad()
    def speculative_round(self, sequences: list[Sequence], blocks: list[int],
                          shapes: list | None = None) -> SpeculativeRoundOutput:
        """Draft pass [x, M x b] then verify pass [y, d_2..d_b] for every row, with one
        device-to-host transfer at the end. A row that came with drafts (its prefill's)
        verifies [x, drafts] instead and its draft-pass row, if the pass runs for others,
        is ignored; its block is 1 + its drafts. Rows that finish at y are verified anyway
        (the result is ignored) so that no transfer is needed between the two passes.
        With `shapes` (per row: what its committed tokens say of a formula, or None), the
        drafted rows' drafts are kept to that structure between the passes: a
        second transfer, for devices where the drafts are in host memory anyway."""
        device, n, width = self.device, len(sequences), max(blocks)
        # Every host-to-device copy of the round happens here, before its first kernel.
        slots, past_host, past, last_tokens, x_positions = self._rows(sequences)
        block_sizes = torch.tensor(blocks, dtype=torch.long, device=device)
        came_with = [s.drafts for s in sequences]
        has_drafts = torch.tensor([bool(d) for d in came_with], device=device)
        given = torch.tensor([d + [self.pad_id] * (width - 1 - len(d)) for d in came_with], dtype=torch.long,
                             device=device).view(n, width - 1) if any(came_with) else None
        read_len = max(past_host) + 1 + width
        positions = (x_positions[:, None] + torch.arange(1 + width, device=device))[None].expand(3, n, -1)

        if all(came_with):
            y, drafts = last_tokens, given
        else:
            draft_ids = torch.cat([last_tokens[:, None], torch.full((n, width), self.mask_id, device=device)], 1)
            self.cache.plan(past, 1 + width, read_len)
            draft_mask = rows_attention_mask(past, _draft_pattern(block_sizes, width), read_len)
            draft_logits = self._logits(draft_ids, positions, draft_mask)
            # d_1 drafts y's own position: drafts are d_2..d_width. A row that came with
            # drafts verifies from x: x's KV is written again by the verify pass.
            y, drafts = draft_logits[:, 0].argmax(-1), draft_logits[:, 2:].argmax(-1)
            if shapes is not None:
                drafts, block_sizes = self._kept_to_structure(shapes, came_with, y, drafts, block_sizes)
            if given is not None:
                y = torch.where(has_drafts, last_tokens, y)
                drafts = torch.where(has_drafts[:, None], given, drafts)

        verify_ids = torch.cat([y[:, None], drafts], 1)
        verify_past = past + (~has_drafts).long()  # after x, or at x for a row verifying from x
        self.cache.plan(verify_past, width, read_len)
        verify_mask = rows_attention_mask(verify_past, _causal(width, device), read_len)
        verify_positions = positions[..., 1:] - has_drafts.long()[None, :, None]
        predictions = self._logits(verify_ids, verify_positions, verify_mask).argmax(-1)  # AR token after each
        in_block = torch.arange(width - 1, device=device)[None, :] < (block_sizes - 1)[:, None]
        agrees = (drafts == predictions[:, :-1]) & in_block
        accepted = agrees.long().cumprod(1).sum(1)  # longest agreeing prefix
        rows_out = torch.cat([y[:, None], accepted[:, None], drafts, predictions], 1).tolist()  # the one sync

        ys, accepted_counts, after_y = [], [], []
        for slot, cached, row, drafted_here in zip(slots, past_host, rows_out, came_with):
            a = row[1]
            row_drafts, row_predictions = row[2:1 + width], row[1 + width:]
            ys.append(None if drafted_here else row[0])
            accepted_counts.append(a)
            after_y.append(row_drafts[:a] + [row_predictions[a]])
            # x, y and the accepted drafts; x and the accepted drafts for a row verified from x
            self.cache.lengths[slot] = cached + (1 if drafted_here else 2) + a
        return SpeculativeRoundOutput(ys, accepted_counts, after_y)

    def _kept_to_structure(self, shapes: list, came_with: list[list[int]], y: torch.Tensor, drafts: torch.Tensor,
                           block_sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft pass's drafts of rows with a shape kept to the structure that follows
        their y (model/structured_drafts.py); a row's block shrinks where fewer are kept,
        the padding after it never accepted."""
        rows, sizes = drafts.tolist(), block_sizes.tolist()
        for i, (shape, row_y) in enumerate(zip(shapes, y.tolist())):
            if shape is None or came_with[i]:
                continue
            after_y = shape.copy()
            after_y.feed(row_y)
            kept = kept_to_structure(after_y, rows[i][:sizes[i] - 1])
            rows[i] = kept + [self.pad_id] * (len(rows[i]) - len(kept))
            sizes[i] = 1 + len(kept)
        as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=self.device)
        return as_tensor(rows), as_tensor(sizes)

    @torch.no_grad()
    def ar_round(self, sequences: list[Sequence]) -> list[int]:
        """One greedy token per row: the AR baseline."""
        slots, past_host, past, last_tokens, x_positions = self._rows(sequences)
        n, read_len = len(sequences), max(past_host) + 1
        self.cache.plan(past, 1, read_len)
        mask = rows_attention_mask(past, torch.ones(1, 1, dtype=torch.bool, device=self.device), read_len)
        positions = x_positions.view(1, n, 1).expand(3, n, 1)
        tokens = self._logits(last_tokens[:, None], positions, mask)[:, 0].argmax(-1).tolist()
        for slot, cached in zip(slots, past_host):
            self.cache.lengths[slot] = cached + 1
        return tokens
