from __future__ import annotations

import json

import pytest
import torch

from gravityocr.model.decoding import greedy_decode, speculative_decode
from gravityocr.model.growth import grow_vision_depth
from gravityocr.model.loading import Recognizer
from gravityocr.model.training import CurriculumPhase, TrainConfig, Trainer


def test_a_grown_vision_tower_reads_exactly_as_before(trained_tiny_model, processor, tokenizer, overfit_samples):
    depth = trained_tiny_model.config.vision_config.depth
    grown = grow_vision_depth(Recognizer(trained_tiny_model, processor), depth + 2).model
    assert grown.config.vision_config.depth == depth + 2 == len(grown.model.visual.blocks)
    assert trained_tiny_model.config.vision_config.depth == depth  # the source is left as it was
    new_block = grown.model.visual.blocks[depth]
    assert new_block.attn.qkv.weight.abs().sum() > 0  # a real block, only its residual branch is shut
    eos = {tokenizer.eos_token_id}
    for sample in overfit_samples:
        prompt = sample.prompt
        before = torch.cat(trained_tiny_model.encode_images(prompt.pixel_values, prompt.image_grid_thw))
        after = torch.cat(grown.encode_images(prompt.pixel_values, prompt.image_grid_thw))
        assert torch.equal(before, after)
        reference = greedy_decode(trained_tiny_model, prompt, 120, eos).token_ids
        assert greedy_decode(grown, prompt, 120, eos).token_ids == reference
        assert speculative_decode(grown, prompt, 120, eos, block_size=16).token_ids == reference


def test_the_vision_tower_cannot_shrink(trained_tiny_model, processor):
    depth = trained_tiny_model.config.vision_config.depth
    with pytest.raises(ValueError, match="can only grow"):
        grow_vision_depth(Recognizer(trained_tiny_model, processor), depth - 1)
    with pytest.raises(ValueError, match="vision_depth must be"):
        TrainConfig(vision_depth=-1).validate()


def test_training_with_a_deeper_vision_tower_trains_the_new_blocks(tmp_path):
    config = TrainConfig(output_dir=str(tmp_path), size="tiny", steps=2, batch_size=2, vision_frozen_steps=0,
                         checkpoint_every=2, vision_depth=3, curriculum=[CurriculumPhase("mono-2-5", 2)], threads=1)
    trainer = Trainer(config)
    new_block = trainer.model.model.visual.blocks[2]
    assert torch.count_nonzero(new_block.mlp.down_proj.weight) == 0
    trainer.run(progress_bar=False)
    assert torch.count_nonzero(new_block.mlp.down_proj.weight) > 0
    assert torch.count_nonzero(new_block.attn.proj.weight) > 0
    saved = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    assert saved["vision_config"]["depth"] == 3
