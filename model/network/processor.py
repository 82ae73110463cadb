"""Turns an image crop and a task into model inputs: pixel patches and prompt token ids.

Images go through GLM-OCR's own image processor (the PIL backend of transformers'
`Glm46VImageProcessor`), so the small model and GLM-OCR see pixels the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from transformers import Glm46VImageProcessorPil, PreTrainedTokenizerBase

from gravityocr.model.network.tasks import TASK_PROMPTS
from gravityocr.model.network.tokenizer import SPECIAL

# GLM-OCR's task prompts, one per content type.

# Output budget per crop (OcrProcessor.output_budget): a visual column is 24 px of a line
# whose glyphs are ~20 px high (strips) or 28 px (GLM-OCR patches); the narrowest glyphs
# with their spacing take more than 3 px.
CHARACTERS_PER_COLUMN = 8
BUDGET_SLACK = 16

# How a prompt wraps the image; "{image}" becomes the visual placeholder tokens.
CHAR_TEMPLATE = SPECIAL.begin_of_image + "{image}" + SPECIAL.end_of_image + "{task}" + SPECIAL.assistant
GLM_OCR_TEMPLATE = "[gMASK]<sop><|user|>\n<|begin_of_image|>{image}<|end_of_image|>{task}<|assistant|>\n"


class InvalidInput(ValueError):
    """A request the model cannot take, with a message that says why."""


@dataclass
class EncodedPrompt:
    """One request, ready for prefill."""

    input_ids: torch.Tensor  # (1, P) long
    pixel_values: torch.Tensor  # (patches, C*T*p*p)
    image_grid_thw: torch.Tensor  # (1, 3)
    task: str
    # visual columns the crop fills before padding (the strip processor says; None: all of them)
    content_columns: int | None = None

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])


def make_image_processor(patch_size: int = 14, min_pixels: int = 28 * 28 * 4, max_pixels: int = 28 * 28 * 1024):
    return Glm46VImageProcessorPil(
        patch_size=patch_size,
        temporal_patch_size=2,
        merge_size=2,
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
    )


def _as_rgb_image(image) -> Image.Image:
    if image is None:
        raise InvalidInput("no image given")
    if isinstance(image, np.ndarray):
        if image.size == 0:
            raise InvalidInput(f"empty image array of shape {image.shape}")
        image = Image.fromarray(image)
    if not isinstance(image, Image.Image):
        raise InvalidInput(f"expected a PIL image or array, got {type(image).__name__}")
    if image.width == 0 or image.height == 0:
        raise InvalidInput(f"zero-size image ({image.width}x{image.height})")
    return image.convert("RGB")


class OcrProcessor:
    """Image processor + tokenizer + prompt template: what one recogniser needs to encode a request."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, image_processor, template: str = CHAR_TEMPLATE,
                 max_context: int = 4096, reading_placeholder_id: int | None = None):
        self.tokenizer = tokenizer
        # a strip model with a reading prefix (model/network/strip_vision.py): its placeholders follow the image's
        self.reading_placeholder_id = reading_placeholder_id
        self.image_processor = image_processor
        self.template = template
        self.max_context = max_context
        self.image_token = SPECIAL.image if template == CHAR_TEMPLATE else "<|image|>"
        self.eos_token_ids = [tokenizer.eos_token_id]

    def encode(self, image, task: str = "text", max_new_tokens: int = 0) -> EncodedPrompt:
        if task not in TASK_PROMPTS:
            raise InvalidInput(f"unknown task {task!r}; expected one of {sorted(TASK_PROMPTS)}")
        rgb = _as_rgb_image(image)
        try:
            features = self.image_processor(images=[rgb], return_tensors="pt")
        except ValueError as error:  # e.g. an aspect ratio over 200
            raise InvalidInput(f"image {rgb.width}x{rgb.height} cannot be processed: {error}") from error
        grid = features["image_grid_thw"]
        ids = self.prompt_ids_for(grid, task)
        if len(ids) + max_new_tokens > self.max_context:
            raise InvalidInput(
                f"prompt of {len(ids)} tokens plus {max_new_tokens} new tokens exceeds the model's context of "
                f"{self.max_context} tokens; use a smaller image or fewer new tokens"
            )
        return EncodedPrompt(
            input_ids=torch.tensor([ids], dtype=torch.long),
            pixel_values=features["pixel_values"],
            image_grid_thw=grid,
            task=task,
            content_columns=int(features["content_columns"][0]) if "content_columns" in features else None,
        )

    def prompt_ids_for(self, image_grid_thw: torch.Tensor, task: str) -> list[int]:
        """The prompt for one image of this (1, 3) grid and `task`."""
        _, height, width = (int(v) for v in image_grid_thw[0])
        merge = self.image_processor.merge_size
        n_reading = 0
        if self.reading_placeholder_id is not None:
            from gravityocr.model.network.strip_vision import reading_slots

            n_reading = reading_slots(height // merge, width // merge)
        return self.prompt_ids(height * width // (merge * merge), task, n_reading)

    def prompt_ids(self, n_visual: int, task: str, n_reading: int = 0) -> list[int]:
        """The prompt around `n_visual` image placeholders (then `n_reading` reading-prefix
        placeholders) for `task`."""
        before, after = self.template.split("{image}")
        before_ids = self.tokenizer.encode(before, add_special_tokens=False)
        after_ids = self.tokenizer.encode(after.format(task=TASK_PROMPTS[task]), add_special_tokens=False)
        image_ids = [self.tokenizer.convert_tokens_to_ids(self.image_token)] * n_visual
        return before_ids + image_ids + [self.reading_placeholder_id] * n_reading + after_ids

    def output_budget(self, prompt: EncodedPrompt) -> int:
        """The most tokens a crop of this size can hold: CHARACTERS_PER_COLUMN per visual
        column on each of its lines (a row of visual tokens is half a line: rows of strips
        overlap by half, and GLM-OCR's 28-px rows are half a 56-px line), plus room for the
        eos and markup. A crop that reads past this is not reading its image. Columns are
        those the crop fills (`EncodedPrompt.content_columns`), not the padding after a short one."""
        _, height, width = (int(v) for v in prompt.image_grid_thw[0])
        merge = self.image_processor.merge_size
        lines = max(1, math.ceil(height // merge / 2))
        columns = width // merge if prompt.content_columns is None else min(width // merge, prompt.content_columns)
        return CHARACTERS_PER_COLUMN * columns * lines + BUDGET_SLACK

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)
