"""Runs a pass: one `PassLayout` (model/engine/layouts.py) through the model over the slot cache."""

from __future__ import annotations

import torch

from gravityocr.model.decode.reading_drafts import NO_COPY, ReadingIndex, reading_with_eos
from gravityocr.model.engine.config import EngineConfig
from gravityocr.model.engine.kv_cache import SlotKVCache, rows_attention_mask
from gravityocr.model.engine.layouts import PassLayout


class ModelRunner:
    """Owns the model and the slot cache. `run` writes each row's new KV after its cached
    tokens; which of it stays is the scheduler's call (`SlotKVCache.keep`)."""

    def __init__(self, model, config: EngineConfig, eos_ids: frozenset[int] = frozenset()):
        self.model = model
        self.config = config
        self.device = torch.device(config.device)
        self.cache = SlotKVCache.for_model(model.config.text_config, config)
        self.mask_id = model.mask_token_id
        self.pad_id = model.config.pad_token_id or 0
        self.reads = model.reading_prefix is not None  # a prefill also gives each row's reading
        self.eos_ids = eos_ids  # end the readings (model/decode/reading_drafts.py)
        self.batched_passes = 0

    @torch.no_grad()
    def run(self, layout: PassLayout) -> torch.Tensor:
        """(n, k, vocab) logits of the layout's `columns` ((n, q, vocab) without them)."""
        model = self.model
        q = layout.ids.shape[1]
        past = torch.tensor(layout.past, dtype=torch.long, device=self.device)
        read_len = max(layout.past) + q
        self.cache.plan(past, q, read_len, first_slot=layout.first_slot)
        mask = rows_attention_mask(past, layout.pattern, read_len)
        image_embeds = None
        if layout.pixel_values is not None:
            pixels = layout.pixel_values.to(self.device, self.config.dtype)
            readings = [] if self.reads else None
            image_embeds = torch.cat(model.encode_images(pixels, layout.image_grid_thw.to(self.device), readings))
            if readings is not None:
                layout.readings = [ReadingIndex(reading_with_eos(r, self.eos_ids)) for r in readings]
                if model.copies_reading:  # each row's last prompt position predicts its first token
                    layout.copy_ids = torch.full_like(layout.ids, NO_COPY)
                    firsts = torch.tensor([r.copy_token([]) for r in layout.readings], device=self.device)
                    layout.copy_ids.scatter_(1, layout.columns[:, :1], firsts[:, None])
        hidden = model.model.language_model(
            inputs_embeds=model.embed(layout.ids, image_embeds, layout.copy_ids), position_ids=layout.positions,
            attention_mask=mask,
            cache=self.cache, use_cache=True,
        ).last_hidden_state
        copy_ids = layout.copy_ids
        if layout.columns is not None:
            hidden = hidden.gather(1, layout.columns[..., None].expand(-1, -1, hidden.shape[-1]))
            copy_ids = None if copy_ids is None else copy_ids.gather(1, layout.columns)
        self.batched_passes += 1
        return model.output_logits(hidden, copy_ids)
