"""Joint-training layout: complementary corruption, no leakage, and the inference-time pattern."""

from __future__ import annotations

import torch

from gravityocr.model.decode.attention import (
    CLEAN, PREFIX, STREAM_A, STREAM_B, JointLayout, causal_attention_mask, draft_attention_mask,
    joint_attention_mask,
)
from gravityocr.model.training.joint_loss import IGNORE, Objective, build_joint_batch, joint_logits


def test_every_response_token_is_masked_in_exactly_one_stream(tiny_model_factory, overfit_samples):
    model = tiny_model_factory(0)
    batch = build_joint_batch(model, overfit_samples, Objective.JOINT, block_size=8,
                              generator=torch.Generator().manual_seed(1))
    mask_id = model.mask_token_id
    for row, layout, sample in zip(batch.input_ids, batch.layouts, overfit_samples):
        P, L = layout.prefix_len, layout.response_len
        assert torch.equal(row[:P], sample.prompt.input_ids[0])  # prompt and image never masked
        assert not bool((row[:P + L] == mask_id).any())  # nor the clean stream
        masked_a = row[P + L:P + 2 * L] == mask_id
        masked_b = row[P + 2 * L:P + 3 * L] == mask_id
        assert bool((masked_a ^ masked_b).all())
        target = torch.tensor(sample.target_ids)
        assert torch.equal(row[P + L:P + 2 * L][~masked_a], target[~masked_a])
        assert torch.equal(row[P + 2 * L:P + 3 * L][~masked_b], target[~masked_b])


def test_denoising_targets_cover_each_response_token_once(tiny_model_factory, overfit_samples):
    model = tiny_model_factory(0)
    batch = build_joint_batch(model, overfit_samples, Objective.JOINT, block_size=8)
    for targets, layout, sample in zip(batch.denoise_targets, batch.layouts, overfit_samples):
        P, L = layout.prefix_len, layout.response_len
        a, b = targets[P + L:P + 2 * L], targets[P + 2 * L:P + 3 * L]
        covered = torch.where(a != IGNORE, a, b)
        assert bool(((a != IGNORE) ^ (b != IGNORE)).all())
        assert covered.tolist() == sample.target_ids
        assert bool((targets[:P + L] == IGNORE).all())


def test_mask_pattern_matches_the_rules():
    layout = JointLayout(prefix_len=3, response_len=6, block_size=4, block_offset=1)
    mask = joint_attention_mask(layout)
    kind, index = layout.token_kinds()
    block = (index + 1) // 4
    for q in range(layout.total_len):
        for k in range(layout.total_len):
            if kind[q] == PREFIX:
                expected = kind[k] == PREFIX and k <= q
            elif kind[q] == CLEAN:
                expected = kind[k] == PREFIX or (kind[k] == CLEAN and index[k] <= index[q])
            else:
                expected = (kind[k] == PREFIX or (kind[k] == CLEAN and block[k] < block[q])
                            or (kind[k] == kind[q] and block[k] == block[q]))
            assert bool(mask[q, k]) == bool(expected), (q, k)
    assert {int(k) for k in kind.unique()} == {PREFIX, CLEAN, STREAM_A, STREAM_B}


def test_training_block_pattern_is_the_draft_pass_pattern():
    """A block of corrupted tokens after clean tokens 0..j-1 sees what [x, M x B] sees at
    inference with x = clean token j-1 and the prefix plus tokens 0..j-2 in the cache."""
    P, B = 5, 4
    layout = JointLayout(prefix_len=P, response_len=2 * B, block_size=B)
    joint = joint_attention_mask(layout)
    a_block_1 = slice(P + 2 * B + B, P + 2 * B + 2 * B)  # stream A, second block
    keys_prefix_and_clean = joint[a_block_1, :P + B]  # prefix + clean tokens 0..B-1 (x = token B-1)
    keys_own_block = joint[a_block_1, a_block_1]
    draft = draft_attention_mask(past_len=P + B - 1, block_size=B)
    assert torch.equal(keys_prefix_and_clean, draft[1:, :P + B])
    assert torch.equal(keys_own_block, draft[1:, P + B:])
    assert not bool(draft[0, P + B:].any())  # x never sees the masks


def test_causal_attention_mask_shape_and_pattern():
    mask = causal_attention_mask(past_len=3, new_len=4)
    assert mask.shape == (4, 7)
    assert bool(mask[:, :3].all())
    assert torch.equal(mask[:, 3:], torch.ones(4, 4, dtype=torch.bool).tril())


def _corrupted_logits(model, samples, block_size):
    batch = build_joint_batch(model, samples, Objective.JOINT, block_size=block_size, random_block_offset=False,
                              generator=torch.Generator().manual_seed(3))
    return batch, joint_logits(model, batch)


def test_no_leakage_from_clean_tokens_at_or_after_the_block(tiny_model_factory, overfit_samples):
    model = tiny_model_factory(1)
    sample = overfit_samples[0]
    B = 8
    batch, logits = _corrupted_logits(model, [sample], B)
    layout = batch.layouts[0]
    P, L = layout.prefix_len, layout.response_len
    block_start = 2 * B  # the third block
    a_rows = slice(P + L + block_start, P + L + block_start + B)
    b_rows = slice(P + 2 * L + block_start, P + 2 * L + block_start + B)

    changed = batch.input_ids.clone()
    changed[0, P + block_start:P + L] = (changed[0, P + block_start:P + L] + 7) % 100 + 20  # clean tokens >= block
    with torch.no_grad():
        logits_changed = joint_logits(model, _replace_ids(batch, changed))
    assert torch.allclose(logits[0, a_rows], logits_changed[0, a_rows], atol=1e-12, rtol=0)
    assert torch.allclose(logits[0, b_rows], logits_changed[0, b_rows], atol=1e-12, rtol=0)

    # The same kind of change before the block must reach those tokens: the test can fail.
    earlier = batch.input_ids.clone()
    earlier[0, P + block_start - 1] = (earlier[0, P + block_start - 1] + 7) % 100 + 20
    with torch.no_grad():
        logits_earlier = joint_logits(model, _replace_ids(batch, earlier))
    assert not torch.allclose(logits[0, a_rows], logits_earlier[0, a_rows], atol=1e-9, rtol=0)


def test_image_reaches_the_corrupted_tokens(tiny_model_factory, overfit_samples):
    model = tiny_model_factory(2)
    batch, logits = _corrupted_logits(model, [overfit_samples[0]], 8)
    layout = batch.layouts[0]
    rows = slice(layout.prefix_len + layout.response_len, layout.total_len)
    other = dataclass_replace(batch, pixel_values=batch.pixel_values.flip(0))
    with torch.no_grad():
        logits_other = joint_logits(model, other)
    assert not torch.allclose(logits[0, rows], logits_other[0, rows], atol=1e-6)


def _replace_ids(batch, input_ids):
    return dataclass_replace(batch, input_ids=input_ids)


def dataclass_replace(obj, **changes):
    import dataclasses
    return dataclasses.replace(obj, **changes)
