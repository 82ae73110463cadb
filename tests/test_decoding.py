"""Exactness: self-speculative decoding writes exactly what greedy AR decoding writes."""

from __future__ import annotations

import pytest
import torch

from gravityocr.model.decoding import greedy_decode, speculative_decode
from gravityocr.model.draft_ahead import DraftAhead, RoundLayout
from gravityocr.model.processor import InvalidInput

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


@pytest.mark.parametrize("draft_ahead", [None, DraftAhead(), DraftAhead(branches=4)],
                         ids=["classic", "draft-ahead", "draft-ahead-branches"])
@pytest.mark.parametrize("model_seed,image_seed,width,height,task", CASES)
def test_speculative_equals_greedy_and_hf_generate(tiny_model_factory, processor, tokenizer,
                                                   model_seed, image_seed, width, height, task, draft_ahead):
    model = tiny_model_factory(model_seed)
    prompt = processor.encode(random_image(image_seed, width, height), task)
    eos = {tokenizer.eos_token_id}
    max_new = 90  # longer than two 32-token blocks
    ar = greedy_decode(model, prompt, max_new, eos)
    spec = speculative_decode(model, prompt, max_new, eos, block_size=32, draft_ahead=draft_ahead)
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


@pytest.mark.parametrize("block_size,ahead_block", [(4, 2), (9, 3), (32, 16)])
@pytest.mark.parametrize("max_new", [1, 2, 17, 45])
def test_draft_ahead_stops_exactly_at_eos_and_at_the_length(tiny_model_factory, processor, block_size, ahead_block,
                                                            max_new):
    model = tiny_model_factory(3)
    prompt = processor.encode(random_image(4, 112, 56), "text")
    free_run = greedy_decode(model, prompt, 70, eos_ids=set())
    eos_token = free_run.token_ids[40]
    for ahead in (DraftAhead(ahead_block, 0.5), DraftAhead(ahead_block, 0.5, branches=3)):
        for eos in ({eos_token}, set()):
            ar = greedy_decode(model, prompt, max_new, eos)
            assert speculative_decode(model, prompt, max_new, eos, block_size, ahead).token_ids == ar.token_ids


def test_draft_ahead_branches_are_taken_and_stay_exact(tiny_model_factory, processor, tokenizer, monkeypatch):
    """Rounds that accept second-choice branches (some beyond their first token) commit
    exactly greedy's tokens: the branch's KV, moved after the accepted drafts, is what the
    next rounds attend to."""
    outcomes = []
    outcome = RoundLayout.outcome
    monkeypatch.setattr(RoundLayout, "outcome", lambda self, predicted: outcomes.append(outcome(self, predicted))
                        or outcomes[-1])
    eos = {tokenizer.eos_token_id}
    for model_seed, image_seed, width, height, task in CASES:
        model = tiny_model_factory(model_seed)
        prompt = processor.encode(random_image(image_seed, width, height), task)
        spec = speculative_decode(model, prompt, 90, eos, block_size=32, draft_ahead=DraftAhead(16, 0.7, branches=2))
        assert spec.token_ids == greedy_decode(model, prompt, 90, eos).token_ids
    taken = [o.branch_accepted for o in outcomes if o.branch_start is not None]
    assert len(taken) >= 3 and max(taken) >= 2


@pytest.mark.parametrize("draft_ahead", [None, DraftAhead(8, 0.5, branches=2)], ids=["classic", "draft-ahead"])
def test_drafts_accepted_past_an_eos_are_not_counted(trained_tiny_model, overfit_samples, draft_ahead):
    """With eos a token in the middle of a memorised target, the round that reaches it has
    right drafts after it too, which the AR model agrees with; the output stops at the eos
    and the accepted drafts counted are committed ones: each round commits them and at
    least one token more (y or the bonus), but for the last."""
    model = trained_tiny_model
    for sample in overfit_samples:
        target = sample.target_ids
        eos_token = next(t for t in target[12:] if target.index(t) >= 12)  # first written past the 12th token
        spec = speculative_decode(model, sample.prompt, 120, {eos_token}, block_size=16, draft_ahead=draft_ahead)
        assert spec.token_ids == greedy_decode(model, sample.prompt, 120, {eos_token}).token_ids
        assert spec.token_ids == target[:target.index(eos_token) + 1]
        rounds = spec.stats.accepted_per_round
        assert sum(rounds) + len(rounds) - 1 <= spec.stats.committed_tokens - 1


def test_draft_ahead_saves_passes_on_trained_drafts_and_stays_exact(
        trained_tiny_model, overfit_samples, tokenizer, monkeypatch):
    """Every pass after the prefill is [x, drafts, anchored mask blocks]: no draft pass of
    its own, so rounds = passes - 1; on memorised crops that takes fewer passes than the
    classic draft + verify rounds, for the same tokens."""
    model, eos, ahead = trained_tiny_model, {tokenizer.eos_token_id}, DraftAhead(8, 0.5)
    inputs = []
    embed = model.embed
    monkeypatch.setattr(model, "embed", lambda ids, *rest: inputs.append(ids[0].tolist()) or embed(ids, *rest))
    classic_passes = ahead_passes = 0
    for sample in overfit_samples:
        classic = speculative_decode(model, sample.prompt, 120, eos, block_size=16)
        inputs.clear()
        spec = speculative_decode(model, sample.prompt, 120, eos, block_size=16, draft_ahead=ahead)
        assert spec.token_ids == classic.token_ids == sample.target_ids
        assert len(inputs) == spec.stats.forward_passes == 1 + len(spec.stats.accepted_per_round)
        for round_input in inputs[1:]:
            masks = sum(token == model.mask_token_id for token in round_input)
            assert masks in (8, 16, 24) and round_input[-masks:] == [model.mask_token_id] * masks
            assert model.mask_token_id not in round_input[:-masks]
        classic_passes += classic.stats.forward_passes
        ahead_passes += spec.stats.forward_passes
    assert ahead_passes < classic_passes


def test_round_layout_anchors_blocks_after_their_token():
    """[x, e1, e2] with blocks of 2 anchored at x and at e2: a block sees the tokens up to
    its anchor and itself; its masks sit at the positions after the anchor."""
    ahead = DraftAhead(2, 0.5)
    # x, the end of the confident drafts, one further (within the drafts)
    assert ahead.anchors([True, False, False]) == [0, 1, 2]
    assert ahead.anchors([True, True]) == [0, 2] and ahead.anchors([False, True]) == [0, 1]
    assert ahead.anchors([]) == [0]
    layout = RoundLayout.build(10, [11, 12], [0, 2], 2, mask_id=99)
    assert layout.tokens == [10, 11, 12, 99, 99, 99, 99]
    assert layout.offsets == [0, 1, 2, 1, 2, 3, 4]
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 0, 0, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0, 1, 1, 0],
        [1, 1, 1, 0, 0, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 1, 1],  # padding
    ], dtype=torch.bool)
    assert torch.equal(layout.attention(8), expected)
    predicted = [20, 21, 22, 30, 31, 32, 33]
    flags = [False] * 3 + [True, False, True, True]
    # Accepted 0: bonus at offset 1, next drafts from offset 2 on: the x block's second mask.
    outcome = layout.outcome(predicted)
    assert (outcome.accepted, outcome.committed, outcome.branch_start) == (0, [20], None)
    assert layout.next_drafts(outcome, 2, predicted, flags) == ([31], [False])
    # Accepted 1 (< 2): still the x block, nothing left after offset 2.
    predicted[0] = 11
    outcome = layout.outcome(predicted)
    assert (outcome.accepted, outcome.committed) == (1, [11, 21])
    assert layout.next_drafts(outcome, 2, predicted, flags) == ([], [])
    # Accepted 2: the e2 block, from offset 4 on.
    predicted[1] = 12
    outcome = layout.outcome(predicted)
    assert (outcome.accepted, outcome.committed) == (2, [11, 12, 22])
    assert layout.next_drafts(outcome, 2, predicted, flags) == ([33], [True])


def test_round_layout_branches_on_second_choices():
    """[x, e1, e2, e3] with a branch [a2, e3] off e1 (a2: e2's second choice) and blocks of
    3 anchored at x, at e2 and at a2: branch tokens see x..e1 and their branch up to
    themselves; the walk takes the branch when the AR token after e1 is a2."""
    ahead = DraftAhead(3, 0.5, branches=2)
    assert ahead.branch_depths([True, False, False, False]) == [2, 3]  # the first two doubtful drafts
    assert ahead.branch_depths([True, True]) == [] and ahead.branch_depths([False]) == [1]
    assert DraftAhead(3, 0.5).branch_depths([False, False]) == []
    layout = RoundLayout.build(10, [11, 12, 13], [0, 2], 3, mask_id=99, alternates=[21, 22, 23], branch_depths=[2])
    assert layout.tokens == [10, 11, 12, 13, 22, 13] + [99] * 9
    assert layout.offsets == [0, 1, 2, 3, 2, 3, 1, 2, 3, 3, 4, 5, 3, 4, 5]
    assert layout.block_starts == [6, 9, 12] and layout.anchor_depths == [0, 2, 2]
    seen = lambda *keys: [int(k in keys) for k in range(15)]
    expected = torch.tensor(
        [seen(0), seen(0, 1), seen(0, 1, 2), seen(0, 1, 2, 3), seen(0, 1, 4), seen(0, 1, 4, 5)]
        + [seen(0, 6, 7, 8)] * 3 + [seen(0, 1, 2, 9, 10, 11)] * 3 + [seen(0, 1, 4, 12, 13, 14)] * 3, dtype=torch.bool)
    assert torch.equal(layout.attention(), expected)
    predicted = list(range(100, 115))
    # e1 accepted, then a2 instead of e2, then the branch's e3: 3 accepted, the bonus after
    # the branch's e3; the branch's block drafts from offset 5 on.
    predicted[0], predicted[1], predicted[4] = 11, 22, 13
    outcome = layout.outcome(predicted)
    assert (outcome.accepted, outcome.committed) == (3, [11, 22, 13, 105])
    assert (outcome.branch_start, outcome.branch_accepted) == (4, 2)
    assert layout.next_drafts(outcome, 3, predicted) == ([114],)
    # The branch's first token only: its block from offset 4 on.
    predicted[4] = 77
    outcome = layout.outcome(predicted)
    assert (outcome.accepted, outcome.committed, outcome.branch_accepted) == (2, [11, 22, 77], 1)
    assert layout.next_drafts(outcome, 3, predicted) == ([113, 114],)
    # Neither e2 nor a2: the x block, from offset 3 on.
    predicted[1] = 55
    outcome = layout.outcome(predicted)
    assert (outcome.accepted, outcome.committed, outcome.branch_start) == (1, [11, 55], None)
    assert layout.next_drafts(outcome, 3, predicted) == ([108],)
    # Every draft accepted along the main line: the e2 block, from offset 5 on.
    predicted[1], predicted[2] = 12, 13
    outcome = layout.outcome(predicted)
    assert (outcome.accepted, outcome.committed, outcome.branch_start) == (3, [11, 12, 13, 103], None)
    assert layout.next_drafts(outcome, 3, predicted) == ([111],)


def test_draft_ahead_settings_are_checked():
    with pytest.raises(ValueError, match="at least 2"):
        DraftAhead(1)
    with pytest.raises(ValueError, match="confidence"):
        DraftAhead(8, 1.0)
    with pytest.raises(ValueError, match="longer than the draft block"):
        DraftAhead(33).check_fits(32)
    with pytest.raises(ValueError, match="branches"):
        DraftAhead(8, 0.5, -1)


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
    from gravityocr.model.stopping import loop_unit

    model = tiny_model_factory(model_seed)
    prompt = processor.encode(random_image(image_seed, 84, 56), task)
    eos = {tokenizer.eos_token_id}
    free_run = greedy_decode(model, replace(prompt, task="table"), 200, eos)  # tables are never cut
    ar = greedy_decode(model, prompt, 200, eos)
    assert ar.finish_reason == "repetition" and len(ar.token_ids) < len(free_run.token_ids)
    assert ar.token_ids == free_run.token_ids[:len(ar.token_ids)]
    assert loop_unit(ar.token_ids) and not loop_unit(ar.token_ids[:-1])  # cut at the first looping token
    for draft_ahead in (None, DraftAhead()):
        spec = speculative_decode(model, prompt, 200, eos, block_size=32, draft_ahead=draft_ahead)
        assert (spec.token_ids, spec.finish_reason) == (ar.token_ids, "repetition")
    for mode, draft_ahead in (("spec", None), ("ar", None), ("spec", DraftAhead(4, 0.5))):
        engine = Engine(model, EngineConfig(mode=mode, draft_ahead=draft_ahead, dtype=torch.float64, max_seq_len=512,
                                            num_threads=1), eos)
        [result] = engine.generate([Request("loop", prompt, 200)])
        assert (result.token_ids, result.finish_reason) == (ar.token_ids, "repetition"), mode


def test_the_loop_rule_spares_leaders_rules_and_tables():
    from gravityocr.model.stopping import loop_unit, stop_reason, without_loop

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
