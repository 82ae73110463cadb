"""The joint objective trains: loss falls on one tiny batch and the mask embedding learns."""

from __future__ import annotations

import pytest
import torch

from gravityocr.model.decode.attention import CLEAN, STREAM_A, STREAM_B
from gravityocr.model.network.configs import TINY, build_config
from gravityocr.model.training.joint_loss import (IGNORE, Objective, backward_in_micro_batches, build_joint_batch, joint_loss,
                                         split_by_length)
from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration
from gravityocr.model.training.train import TrainConfig


def _fresh_model(tokenizer):
    torch.manual_seed(0)
    return GravityOcrForConditionalGeneration(build_config(tokenizer, TINY)).train()


def test_joint_loss_overfits_one_batch_and_trains_the_mask_embedding(tokenizer, overfit_samples):
    model = _fresh_model(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    first = None
    mask_before = model.mask_embedding.detach().clone()
    for step in range(40):
        batch = build_joint_batch(model, overfit_samples, Objective.JOINT, block_size=16, generator=generator)
        loss = joint_loss(model, batch)
        losses = (loss.ar.item(), loss.denoise.item())
        optimizer.zero_grad()
        loss.total.backward()
        if step == 0:
            first = losses
            assert model.mask_embedding.grad is not None
            assert float(model.mask_embedding.grad.norm()) > 0
        optimizer.step()
    assert losses[0] < 0.5 * first[0]  # AR term
    assert losses[1] < 0.6 * first[1]  # denoising term
    assert not torch.equal(model.mask_embedding.detach(), mask_before)


def test_objective_switches(tokenizer, overfit_samples):
    model = _fresh_model(tokenizer)
    no_ar_batch = build_joint_batch(model, overfit_samples, Objective.NO_AR, block_size=16,
                                    generator=torch.Generator().manual_seed(0))
    parts = joint_loss(model, no_ar_batch, Objective.NO_AR)
    assert torch.equal(parts.total, parts.denoise)

    ar_batch = build_joint_batch(model, overfit_samples, Objective.AR_ONLY, block_size=16)
    assert all(not layout.corrupted_streams for layout in ar_batch.layouts)
    assert ar_batch.input_ids.shape[1] == max(l.prefix_len + l.response_len for l in ar_batch.layouts)
    assert not bool((ar_batch.input_ids == model.mask_token_id).any())
    parts = joint_loss(model, ar_batch, Objective.AR_ONLY)
    assert torch.equal(parts.total, parts.ar)
    parts.total.backward()
    assert model.mask_embedding.grad is None or float(model.mask_embedding.grad.abs().sum()) == 0


def test_ar_loss_is_the_plain_causal_loss(tokenizer, overfit_samples):
    """The clean stream's AR term equals the loss of GLM-OCR's own forward on prompt + response."""
    model = _fresh_model(tokenizer).eval()
    sample = overfit_samples[0]
    batch = build_joint_batch(model, [sample], Objective.JOINT, block_size=16)
    ours = joint_loss(model, batch).ar
    prompt = sample.prompt
    ids = torch.cat([prompt.input_ids, torch.tensor([sample.target_ids])], dim=1)
    labels = ids.clone()
    labels[:, :prompt.length] = -100
    with torch.no_grad():
        reference = model(input_ids=ids, pixel_values=prompt.pixel_values, image_grid_thw=prompt.image_grid_thw,
                          mm_token_type_ids=(ids == model.config.image_token_id).int(), labels=labels).loss
    assert ours.item() == pytest.approx(reference.item(), rel=1e-4)


@pytest.mark.parametrize("objective", list(Objective))
def test_length_sorted_micro_batches_give_the_whole_batchs_loss_and_gradient(tokenizer, overfit_samples, objective):
    model = _fresh_model(tokenizer).double()
    samples = overfit_samples + overfit_samples[:2]  # five samples of three lengths
    batch = build_joint_batch(model, samples, objective, block_size=8, generator=torch.Generator().manual_seed(1))
    batch.pixel_values = batch.pixel_values.double()
    lengths = [layout.total_len for layout in batch.layouts]

    def gradient_and_losses(max_tokens, weight=1.0):
        model.zero_grad(set_to_none=True)
        parts, count = backward_in_micro_batches(model, batch, objective, max_tokens, weight)
        micro_batches = split_by_length(batch, max_tokens)
        assert count == len(micro_batches)
        return ({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                torch.stack([parts.total, parts.ar, parts.denoise]), micro_batches)

    whole, whole_losses, one = gradient_and_losses(0)
    split, split_losses, many = gradient_and_losses(2 * max(lengths) - 1)
    halved, halved_losses, _ = gradient_and_losses(2 * max(lengths) - 1, weight=0.5)
    assert len(one) == 1 and len(many) >= 3
    assert torch.equal(halved_losses, split_losses)  # the weight scales the gradient, not the reported loss
    for name in split:
        assert torch.allclose(halved[name], 0.5 * split[name], rtol=1e-12, atol=0), name
    assert sorted(i for micro in many for i in micro.indices) == list(range(len(samples)))
    for micro in many:  # each trimmed to its longest sample, with that sample's own patches
        assert micro.batch.input_ids.shape[1] == max(lengths[i] for i in micro.indices)
        assert micro.batch.pixel_values.shape[0] == int(micro.batch.image_grid_thw.prod(dim=1).sum())
    # the loss itself is taken in float32 (joint_loss), hence the float32 tolerances
    assert torch.allclose(split_losses, whole_losses, rtol=1e-6, atol=0)
    assert whole.keys() == split.keys()
    for name in whole:
        assert torch.allclose(split[name], whole[name], rtol=1e-5, atol=1e-8), name


def test_blocks_of_many_sizes_and_a_final_block_filled_past_eos(tokenizer, overfit_samples):
    """min_block_size: block sizes vary per sample within min..B; pad_final_block: the
    response runs on to the end of its last block with masks in both streams that carry no
    target, the AR targets stay the response's own, and every real token keeps its targets."""
    model = _fresh_model(tokenizer)
    samples = overfit_samples * 8
    plain = build_joint_batch(model, samples, Objective.JOINT, block_size=8, generator=torch.Generator().manual_seed(5))
    joint = build_joint_batch(model, samples, Objective.JOINT, block_size=8, generator=torch.Generator().manual_seed(5),
                              min_block_size=3, pad_final_block=True)
    assert {layout.block_size for layout in plain.layouts} == {8}
    assert len({layout.block_size for layout in joint.layouts}) >= 3
    assert all(3 <= layout.block_size <= 8 for layout in joint.layouts)
    mask = model.mask_token_id
    for row, (sample, layout) in enumerate(zip(samples, joint.layouts)):
        real, length = len(sample.target_ids), layout.response_len
        assert (length + layout.block_offset) % layout.block_size == 0 and length - real < layout.block_size
        clean, a, b = (layout.stream_start(s) for s in (CLEAN, STREAM_A, STREAM_B))
        p = layout.prefix_len
        assert joint.ar_targets[row, p - 1:p - 1 + real].tolist() == sample.target_ids
        assert bool((joint.ar_targets[row, p - 1 + real:] == IGNORE).all())
        assert joint.input_ids[row, clean:clean + real].tolist() == sample.target_ids
        for start in (a, b):
            assert bool((joint.input_ids[row, start + real:start + length] == mask).all())
            assert bool((joint.denoise_targets[row, start + real:start + length] == IGNORE).all())
        # each real token is a target in exactly one stream
        targeted = (joint.denoise_targets[row, a:a + real] != IGNORE) ^ (joint.denoise_targets[row, b:b + real] != IGNORE)
        assert bool(targeted.all())
    loss = joint_loss(model, joint)
    assert torch.isfinite(loss.total)
    with pytest.raises(ValueError, match="min_block_size"):
        TrainConfig(min_block_size=40).validate()
