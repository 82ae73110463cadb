"""Synthetic training and evaluation crops: rendered text lines, tables and formulas with targets.

No document data set is reachable here, so the small model learns from crops rendered on
the fly. Everything is deterministic by seed, so a training run, a held-out set and a test
can name a crop by (seed, stage, kind) alone: the kind's ink mask goes on paper, is degraded
as the stage's noise says and shrunk to the crop limits.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

from gravityocr.model.training.curriculum import KINDS, MAX_HEIGHT, MAX_WIDTH, CurriculumStage
from gravityocr.model.training.formula_crops import render_formula_mask
from gravityocr.model.training.table_crops import TableLayout, render_table_mask
from gravityocr.model.training.text_crops import render_text_mask


@dataclass
class SyntheticCrop:
    image: Image.Image  # RGB
    type: str  # "text" | "table" | "formula"
    text: str  # the target the recogniser must write
    table: TableLayout | None = None  # the rendered grid, for tables


# ---------------------------------------------------------------- degradation


def _degrade(rng: random.Random, mask: Image.Image, noise: float) -> Image.Image:
    """Ink on paper, then scanner-like damage scaled by `noise` in [0, 1]; grayscale throughout."""
    paper = 255 - rng.randint(0, int(40 * noise))
    ink = rng.randint(0, int(90 * noise))
    image = Image.composite(Image.new("L", mask.size, ink), Image.new("L", mask.size, paper), mask)
    if noise <= 0:
        return image.convert("RGB")
    if rng.random() < noise:
        angle = rng.uniform(-2.0, 2.0) * min(1.0, noise * 2)
        image = image.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=paper)
    if rng.random() < noise * 0.6:
        image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 0.3 + noise)))
    if rng.random() < noise * 0.5:
        image = ImageEnhance.Contrast(image).enhance(rng.uniform(1 - 0.5 * noise, 1 + 0.3 * noise))
    if rng.random() < noise * 0.5:  # sensor noise
        pixels = np.asarray(image, dtype=np.float32)
        jitter = np.random.default_rng(rng.getrandbits(64)).normal(0, rng.uniform(1.5, 1.5 + 6 * noise), pixels.shape)
        image = Image.fromarray(np.clip(pixels + jitter, 0, 255).astype(np.uint8))
    if rng.random() < noise * 0.4:  # dust: sparse dark and light specks
        pixels = np.array(image)
        speckle = np.random.default_rng(rng.getrandbits(64))
        hit = speckle.random(pixels.shape) < rng.uniform(0.001, 0.001 + 0.01 * noise)
        pixels[hit] = np.where(speckle.random(int(hit.sum())) < 0.5, ink, paper)
        image = Image.fromarray(pixels)
    if rng.random() < noise * 0.5:
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=rng.randint(int(95 - 60 * noise), 95))
        image = Image.open(io.BytesIO(buffer.getvalue())).convert("L")
    return image.convert("RGB")


def _shrink_to_limits(image: Image.Image) -> Image.Image:
    scale = min(1.0, MAX_WIDTH / image.width, MAX_HEIGHT / image.height)
    if scale >= 1.0:
        return image
    size = (max(1, int(image.width * scale)), max(1, int(image.height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS)


# ---------------------------------------------------------------- public entry points


def generate_crop(seed: int, stage: CurriculumStage, kind: str | None = None) -> SyntheticCrop:
    """The crop named by (seed, stage, kind); kind None draws it from stage.type_weights."""
    if kind is None:
        kinds = [k for k in KINDS if stage.type_weights.get(k, 0) > 0]
        kind = random.Random(f"kind|{seed}|{stage!r}").choices(kinds, [stage.type_weights[k] for k in kinds])[0]
    if kind not in KINDS:
        raise ValueError(f"unknown crop kind {kind!r}; expected one of {KINDS}")
    rng = random.Random(f"{seed}|{kind}|{stage!r}")
    table = None
    if kind == "text":
        mask, target = render_text_mask(rng, stage)
    elif kind == "table":
        mask, table = render_table_mask(rng, stage)
        target = table.to_html()
    else:
        mask, target = render_formula_mask(rng, stage)
    image = _shrink_to_limits(_degrade(rng, mask, stage.noise))
    return SyntheticCrop(image=image, type=kind, text=target, table=table)


def crop_stream(seed: int, stage: CurriculumStage, kind: str | None = None) -> Iterator[SyntheticCrop]:
    """Crops for seeds seed, seed+1, ... forever. Training keeps its seeds below 10**9 (held-out uses the rest)."""
    index = seed
    while True:
        yield generate_crop(index, stage, kind)
        index += 1
