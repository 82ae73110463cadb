"""Evening out a page's light before layout: photographed pages and dim scans.

The ink mask (layout.ink_mask) splits a page's grey levels at one threshold. Under a lamp
that lights one side of a page, the paper on the far side is darker than the ink on the
near side, so no threshold separates them: the page came out as one region of noise, read
as almost nothing. So a page whose paper is unevenly lit, or whose ink barely differs from
its paper, is normalised before anything else looks at it: its paper's brightness is
estimated everywhere (a grey closing, dark marks narrower than a few text lines taken out,
on a reduced copy) and divided out, the ink is stretched back to black on white, and what a
photo shows past the page's edge (a dark strip along the image's border, which would run past
every line) is painted over.

Only such pages: a page whose paper is evenly lit and whose ink is dark (a born-digital page
in black ink) is returned as the very same image object, so its pixels, and everything read from
them, stay as they were. The lighting is measured on a smooth surface fitted to the paper
alone (darker patches, a figure or a shaded box, are left out of the fit), so a picture on
a clean page does not count as uneven light.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from gravityocr.pipelines.regions import ink_mask

WORKING_SIDE = 512  # pixels on the longer side of the reduced copy the paper is estimated on
CLOSING = 1 / 40  # the closing's width as a share of the page's longer side: wider than a text line
# Paper darker than its brightest by this share somewhere on the page: uneven light (a born-
# digital table's shaded cells stay under it, a lamp from one side goes far past it).
UNEVEN = 0.2
# Ink within this share of the paper's brightness of it: too faint (a born-digital page's light
# grey text and tinted cells stay above it and read as they are; docs/page-pipeline.md).
LOW_CONTRAST = 0.3
BORDER = 0.03  # a photo's view past the page's edge lies within this share of its shorter side of the border


@dataclass(frozen=True)
class Lighting:
    """How a page is lit: `unevenness` is the share by which its paper's brightness falls
    from its brightest to its darkest (0: evenly lit); `contrast` is the share of the paper's
    brightness by which its darkest ink stands below it (1: black on white)."""

    unevenness: float
    contrast: float

    @property
    def needs_normalising(self) -> bool:
        return self.unevenness >= UNEVEN or self.contrast <= LOW_CONTRAST


def _reduced(gray: np.ndarray) -> np.ndarray:
    import cv2

    scale = WORKING_SIDE / max(gray.shape)
    if scale >= 1:
        return gray.astype(np.float32)
    size = (max(1, round(gray.shape[1] * scale)), max(1, round(gray.shape[0] * scale)))
    return cv2.resize(gray, size, interpolation=cv2.INTER_AREA).astype(np.float32)


def paper_brightness(small: np.ndarray) -> np.ndarray:
    """The paper's brightness at every pixel of a reduced page: a grey closing (marks
    narrower than CLOSING of the page are dark on bright paper and go), smoothed."""
    import cv2

    width = max(3, int(round(CLOSING * max(small.shape))) | 1)
    kernel = cv2.getStructuringElement(cv2.MORPH_RECT, (width, width))
    closed = cv2.morphologyEx(small, cv2.MORPH_CLOSE, kernel)
    return cv2.GaussianBlur(closed, (0, 0), width / 2)


def _paper_surface(background: np.ndarray) -> np.ndarray:
    """A quadratic surface fitted to the paper's brightness, points far below the fit (a
    figure, a shaded box: not paper) left out: light varies smoothly across a page, a
    picture's edge does not."""
    height, width = background.shape
    step = max(1, max(height, width) // 64)
    ys, xs = np.mgrid[0:height:step, 0:width:step]
    values = background[::step, ::step].ravel().astype(np.float64)
    x, y = xs.ravel() / width - 0.5, ys.ravel() / height - 0.5
    terms = np.stack([np.ones_like(x), x, y, x * x, x * y, y * y], axis=1)
    keep = np.ones(values.size, dtype=bool)
    for _ in range(4):
        coefficients, *_ = np.linalg.lstsq(terms[keep], values[keep], rcond=None)
        fitted = terms @ coefficients
        keep = values >= fitted - 0.08 * max(float(fitted.max()), 1.0)
    return fitted.reshape(xs.shape)


def measure(image: Image.Image) -> Lighting:
    """The page's `Lighting`: its paper's on a reduced grey copy, its ink's at full size
    (thin strokes fade in a reduced copy)."""
    gray = np.asarray(image.convert("L"))
    surface = _paper_surface(paper_brightness(_reduced(gray)))
    brightest = max(float(surface.max()), 1.0)
    unevenness = (brightest - max(float(surface.min()), 0.0)) / brightest
    paper = float(np.percentile(gray, 90))
    ink = _darkest(gray)
    return Lighting(round(unevenness, 4), round((paper - ink) / max(paper, 1.0), 4))


def _darkest(values: np.ndarray) -> float:
    """The level of a page's darkest ink: the level below which a few hundred pixels lie (a
    percentile would land on paper on a page of a few lines; the minimum on one stray pixel)."""
    flat = values.ravel()
    count = min(flat.size - 1, max(50, flat.size // 10_000))
    return float(np.partition(flat, count)[count])


def normalise(image: Image.Image) -> Image.Image:
    """`image` with its paper's light divided out and its ink stretched to black on white
    when its `Lighting` needs it; else `image` itself, untouched."""
    if not measure(image).needs_normalising:
        return image
    import cv2

    rgb = np.asarray(image.convert("RGB"), dtype=np.float32)
    gray = np.asarray(image.convert("L"))
    small = _reduced(gray)
    background = cv2.resize(paper_brightness(small), (gray.shape[1], gray.shape[0]), interpolation=cv2.INTER_LINEAR)
    ratio = gray.astype(np.float32) / np.maximum(background, 1.0)
    paper = float(np.median(ratio))  # most of a page is paper
    ink = _darkest(ratio)
    span = max(paper - ink, 1e-3)
    levelled = rgb / np.maximum(background, 1.0)[:, :, None]
    out = np.clip((levelled - ink) / span, 0.0, 1.0) * 255.0
    out[_surroundings(np.clip((ratio - ink) / span, 0.0, 1.0) * 255.0)] = 255.0
    return Image.fromarray(out.round().astype(np.uint8))


def _surroundings(gray: np.ndarray) -> np.ndarray:
    """What a photo shows beyond the page's edge: dark ink that touches the image's border
    and lies (nine tenths of it) within BORDER of the shorter side from it. Left in, such a
    strip runs past every line of text, and no blank row or column parts the page."""
    import cv2

    height, width = gray.shape
    count, labels, stats, _ = cv2.connectedComponentsWithStats(
        ink_mask(Image.fromarray(gray.astype(np.uint8))).astype(np.uint8), connectivity=8)
    depth = max(2, int(BORDER * min(height, width)))
    band = np.ones(gray.shape, dtype=bool)
    band[depth:height - depth, depth:width - depth] = False
    in_band = np.bincount(labels[band], minlength=count)
    x, y, w, h, area = (stats[:, column] for column in range(5))
    touching = (x == 0) | (y == 0) | (x + w == width) | (y + h == height)
    strips = [label for label in range(1, count) if touching[label] and in_band[label] >= 0.9 * area[label]]
    return np.isin(labels, strips) if strips else np.zeros(gray.shape, dtype=bool)
