"""Sampled responses for GRPO: a group of completions of one prompt, drawn together.

Every member of a group shares the prompt, so one prefill is repeated across the batch and
each step feeds all of them a token at the same position: no padding, one causal mask.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache

from gravityocr.model.decode.attention import causal_attention_mask
from gravityocr.model.decode.reference import check_length, prefill
from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration
from gravityocr.model.network.processor import EncodedPrompt


@torch.no_grad()
def sample_group(model: GravityOcrForConditionalGeneration, prompt: EncodedPrompt, group_size: int,
                 max_new_tokens: int, eos_ids: set[int], temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> list[list[int]]:
    """`group_size` responses sampled at `temperature` from the causal (AR) path, each cut
    after its first eos (kept) or at `max_new_tokens`. `generator` (a CPU one) makes the
    draw repeatable."""
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature} (greedy decoding is reference.greedy_decode)")
    check_length(prompt, max_new_tokens, model)
    device = model.device
    cache = DynamicCache(config=model.config.text_config)
    start = prefill(model, prompt, cache, eos_ids)
    position = start.next_position
    cache.batch_repeat_interleave(group_size)
    logits = start.logits.expand(group_size, -1)
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long)
    columns: list[torch.Tensor] = []
    texts: list[list[int]] = [[] for _ in range(group_size)]  # what each member drew, for its copy tokens
    finished = torch.zeros(group_size, dtype=torch.bool)
    for step in range(max_new_tokens):
        probabilities = torch.softmax(logits.float().cpu() / temperature, dim=-1)
        tokens = torch.multinomial(probabilities, 1, generator=generator)[:, 0]
        columns.append(tokens)
        finished |= torch.isin(tokens, eos)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        positions = torch.full((3, group_size, 1), position + step, dtype=torch.long, device=device)
        mask = causal_attention_mask(cache.get_seq_length(), 1, device)[None, None]
        copy_ids = None
        if start.reading is not None and model.copies_reading:  # each member's copy token of its own text
            for text, token in zip(texts, tokens.tolist()):
                text.append(token)
            copy_ids = torch.tensor([[start.reading.copy_token(text)] for text in texts], device=device)
        embeds = model.embed(tokens[:, None].to(device), None, copy_ids)
        logits = model.logits_from_embeds(embeds, positions, mask, cache, copy_ids)[:, -1]
    responses = []
    for row in torch.stack(columns, dim=1).tolist():
        end = next((i + 1 for i, token in enumerate(row) if token in eos_ids), len(row))
        responses.append(row[:end])
    return responses
