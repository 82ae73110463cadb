"""Model configurations: tiny (tests), small (the shipped default), and GLM-OCR size.

All are `GlmOcrConfig`s of the same architecture; only the dimensions differ. Special
token ids come from the tokenizer so that config and tokenizer always agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import GlmOcrConfig, PreTrainedTokenizerBase

from gravityocr.model.network.tokenizer import SPECIAL


@dataclass(frozen=True)
class ModelSize:
    text_layers: int
    text_hidden: int
    text_heads: int
    text_kv_heads: int
    text_ffn: int
    vision_depth: int
    vision_hidden: int
    vision_heads: int
    vision_ffn: int
    patch_size: int = 14
    max_positions: int = 4096
    initializer_range: float = 0.02


TINY = ModelSize(
    text_layers=2, text_hidden=64, text_heads=4, text_kv_heads=2, text_ffn=128,
    vision_depth=1, vision_hidden=32, vision_heads=2, vision_ffn=64,
)

SMALL = ModelSize(
    text_layers=4, text_hidden=256, text_heads=4, text_kv_heads=2, text_ffn=768,
    vision_depth=2, vision_hidden=128, vision_heads=4, vision_ffn=512,
)


def _mrope_section(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary frequencies over (temporal, height, width) as GLM does (1:1.5:1.5)."""
    half = head_dim // 2
    temporal = max(1, round(half * 0.25))
    height = (half - temporal) // 2
    return [temporal, height, half - temporal - height]


def build_config(tokenizer: PreTrainedTokenizerBase, size: ModelSize = TINY) -> GlmOcrConfig:
    """A GLM-OCR config sized by `size`, with token ids taken from `tokenizer`."""
    ids = tokenizer.convert_tokens_to_ids
    head_dim = size.text_hidden // size.text_heads
    config = GlmOcrConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=size.text_hidden,
            intermediate_size=size.text_ffn,
            num_hidden_layers=size.text_layers,
            num_attention_heads=size.text_heads,
            num_key_value_heads=size.text_kv_heads,
            max_position_embeddings=size.max_positions,
            initializer_range=size.initializer_range,
            pad_token_id=tokenizer.pad_token_id,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _mrope_section(head_dim)},
        ),
        vision_config=dict(
            depth=size.vision_depth,
            hidden_size=size.vision_hidden,
            num_heads=size.vision_heads,
            intermediate_size=size.vision_ffn,
            out_hidden_size=size.text_hidden,
            patch_size=size.patch_size,
            initializer_range=size.initializer_range,
        ),
        image_token_id=ids(SPECIAL.image),
        video_token_id=ids(SPECIAL.video),
        image_start_token_id=ids(SPECIAL.begin_of_image),
        image_end_token_id=ids(SPECIAL.end_of_image),
        video_start_token_id=ids(SPECIAL.begin_of_video),
        video_end_token_id=ids(SPECIAL.end_of_video),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        mask_token_id=tokenizer.mask_token_id,
    )
    config._attn_implementation = "sdpa"
    return config
