"""Scan-like and photo-like degradation of a clean render: what a scanner or a phone adds to a page.

Each augmentation is chosen and parametrised from the caller's random generator, so a
build with one seed degrades the same items the same way. The label never changes: every
step keeps the text legible at the strengths used here.

`scan_like` draws one to three independent steps (blur, noise, JPEG, ...). `photo_like` is a
page held under a lamp and taken with a phone, all of it at once: light falling off from one
side, a soft shadow across the page, the ink's contrast low, the page a little out of square,
a slight blur and a JPEG. It is the case that uniform faded pages and scans do not cover: the
paper's own brightness varies across the page by more than the ink differs from the paper.
"""

from __future__ import annotations

import io
import random

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

AUGMENTATIONS = ("blur", "noise", "jpeg", "skew", "contrast", "resolution")
# A photo's corners move by up to this share of the page's size: a page held square to the
# lens. Stronger keystones tilt a page's lines by different angles, which straightening one
# angle cannot undo.
PERSPECTIVE = 0.005


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


def _light_field(width: int, height: int, rng: random.Random) -> tuple[np.ndarray, str]:
    """A multiplicative light field in (0, 1]: bright on one side of the page and falling
    off towards the other along a random direction, with a soft-edged shadow band across it."""
    angle = rng.uniform(0.0, 2 * np.pi)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    along = (xs / width - 0.5) * np.cos(angle) + (ys / height - 0.5) * np.sin(angle)
    along = (along - along.min()) / max(float(np.ptp(along)), 1e-6)  # 0 at the lit side, 1 at the far side
    falloff = rng.uniform(0.35, 0.55)
    light = 1.0 - falloff * along ** rng.uniform(0.8, 1.6)
    # a shadow: a band whose edge crosses the page at another angle, softened over a tenth of it
    shadow_angle = angle + rng.uniform(np.pi / 4, 3 * np.pi / 4)
    across = (xs / width - 0.5) * np.cos(shadow_angle) + (ys / height - 0.5) * np.sin(shadow_angle)
    edge, softness = rng.uniform(-0.3, 0.3), rng.uniform(0.05, 0.15)
    depth = rng.uniform(0.15, 0.3)
    light *= 1.0 - depth / (1.0 + np.exp(-(across - edge) / (softness / 4)))
    return light, f"light{falloff:.2f}+shadow{depth:.2f}"


def _perspective(image: Image.Image, rng: random.Random, paper: tuple[int, int, int]) -> tuple[Image.Image, str]:
    """The page a little out of square: each corner moved by up to PERSPECTIVE of the page's
    size, `paper` (what lies past the page's edges) filling in where the page moved in."""
    width, height = image.size
    reach = PERSPECTIVE * min(width, height)
    corners = [(0, 0), (width, 0), (width, height), (0, height)]
    moved = [(x + rng.uniform(-reach, reach), y + rng.uniform(-reach, reach)) for x, y in corners]
    # PIL maps output to input: solve the 8 coefficients taking `corners` to `moved`
    rows, values = [], []
    for (x, y), (u, v) in zip(corners, moved):
        rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        values += [u, v]
    coefficients = np.linalg.solve(np.asarray(rows, dtype=np.float64), np.asarray(values, dtype=np.float64))
    turned = image.transform(image.size, Image.PERSPECTIVE, tuple(coefficients.tolist()), Image.BICUBIC,
                             fillcolor=paper)
    return turned, f"perspective{reach:.0f}px"


def photo_like(image: Image.Image, rng: random.Random, contrast: float | None = None) -> tuple[Image.Image, str]:
    """A page as a phone photographs it under one lamp (the module's docstring): low ink
    contrast (`contrast`, or drawn from 0.4-0.55), light falling off from one side and a soft
    shadow, a slight perspective, blur and JPEG. Deterministic for a given `rng` state;
    returns the image and the steps' names."""
    contrast = rng.uniform(0.4, 0.55) if contrast is None else contrast
    tint = rng.randint(225, 250)
    paper = (tint, tint, max(tint - rng.randint(0, 20), 0))
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    paper_rgb = np.asarray(paper, dtype=np.float32)
    faded = paper_rgb - (255.0 - pixels) * contrast * paper_rgb / 255.0  # ink lifted towards the paper's tint
    light, light_label = _light_field(image.width, image.height, rng)
    lit = Image.fromarray(np.clip(faded * light[:, :, None], 0, 255).astype(np.uint8))
    turned, turn_label = _perspective(lit, rng, tuple(int(v * 0.6) for v in paper))  # a table darker than the page
    radius = rng.uniform(0.6, 1.0)
    blurred = turned.filter(ImageFilter.GaussianBlur(radius))
    quality = rng.randint(50, 60)
    buffer = io.BytesIO()
    blurred.save(buffer, format="JPEG", quality=quality)
    buffer.seek(0)
    out = Image.open(buffer).convert("RGB")
    return out, "+".join((f"contrast{contrast:.2f}", light_label, turn_label, f"blur{radius:.1f}", f"jpeg{quality}"))


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
