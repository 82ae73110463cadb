"""Runs a pass: one `PassLayout` (model/engine/layouts.py) through the model over the slot cache."""

from __future__ import annotations

import time

import torch

from gravityocr.model.decode.ctc_prefix import CTCPrefixScorer, line_scorer
from gravityocr.model.decode.reading_drafts import ReadingIndex, reading_with_eos
from gravityocr.model.engine.config import EngineConfig
from gravityocr.model.engine.kv_cache import SlotKVCache, rows_attention_mask
from gravityocr.model.engine.layouts import PassLayout
from gravityocr.model.network.processor import EncodedPrompt


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
        self.encode_seconds = 0.0  # the vision tower's wall time
        self.encode_cpu_seconds = 0.0  # and the process's CPU time during it

    @torch.no_grad()
    def encode(self, prompts: list[EncodedPrompt]) -> tuple[torch.Tensor, list[ReadingIndex] | None,
                                                            list[CTCPrefixScorer | None]]:
        """The vision tower over the prompts' images: what fills their image placeholders
        (all images concatenated); for a model with a reading prefix, each one's reading
        with the eos (what reading drafts and copy tokens come from,
        model/decode/reading_drafts.py), None for other models; and each one's CTC prefix
        scorer where its line is decoded jointly (model/decode/ctc_prefix.py). Run before
        the prefill's pass, so that the prefill can verify the reading's first tokens."""
        start, cpu_start = time.perf_counter(), time.process_time()
        pixels = torch.cat([p.pixel_values for p in prompts]).to(self.device, self.config.dtype)
        grid = torch.cat([p.image_grid_thw for p in prompts]).to(self.device)
        readings = [] if self.reads else None
        frames = [] if self.model.ctc_prefix_weight else None  # only a model that scores lines needs them
        image_embeds = torch.cat(self.model.encode_images(pixels, grid, readings, frames))
        if self.device.type == "cuda":  # its time is the tower's alone
            torch.cuda.synchronize(self.device)
        self.encode_seconds += time.perf_counter() - start
        self.encode_cpu_seconds += time.process_time() - cpu_start
        scorers = [line_scorer(self.model, frames[i] if frames else None, prompt.task, self.eos_ids)
                   for i, prompt in enumerate(prompts)]
        if readings is None:
            return image_embeds, None, scorers
        return image_embeds, [ReadingIndex(reading_with_eos(r, self.eos_ids)) for r in readings], scorers

    @torch.no_grad()
    def run(self, layout: PassLayout) -> torch.Tensor:
        """(n, k, vocab) logits of the layout's `columns` ((n, q, vocab) without them)."""
        model = self.model
        q = layout.ids.shape[1]
        past = torch.tensor(layout.past, dtype=torch.long, device=self.device)
        read_len = max(layout.past) + q
        self.cache.plan(past, q, read_len, first_slot=layout.first_slot)
        mask = rows_attention_mask(past, layout.pattern, read_len)
        hidden = model.model.language_model(
            inputs_embeds=model.embed(layout.ids, layout.image_embeds, layout.copy_ids), position_ids=layout.positions,
            attention_mask=mask,
            cache=self.cache, use_cache=True,
        ).last_hidden_state
        copy_ids = layout.copy_ids
        if layout.columns is not None:
            hidden = hidden.gather(1, layout.columns[..., None].expand(-1, -1, hidden.shape[-1]))
            copy_ids = None if copy_ids is None else copy_ids.gather(1, layout.columns)
        self.batched_passes += 1
        return model.output_logits(hidden, copy_ids)
