"""Straightening a skewed page before layout.

The projection layout and line splitter cut a page along blank rows and columns; on a page
scanned a degree or two askew, neighbouring lines overlap in every row and a whole page
comes out as one region of a few "lines" each several lines high. So a page is turned by its
skew before it is laid out: the angle is the one whose row profile of the ink is sharpest
(the sum of squared row sums is largest when lines run along rows), searched coarsely then
finely, on a half-size mask for a page (a table's small image at full size, where half a
degree may not move a pixel of the half-size one). Born-digital pages measure 0 and are left as they are.

The page's boxes are in the straightened image (`PageResult.rotation` says by how much it
was turned); its size is kept.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from gravityocr.pipelines.regions import paper_colour

MAX_DEGREES = 5.0  # scanners and phone photos of a page held straight skew less than this
COARSE_STEP, FINE_STEP = 0.5, 0.1  # degrees
MIN_DEGREES = 0.3  # smaller skews are left alone: a line still fits its row band
HALF_SIZE_ABOVE = 1000  # pixels on the longer side: larger images are measured at half size


def _sharpness(mask: np.ndarray, degrees: float) -> float:
    import cv2

    height, width = mask.shape
    turn = cv2.getRotationMatrix2D((width / 2, height / 2), degrees, 1.0)
    turned = cv2.warpAffine(mask, turn, (width, height), flags=cv2.INTER_NEAREST, borderValue=0)
    rows = turned.sum(axis=1, dtype=np.float64)
    return float((rows * rows).sum())


def skew_degrees(mask: np.ndarray) -> float:
    """The angle (degrees, counter-clockwise, as `Image.rotate` takes it) that makes the
    ink's lines run along rows, 0 when it is under MIN_DEGREES or the page has no ink."""
    step = 2 if max(mask.shape) > HALF_SIZE_ABOVE else 1
    small = np.ascontiguousarray(mask[::step, ::step]).astype(np.uint8)
    if small.sum() < 100:
        return 0.0
    # of equally sharp angles the one nearest 0: a turn too small to move a pixel is no turn
    sharpest = lambda angles: float(max(angles, key=lambda degrees: (_sharpness(small, degrees), -abs(degrees))))
    best = sharpest(np.arange(-MAX_DEGREES, MAX_DEGREES + 1e-9, COARSE_STEP))
    best = sharpest(np.arange(best - COARSE_STEP, best + COARSE_STEP + 1e-9, FINE_STEP))
    return round(best, 2) if abs(best) >= MIN_DEGREES else 0.0


def straighten(image: Image.Image, mask: np.ndarray) -> tuple[Image.Image, float]:
    """`image` turned by its skew (`mask`: its ink), the same size, corners filled with the
    paper's colour; and the angle it was turned by (0: the image itself, untouched)."""
    degrees = skew_degrees(mask)
    if degrees == 0.0:
        return image, 0.0
    rgb = image.convert("RGB")
    return rgb.rotate(degrees, resample=Image.BICUBIC, fillcolor=paper_colour(np.asarray(rgb), mask)), degrees
