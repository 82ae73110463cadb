"""Scan-like degradation of a clean render: what a scanner or a phone adds to a page.

Each augmentation is chosen and parametrised from the caller's random generator, so a
build with one seed degrades the same items the same way. The label never changes: every
step keeps the text legible at the strengths used here.
"""

from __future__ import annotations

import io
import random

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

AUGMENTATIONS = ("blur", "noise", "jpeg", "skew", "contrast", "resolution")


def _blur(image: Image.Image, rng: random.Random) -> tuple[Image.Image, str]:
    radius = rng.uniform(0.4, 1.1)
    return image.filter(ImageFilter.GaussianBlur(radius)), f"blur{radius:.1f}"


def _noise(image: Image.Image, rng: random.Random) -> tuple[Image.Image, str]:
    sigma = rng.uniform(4.0, 14.0)
    noise = np.random.default_rng(rng.getrandbits(32)).normal(0.0, sigma, (image.height, image.width, 1))
    pixels = np.asarray(image, dtype=np.float32) + noise
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)), f"noise{sigma:.0f}"


def _jpeg(image: Image.Image, rng: random.Random) -> tuple[Image.Image, str]:
    quality = rng.randint(25, 60)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    buffer.seek(0)
    return Image.open(buffer).convert("RGB"), f"jpeg{quality}"


def _skew(image: Image.Image, rng: random.Random) -> tuple[Image.Image, str]:
    # A line's height bounds how far it may turn before it leaves its own crop.
    limit = min(1.5, 40.0 * image.height / max(image.width, 1))
    angle = rng.uniform(-limit, limit)
    return image.rotate(angle, resample=Image.BICUBIC, expand=True, fillcolor=(255, 255, 255)), f"skew{angle:+.1f}"


def _contrast(image: Image.Image, rng: random.Random) -> tuple[Image.Image, str]:
    factor = rng.uniform(0.45, 0.8)
    tint = rng.randint(200, 245)
    faded = ImageEnhance.Contrast(image).enhance(factor)
    paper = Image.new("RGB", image.size, (tint, tint, max(tint - rng.randint(0, 25), 0)))
    return Image.blend(faded, paper, rng.uniform(0.0, 0.25)), f"contrast{factor:.2f}"


def _resolution(image: Image.Image, rng: random.Random) -> tuple[Image.Image, str]:
    factor = rng.uniform(0.45, 0.8)
    small = image.resize((max(1, round(image.width * factor)), max(1, round(image.height * factor))), Image.BILINEAR)
    return small.resize(image.size, Image.BILINEAR), f"resolution{factor:.2f}"


_STEPS = {"blur": _blur, "noise": _noise, "jpeg": _jpeg, "skew": _skew, "contrast": _contrast,
          "resolution": _resolution}


def scan_like(image: Image.Image, rng: random.Random, steps: int | None = None) -> tuple[Image.Image, str]:
    """One to three degradations in a random order; returns the image and their names."""
    count = steps if steps is not None else rng.randint(1, 3)
    names = rng.sample(AUGMENTATIONS, count)
    applied = []
    image = image.convert("RGB")
    for name in names:
        image, label = _STEPS[name](image, rng)
        applied.append(label)
    return image, "+".join(applied)
