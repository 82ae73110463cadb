"""rapidocr's own rec preprocessing for the PP-OCRv6 recognizer (model/network/ppocr_tower.py).

`preprocess` / `preprocess_batch` reproduce it (cv2 bilinear resize to height 48 keeping the
aspect ratio, BGR, (x/255 − 0.5)/0.5, zero right-padding to int(48 · max(320/48, w/h))) bit for
bit for RGB, L and 1-bit images; cv2 comes with rapidocr (the `layout` extra) and is imported
only there.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from gravityocr.model.network.ppocr_tower import IMAGE_HEIGHT

MIN_WH_RATIO = 320 / 48  # rapidocr's rec_img_shape [3, 48, 320]: lines are padded to at least 320 px


def _to_bgr(image) -> np.ndarray:
    if image.mode == "1":
        image = image.convert("L")
    if image.mode == "L":
        gray = np.asarray(image)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if image.mode != "RGB":
        # rapidocr composites RGBA over a contrast-chosen background; PIL's conversion does not.
        image = image.convert("RGB")
    return np.ascontiguousarray(np.asarray(image)[:, :, ::-1])


def _wh_ratio(image) -> float:
    return image.width * 1.0 / image.height


def preprocess(image, max_wh_ratio: float | None = None) -> torch.Tensor:
    """(3, 48, W) float32 for one PIL image, as rapidocr's `resize_norm_img` makes it.

    W = int(48 · max_wh_ratio), by default max(320/48, the image's w/h); a batch passes its
    largest ratio so that all its lines share one width (see `preprocess_batch`).
    """
    import cv2  # rapidocr's dependency; only preprocessing needs it

    if max_wh_ratio is None:
        max_wh_ratio = max(MIN_WH_RATIO, _wh_ratio(image))
    img_width = int(IMAGE_HEIGHT * max_wh_ratio)
    ratio = image.width / float(image.height)
    resized_w = min(img_width, int(math.ceil(IMAGE_HEIGHT * ratio)))
    resized = cv2.resize(_to_bgr(image), (resized_w, IMAGE_HEIGHT)).astype("float32")
    resized = resized.transpose((2, 0, 1)) / 255
    resized -= 0.5
    resized /= 0.5
    padded = np.zeros((3, IMAGE_HEIGHT, img_width), dtype=np.float32)
    padded[:, :, :resized_w] = resized
    return torch.from_numpy(padded)


def preprocess_batch(images: Sequence) -> torch.Tensor:
    """(N, 3, 48, W) for PIL images in the given order, one shared width as rapidocr's
    batches have (rapidocr also sorts lines by aspect ratio before batching; this does not)."""
    max_wh_ratio = max([MIN_WH_RATIO] + [_wh_ratio(image) for image in images])
    return torch.stack([preprocess(image, max_wh_ratio) for image in images])
