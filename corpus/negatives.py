"""Crops that hold nothing to read, each with the empty target: what a reader must answer
for a blank box, speckled paper, noise, a lone rule or a frame, whatever it was asked to read
(a blank crop sent with the formula prompt wrote 63 tokens of invented LaTeX, noise 155).
A training build adds them beside the Debian items (`gravityocr data build --negatives N`),
so the decoder learns to write its eos at once there: a short, bounded output by the model
itself, at every entry point, rather than a rule at one of them."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from gravityocr.corpus.items import CorpusItem, Source

PACKAGE = "generated-negatives"  # not a Debian package: the shards' package column names it so
KINDS = ("blank", "specks", "noise", "rule", "frame")


def negative_items(type: str, seed: int, count: int) -> Iterator[CorpusItem]:
    """`count` crops without text, kinds in turn, sizes and tones drawn from `seed`."""
    rng = random.Random(f"{seed}/{type}/negatives")
    for index in range(count):
        kind = KINDS[index % len(KINDS)]
        width, height = rng.randint(40, 900), rng.randint(20, 160)
        yield CorpusItem(type, _draw(kind, width, height, rng), "",
                         Source(PACKAGE, "", "CC0-1.0", locator=f"{kind}-{index}", renderer="numpy"))


def _draw(kind: str, width: int, height: int, rng: random.Random) -> Image.Image:
    paper = rng.randint(200, 255)
    pixels = np.full((height, width), paper, dtype=np.float32)
    generator = np.random.default_rng(rng.getrandbits(32))
    if kind == "specks":
        specks = generator.random((height, width)) < rng.uniform(0.002, 0.02)
        pixels[specks] = rng.randint(0, 120)
    elif kind == "noise":
        pixels = pixels + generator.normal(0.0, rng.uniform(10, 60), (height, width))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).convert("RGB")
    draw = ImageDraw.Draw(image)
    ink = (rng.randint(0, 80),) * 3
    if kind == "rule":
        y = rng.randint(height // 4, 3 * height // 4)
        draw.line([(rng.randint(0, width // 8), y), (width - 1 - rng.randint(0, width // 8), y)], fill=ink,
                  width=rng.randint(1, 3))
    elif kind == "frame":
        inset = rng.randint(1, 6)
        draw.rectangle([inset, inset, width - 1 - inset, height - 1 - inset], outline=ink, width=rng.randint(1, 2))
    return image.filter(ImageFilter.GaussianBlur(rng.uniform(0.0, 0.8)))
