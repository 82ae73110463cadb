"""Loading the PP-OCRv6 recognizer (model/network/ppocr_tower.py) from a `convert_onnx` file.

`load_ppocr_recognizer` needs only safetensors and torch, checks the names strictly, and
returns the character list stored beside the weights (blank at 0, the dictionary, then a
space: 18710 classes).
"""

from __future__ import annotations

from pathlib import Path

import torch

from gravityocr.model.network.ppocr_conversion import CHARACTERS_KEY
from gravityocr.model.network.ppocr_tower import PPOCRv6Recognizer


def read_metadata(path: str | Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata() or {})


def characters_from_dictionary(text: str) -> list[str]:
    """rapidocr's class list: blank at 0, the dictionary's lines, then a space."""
    return ["blank", *text.splitlines(), " "]


def load_ppocr_recognizer(path: str | Path, dtype: torch.dtype = torch.float32) -> PPOCRv6Recognizer:
    """The recognizer in eval mode from a `convert_onnx` file (strict names), computing in
    `dtype` whatever dtype the file stores, with `characters` set from its metadata."""
    from safetensors.torch import load_file

    model = PPOCRv6Recognizer()
    state = {name: tensor.to(dtype) for name, tensor in load_file(str(path)).items()}
    model.load_state_dict(state, strict=True)
    model.characters = characters_from_dictionary(read_metadata(path)[CHARACTERS_KEY])
    if len(model.characters) != model.config.num_classes:
        raise ValueError(f"{len(model.characters)} characters for {model.config.num_classes} classes")
    return model.to(dtype).eval()
