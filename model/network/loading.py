"""Save and load a recogniser (weights, tokenizer, image processor, and the lexicon of its
glyph fixes where it has one) in Hugging Face format.

A local directory and a hub name load the same way; a GLM-OCR checkpoint (no mask
embedding yet) loads too, with the mask embedding freshly initialised.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, Glm46VImageProcessorPil

from gravityocr.model.network.glyph_fixes import LEXICON_FILE, Lexicon
from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration
from gravityocr.model.network.processor import CHAR_TEMPLATE, GLM_OCR_TEMPLATE, OcrProcessor
from gravityocr.model.network.strip_vision import PROCESSOR_TYPE as STRIP_PROCESSOR_TYPE
from gravityocr.model.network.strip_vision import ReadingPrefix, StripImageProcessor


# The shipped default recogniser, committed in the repository (Hugging Face format).
DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[1] / "default"


@dataclass
class Recognizer:
    model: GravityOcrForConditionalGeneration
    processor: OcrProcessor
    lexicon: Lexicon | None = None  # the training documents' words (model/network/glyph_fixes.py)


def _template_for(tokenizer) -> str:
    return GLM_OCR_TEMPLATE if "[gMASK]" in tokenizer.get_vocab() else CHAR_TEMPLATE


def load_image_processor(source: str):
    """The crop processor saved with the model: GLM-OCR's, or the strip processor of the
    PP-OCRv6 vision tower (model/network/strip_vision.py)."""
    from transformers.image_processing_base import ImageProcessingMixin

    record, _ = ImageProcessingMixin.get_image_processor_dict(source)
    if record.get("image_processor_type") == STRIP_PROCESSOR_TYPE:
        return StripImageProcessor.from_dict(record)
    return Glm46VImageProcessorPil.from_pretrained(source)


def reading_placeholder_id(config) -> int | None:
    prefix = ReadingPrefix.of(config)
    return None if prefix is None else prefix.placeholder_id


def load_recognizer(path_or_name: str | Path, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> Recognizer:
    source = str(path_or_name)
    model = GravityOcrForConditionalGeneration.from_pretrained(source, dtype=dtype, attn_implementation="sdpa")
    model = model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(source)
    image_processor = load_image_processor(source)
    processor = OcrProcessor(tokenizer, image_processor, _template_for(tokenizer),
                             max_context=model.config.text_config.max_position_embeddings,
                             reading_placeholder_id=reading_placeholder_id(model.config))
    return Recognizer(model, processor, load_lexicon(source))


def load_lexicon(source: str) -> Lexicon | None:
    """The lexicon saved beside the weights (a local directory or a hub repository), or None."""
    from transformers.utils import cached_file

    path = cached_file(source, LEXICON_FILE, _raise_exceptions_for_missing_entries=False)
    return Lexicon.read(path) if path else None


def save_recognizer(recognizer: Recognizer, directory: str | Path) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    recognizer.model.save_pretrained(directory)
    recognizer.processor.tokenizer.save_pretrained(directory)
    recognizer.processor.image_processor.save_pretrained(directory)
    if recognizer.lexicon is not None:
        recognizer.lexicon.write(directory / LEXICON_FILE)


def export_weights(checkpoint: str | Path, destination: str | Path, dtype: torch.dtype = torch.float16) -> None:
    """A weights-only snapshot (half precision by default) to commit or to continue from."""
    recognizer = load_recognizer(checkpoint)
    recognizer.model.to(dtype)
    save_recognizer(recognizer, destination)
