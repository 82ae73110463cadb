"""Exactness: self-speculative decoding writes exactly what greedy AR decoding writes."""

from __future__ import annotations

import pytest
import torch

from gravityocr.model.decode.reference import greedy_decode, speculative_decode
from gravityocr.model.network.processor import InvalidInput

from conftest import random_image

CASES = [  # (model seed, image seed, width, height, task)
    (0, 1, 84, 56, "text"),
    (1, 2, 140, 84, "table"),
    (2, 3, 56, 112, "formula"),
]


def hf_generate(model, prompt, max_new_tokens, eos_id, pad_id):
    image_tokens = (prompt.input_ids == model.config.image_token_id).int()
    output = model.generate(
        input_ids=prompt.input_ids,
        pixel_values=prompt.pixel_values.to(model.dtype),
        image_grid_thw=prompt.image_grid_thw,
        mm_token_type_ids=image_tokens,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    return output[0, prompt.length:].tolist()


@pytest.mark.parametrize("model_seed,image_seed,width,height,task", CASES)
def test_speculative_equals_greedy_and_hf_generate(tiny_model_factory, processor, tokenizer,
                                                   model_seed, image_seed, width, height, task):
    model = tiny_model_factory(model_seed)
    prompt = processor.encode(random_image(image_seed, width, height), task)
    eos = {tokenizer.eos_token_id}
    max_new = 90  # longer than two 32-token blocks
    ar = greedy_decode(model, prompt, max_new, eos)
    spec = speculative_decode(model, prompt, max_new, eos, block_size=32)
    reference = hf_generate(model, prompt, max_new, tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert ar.token_ids == reference
    assert spec.token_ids == ar.token_ids
    assert ar.stats.forward_passes == ar.stats.committed_tokens == len(ar.token_ids)
    assert ar.stats.ar_rounds == ar.stats.forward_passes - 1 and not ar.stats.accepted_per_round  # after the prefill
    assert spec.stats.committed_tokens == len(spec.token_ids) and spec.stats.ar_rounds == 0


@pytest.mark.parametrize("block_size", [2, 5, 32])
def test_eos_inside_a_block_stops_exactly_there(tiny_model_factory, processor, block_size):
    """Choose as eos a token the model writes mid-sequence: both decoders must stop at its
    first occurrence, even when it falls inside an accepted draft run."""
    model = tiny_model_factory(3)
    prompt = processor.encode(random_image(4, 112, 56), "text")
    free_run = greedy_decode(model, prompt, 70, eos_ids=set())
    eos_token = free_run.token_ids[40]
    first = free_run.token_ids.index(eos_token)
    ar = greedy_decode(model, prompt, 70, {eos_token})
    spec = speculative_decode(model, prompt, 70, {eos_token}, block_size=block_size)
    assert ar.token_ids == free_run.token_ids[:first + 1]
    assert spec.token_ids == ar.token_ids


@pytest.mark.parametrize("max_new", [1, 2, 17, 45])
def test_max_length_cut_inside_a_block(tiny_model_factory, processor, max_new):
    model = tiny_model_factory(4)
    prompt = processor.encode(random_image(5, 84, 84), "text")
    ar = greedy_decode(model, prompt, max_new, eos_ids=set())
    spec = speculative_decode(model, prompt, max_new, eos_ids=set(), block_size=32)
    assert len(ar.token_ids) == max_new
    assert spec.token_ids == ar.token_ids


def test_trained_drafts_are_accepted_and_output_stays_exact(trained_tiny_model, overfit_samples, tokenizer):
    """With drafts mostly right, rounds commit many tokens; the output is still greedy AR's."""
    eos = {tokenizer.eos_token_id}
    for sample in overfit_samples:
        ar = greedy_decode(trained_tiny_model, sample.prompt, 120, eos)
        spec = speculative_decode(trained_tiny_model, sample.prompt, 120, eos, block_size=16)
        assert spec.token_ids == ar.token_ids
        assert ar.token_ids == sample.target_ids  # memorised, eos included
        assert spec.stats.tokens_per_forward > 1.5
        assert max(spec.stats.accepted_per_round) >= 5


def test_the_first_round_verifies_the_prefills_drafts_without_a_draft_pass(
        trained_tiny_model, overfit_samples, tokenizer, monkeypatch):
    """The prefill carries the first block's masks after the prompt, so the next pass is a
    verify pass [y_0, drafts] (no mask in it); later rounds draft [x, M x B] as usual."""
    model, sample, block = trained_tiny_model, overfit_samples[0], 16
    inputs = []
    embed = model.embed
    monkeypatch.setattr(model, "embed", lambda ids, *rest: inputs.append(ids[0].tolist()) or embed(ids, *rest))
    spec = speculative_decode(model, sample.prompt, 120, {tokenizer.eos_token_id}, block_size=block)
    mask, length = model.mask_token_id, sample.prompt.length
    assert inputs[0] == sample.prompt.input_ids[0].tolist() + [mask] * block
    assert mask not in inputs[1] and inputs[1][0] == spec.token_ids[0] and len(inputs[1]) == block
    assert spec.stats.accepted_per_round[0] >= 5  # memorised: the prefill's drafts are read right
    assert inputs[2][1:] == [mask] * block  # the second round drafts from its x
    assert len(inputs) == spec.stats.forward_passes


def test_drafts_accepted_past_an_eos_are_not_counted(trained_tiny_model, overfit_samples):
    """With eos a token in the middle of a memorised target, the round that reaches it has
    right drafts after it too, which the AR model agrees with; the output stops at the eos
    and the accepted drafts counted are committed ones: each round commits them and at
    least one token more (y or the bonus), but for the last."""
    model = trained_tiny_model
    for sample in overfit_samples:
        target = sample.target_ids
        eos_token = next(t for t in target[12:] if target.index(t) >= 12)  # first written past the 12th token
        spec = speculative_decode(model, sample.prompt, 120, {eos_token}, block_size=16)
        assert spec.token_ids == greedy_decode(model, sample.prompt, 120, {eos_token}).token_ids
        assert spec.token_ids == target[:target.index(eos_token) + 1]
        rounds = spec.stats.accepted_per_round
        assert sum(rounds) + len(rounds) - 1 <= spec.stats.committed_tokens - 1


def test_decoding_rejects_bad_lengths(tiny_model_factory, processor):
    model = tiny_model_factory(0)
    prompt = processor.encode(random_image(0, 56, 56), "text")
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(model, prompt, 0, set())
    with pytest.raises(ValueError, match="block_size"):
        speculative_decode(model, prompt, 10, set(), block_size=1)
    context = model.config.text_config.max_position_embeddings
    with pytest.raises(ValueError, match="exceeds the context"):
        speculative_decode(model, prompt, context, set())


def test_bad_images_and_prompts_raise_clear_errors(processor):
    from PIL import Image
    import numpy as np

    with pytest.raises(InvalidInput, match="no image"):
        processor.encode(None, "text")
    with pytest.raises(InvalidInput, match="empty image"):
        processor.encode(np.zeros((0, 0, 3), dtype=np.uint8), "text")
    with pytest.raises(InvalidInput, match="zero-size"):
        processor.encode(Image.new("RGB", (0, 10)), "text")
    with pytest.raises(InvalidInput, match="unknown task"):
        processor.encode(random_image(0, 56, 56), "poem")
    with pytest.raises(InvalidInput, match="exceeds the model's context"):
        processor.encode(random_image(0, 56, 56), "text", max_new_tokens=processor.max_context)
    with pytest.raises(InvalidInput, match="cannot be processed"):
        processor.encode(Image.new("RGB", (10_000, 20)), "text")  # aspect ratio over 200


def test_float32_speculative_equals_greedy(tiny_model_factory, processor, tokenizer):
    """The production dtype: with separated logits, float32 passes agree as well."""
    model = tiny_model_factory(5, dtype=torch.float32)
    prompt = processor.encode(random_image(6, 84, 56), "text")
    eos = {tokenizer.eos_token_id}
    assert speculative_decode(model, prompt, 40, eos).token_ids == greedy_decode(model, prompt, 40, eos).token_ids


# Tiny random models whose greedy output falls into a loop (model seed, image seed, task).
LOOPING = [(1, 1, "text"), (3, 2, "formula")]


@pytest.mark.parametrize("model_seed,image_seed,task", LOOPING)
def test_a_repetition_loop_stops_every_decoder_at_the_same_token(tiny_model_factory, processor, tokenizer,
                                                                 model_seed, image_seed, task):
    from dataclasses import replace

    from gravityocr.model.engine import Engine, EngineConfig, Request
    from gravityocr.model.decode.stopping import loop_unit

    model = tiny_model_factory(model_seed)
    prompt = processor.encode(random_image(image_seed, 84, 56), task)
    eos = {tokenizer.eos_token_id}
    free_run = greedy_decode(model, replace(prompt, task="table"), 200, eos)  # tables are never cut
    ar = greedy_decode(model, prompt, 200, eos)
    assert ar.finish_reason == "repetition" and len(ar.token_ids) < len(free_run.token_ids)
    assert ar.token_ids == free_run.token_ids[:len(ar.token_ids)]
    assert loop_unit(ar.token_ids) and not loop_unit(ar.token_ids[:-1])  # cut at the first looping token
    spec = speculative_decode(model, prompt, 200, eos, block_size=32)
    assert (spec.token_ids, spec.finish_reason) == (ar.token_ids, "repetition")
    for mode in ("spec", "ar"):
        engine = Engine(model, EngineConfig(mode=mode, dtype=torch.float64, max_seq_len=512, num_threads=1), eos)
        [result] = engine.generate([Request("loop", prompt, 200)])
        assert (result.token_ids, result.finish_reason) == (ar.token_ids, "repetition"), mode


def test_the_loop_rule_spares_leaders_rules_and_tables():
    from gravityocr.model.decode.stopping import loop_unit, stop_reason, without_loop

    def ids(text: str) -> list[int]:
        return [ord(c) for c in text]

    looping = ids("Hello or an or an or an or an or an or an ")
    assert loop_unit(looping) == 6
    assert without_loop(looping) == ids("Hello or an ")
    assert stop_reason(looping, set(), 1000, "text") == "repetition"
    assert stop_reason(looping, set(), 1000, "table") is None  # empty cells repeat in real tables
    for fine in ("Contents . . . . . . . . . . . . . . . . . . . . 5", "." * 60, "-" * 60, "ab" * 30,
                 "The loop rule reads a real sentence of sixty characters fine."):
        assert loop_unit(ids(fine)) == 0, fine
        assert stop_reason(ids(fine), set(), 1000, "text") is None
    assert stop_reason(looping, set(ids(" ")), 1000, "text") == "eos"  # eos first
