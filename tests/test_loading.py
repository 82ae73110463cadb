"""Save, load, decode again: the Hugging Face format round-trips exactly."""

from __future__ import annotations

import torch

from gravityocr.model.decode.reference import speculative_decode
from gravityocr.model.network.loading import Recognizer, load_recognizer, save_recognizer

from conftest import random_image


def test_save_load_decode_identical(tmp_path, trained_tiny_model, processor, tokenizer, overfit_samples):
    model = trained_tiny_model.to(torch.float32)
    try:
        save_recognizer(Recognizer(model, processor), tmp_path)
        assert (tmp_path / "config.json").exists() and (tmp_path / "model.safetensors").exists()
        loaded = load_recognizer(tmp_path)
        assert torch.equal(loaded.model.mask_embedding, model.mask_embedding)
        assert loaded.model.mask_token_id == model.mask_token_id
        image = random_image(100, 84, 56)  # the first overfit sample's image
        eos = {tokenizer.eos_token_id}
        before = speculative_decode(model, processor.encode(image, "text"), 80, eos, block_size=16)
        after = speculative_decode(loaded.model, loaded.processor.encode(image, "text"), 80, eos, block_size=16)
        assert after.token_ids == before.token_ids
        assert loaded.processor.decode(after.token_ids) == tokenizer.decode(overfit_samples[0].target_ids,
                                                                           skip_special_tokens=True)
    finally:
        trained_tiny_model.to(torch.float64)


def test_glm_ocr_checkpoint_without_mask_embedding_loads(tmp_path, tiny_model_factory):
    """A plain GLM-OCR checkpoint (no mask embedding) loads; the embedding is initialised."""
    from transformers import GlmOcrForConditionalGeneration

    source = tiny_model_factory(0, dtype=torch.float32)
    plain = GlmOcrForConditionalGeneration(source.config)
    plain.load_state_dict({k: v for k, v in source.state_dict().items() if k != "mask_embedding"})
    plain.save_pretrained(tmp_path)
    from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration

    loaded = GravityOcrForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.isfinite(loaded.mask_embedding).all()
    assert float(loaded.mask_embedding.std()) > 0
    assert torch.equal(loaded.lm_head.weight, source.lm_head.weight)
