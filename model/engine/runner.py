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

from .config import EngineConfig
from .kv_cache import SlotKVCache, rows_attention_mask
from .sequence import Sequence


@dataclass
class SpeculativeRoundOutput:
    """Per row: the AR token y, how many drafts were accepted, and what to commit after y
    (accepted drafts + the bonus token), unless the sequence finishes at y."""

    y: list[int]
    accepted: list[int]
    after_y: list[list[int]]


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
    def prefill(self, sequences: list[Sequence]) -> list[int]:
        """Image + prompt of each newcomer into its slot (images encoded as one batch,
        prompts right-padded); returns each one's first response token."""
        model, device = self.model, self.device
        prompts = [s.request.prompt for s in sequences]
        lengths = [p.length for p in prompts]
        n, width = len(prompts), max(lengths)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long, device=device)
        positions = torch.zeros(3, n, width, dtype=torch.long, device=device)
        for i, (sequence, prompt) in enumerate(zip(sequences, prompts)):
            prompt_ids = prompt.input_ids.to(device)
            rope, first = model.rope_positions(prompt_ids, prompt.image_grid_thw.to(device))
            ids[i, :prompt.length] = prompt_ids[0]
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
        mask = rows_attention_mask(past, _causal(width, device), width)
        self.batched_passes += 1
        # The LM head runs on each row's last prompt token only: over whole prompts it
        # would be rows x width x vocabulary logits, gigabytes at GLM-OCR's vocabulary.
        hidden = model.model.language_model(
            inputs_embeds=embeds, position_ids=positions, attention_mask=mask, cache=self.cache, use_cache=True,
        ).last_hidden_state
        last = hidden[torch.arange(n, device=device), torch.tensor(lengths, device=device) - 1]
        first_tokens = model.lm_head(last).argmax(-1).tolist()
        for slot, length in zip(slots, lengths):
            self.cache.lengths[slot] = length
        return first_tokens

    @torch.no_grad()
    def speculative_round(self, sequences: list[Sequence], blocks: list[int]) -> SpeculativeRoundOutput:
        """Draft pass [x, M x b] then verify pass [y, d_2..d_b] for every row, with one
        device-to-host transfer at the end. Rows that finish at y are verified anyway (the
        result is ignored) so that no transfer is needed between the two passes."""
        device, n, width = self.device, len(sequences), max(blocks)
        # Every host-to-device copy of the round happens here, before its first kernel.
        slots, past_host, past, last_tokens, x_positions = self._rows(sequences)
        block_sizes = torch.tensor(blocks, dtype=torch.long, device=device)
        read_len = max(past_host) + 1 + width
        positions = (x_positions[:, None] + torch.arange(1 + width, device=device))[None].expand(3, n, -1)

        draft_ids = torch.cat([last_tokens[:, None], torch.full((n, width), self.mask_id, device=device)], 1)
        self.cache.plan(past, 1 + width, read_len)
        draft_mask = rows_attention_mask(past, _draft_pattern(block_sizes, width), read_len)
        draft_logits = self._logits(draft_ids, positions, draft_mask)
        y = draft_logits[:, 0].argmax(-1)
        drafts = draft_logits[:, 2:].argmax(-1)  # d_2..d_width; d_1 drafts y's own position

        # Verify overwrites the masks' KV: only x's is kept from the draft pass.
        verify_ids = torch.cat([y[:, None], drafts], 1)
        self.cache.plan(past + 1, width, read_len)
        verify_mask = rows_attention_mask(past + 1, _causal(width, device), read_len)
        predictions = self._logits(verify_ids, positions[..., 1:], verify_mask).argmax(-1)  # AR token after each
        in_block = torch.arange(width - 1, device=device)[None, :] < (block_sizes - 1)[:, None]
        agrees = (drafts == predictions[:, :-1]) & in_block
        accepted = agrees.long().cumprod(1).sum(1)  # longest agreeing prefix
        rows_out = torch.cat([y[:, None], accepted[:, None], drafts, predictions], 1).tolist()  # the one sync

        ys, accepted_counts, after_y = [], [], []
        for slot, cached, row in zip(slots, past_host, rows_out):
            a = row[1]
            row_drafts, row_predictions = row[2:1 + width], row[1 + width:]
            ys.append(row[0])
            accepted_counts.append(a)
            after_y.append(row_drafts[:a] + [row_predictions[a]])
            self.cache.lengths[slot] = cached + 2 + a  # x, y and the accepted drafts
        return SpeculativeRoundOutput(ys, accepted_counts, after_y)

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
