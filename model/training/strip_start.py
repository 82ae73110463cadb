"""The strip model a `gravityocr train-strips` run starts from: the pretrained PP-OCRv6 tower
under the text side of a trained recogniser.

The text decoder and the mask embedding start from a trained recogniser (`init_from`), so only
the projection into the decoder starts fresh. Without named tower weights, rapidocr's bundled
ONNX file is converted once beside the run (`default_tower_weights`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from gravityocr.model.network.loading import Recognizer, load_recognizer, reading_placeholder_id
from gravityocr.model.network.modeling import STRIP_TOWER, GravityOcrForConditionalGeneration, vision_tower_of
from gravityocr.model.network.ppocr_loading import load_ppocr_recognizer as load_tower
from gravityocr.model.network.processor import OcrProcessor
from gravityocr.model.network.strip_vision import ReadingPrefix, StripImageProcessor, reading_head_weights


def start_model(init_from: str | Path, tower_weights: str | Path, reading_prefix: bool = False,
                reading_copy: bool = False, vertical_detail: bool = False) -> Recognizer:
    """`init_from`'s text side under a strip tower with pretrained PP-OCRv6 weights. A strip
    model's own projections are kept (training continues; one saved before the reading hint
    existed loads with the hint's projection at zero); otherwise they start fresh, the
    hint's at zero. The reading hint's classifier always comes from `tower_weights`.
    `reading_prefix` adds the reading prefix, `reading_copy` the copy path (zero at the
    start); a model that has either keeps it. `vertical_detail` adds the map's rows (zero at the
    start)."""
    source = load_recognizer(init_from)
    config = source.model.config
    continues = vision_tower_of(config) == STRIP_TOWER
    config.vision_tower = STRIP_TOWER
    tokenizer = source.processor.tokenizer
    if reading_prefix and ReadingPrefix.of(config) is None:
        config.reading_prefix = asdict(ReadingPrefix.for_tokenizer(tokenizer))
    if reading_copy:
        if ReadingPrefix.of(config) is None:
            raise ValueError("reading_copy needs a model with a reading prefix (reading_prefix: true)")
        config.reading_copy = True
    if vertical_detail:
        config.strip_vertical_detail = True
    model = GravityOcrForConditionalGeneration(config)
    kept = {k: v for k, v in source.model.state_dict().items()
            if not k.startswith(("model.visual.", "strip_vision.reading_head."))}
    missing, unexpected = model.load_state_dict(kept, strict=False)
    if unexpected or any(not k.startswith(("strip_vision.", "reading_copy.")) for k in missing):
        raise ValueError(f"text weights do not fit: missing {missing}, unexpected {unexpected}")
    tower = load_tower(tower_weights)
    vision = model.strip_vision
    vision.recognizer.load_state_dict(
        {k: v for k, v in tower.state_dict().items() if not k.startswith("head.")}, strict=True)
    weight, bias = reading_head_weights(tower.head.fc, tower.characters, source.processor.tokenizer.get_vocab(),
                                        config.text_config.vocab_size)
    with torch.no_grad():
        vision.reading_head.weight.copy_(weight)
        vision.reading_head.bias.copy_(bias)
        if not continues:  # visual tokens at the scale the decoder's own tokens have
            vision.projection.weight.mul_(0.35)
            vision.projection.bias.zero_()
    processor = OcrProcessor(tokenizer, StripImageProcessor(), source.processor.template,
                             max_context=config.text_config.max_position_embeddings,
                             reading_placeholder_id=reading_placeholder_id(config))
    return Recognizer(model.eval(), processor, source.lexicon)  # the start's lexicon travels with its weights


def default_tower_weights(cache_dir: Path) -> Path:
    from gravityocr.model.network.ppocr_conversion import convert_onnx, rapidocr_model_path

    path = cache_dir / "ppocr_rec.safetensors"
    if not path.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        convert_onnx(rapidocr_model_path(), path)
    return path
