"""The joint objective trains: loss falls on one tiny batch and the mask embedding learns."""

from __future__ import annotations

import pytest
import torch

from gravityocr.model.configs import TINY, build_config
from gravityocr.model.joint_loss import Objective, build_joint_batch, joint_loss
from gravityocr.model.modeling import GravityOcrForConditionalGeneration


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
