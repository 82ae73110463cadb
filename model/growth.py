"""Deepen a trained vision tower without changing what the model computes.

The small model's vision tower (two blocks) may be what limits its reading. Blocks appended
after the trained ones with their attention output projection and MLP down projection at
zero add exactly nothing to the residual stream, so the grown model reads as before, token
for token, and training takes the new depth from there rather than from scratch. Only the
config's `depth` changes: a grown checkpoint is a plain GLM-OCR checkpoint.
"""

from __future__ import annotations

import copy

import torch

from .loading import Recognizer
from .modeling import GravityOcrForConditionalGeneration


def grow_vision_depth(recognizer: Recognizer, depth: int, seed: int = 0) -> Recognizer:
    """A recogniser whose vision tower has `depth` blocks: the trained ones, then new blocks
    whose residual branches start at zero. `seed` draws the new blocks' other weights."""
    model = recognizer.model
    current = model.config.vision_config.depth
    if depth < current:
        raise ValueError(f"vision depth can only grow: the model has {current} blocks, asked for {depth}")
    if depth == current:
        return recognizer
    config = copy.deepcopy(model.config)
    config.vision_config.depth = depth
    parameter = next(model.parameters())
    torch.manual_seed(seed)
    grown = GravityOcrForConditionalGeneration(config).to(dtype=parameter.dtype, device=parameter.device)
    missing, unexpected = grown.load_state_dict(model.state_dict(), strict=False)
    new_prefixes = tuple(f"model.visual.blocks.{index}." for index in range(current, depth))
    if unexpected or any(not name.startswith(new_prefixes) for name in missing):
        raise RuntimeError(f"growing the vision tower left weights unmatched: missing {missing}, "
                           f"unexpected {unexpected}")
    with torch.no_grad():
        for block in grown.model.visual.blocks[current:]:
            for projection in (block.attn.proj, block.mlp.down_proj):
                projection.weight.zero_()
                if projection.bias is not None:
                    projection.bias.zero_()
    grown.train(model.training)
    return Recognizer(grown, recognizer.processor)
