"""Light text on a dark ground turned dark on light before layout.

The ink mask takes what is dark for ink. A running head set white on a dark band, a heading
on a coloured bar, a table's header row in reverse, a terminal's screenshot: to the mask their
ground is ink and their words are holes in it, so the block is typed a figure (or its crop
reaches the recogniser as light marks on black) and its words are lost. So a dark area that
holds light glyphs (`dark_areas`: a solid component of the ink, its holes laid out like text)
is inverted in the image the page is read from (`light_on_dark`); layout, line splitting and
crops then see dark text on a light ground. Figures are cut from the page as it was, so a
picture never comes out inverted.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from gravityocr.pipelines.figures import holds_text
from gravityocr.pipelines.regions import Box, PageStats

SOLID = 0.6  # a component whose ink fills this share of its box is a dark area (a stroke fills far less)
MOST_LIGHT = 0.5  # its holes are text when they fill at most this share of it (words on a ground)
TALLEST_TEXT = 4.0  # and their lines are at most this many of the page's line heights high


def dark_areas(mask: np.ndarray) -> list[tuple[Box, np.ndarray]]:
    """The dark areas of a page that hold light text: each one's box and, within the box,
    the pixels it covers (its outline filled, the glyphs' holes included)."""
    import cv2

    line_height = PageStats.of(mask).line_height
    count, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    found = []
    for label in range(1, count):
        x, y, width, height, area = stats[label].tolist()
        if height < 0.8 * line_height or width * height < 4 * line_height ** 2 or area < SOLID * width * height:
            continue
        shape = (labels[y:y + height, x:x + width] == label).astype(np.uint8)
        outline, _ = cv2.findContours(shape, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        covered = cv2.drawContours(np.zeros_like(shape), outline, -1, 1, thickness=cv2.FILLED).astype(bool)
        light = covered & ~mask[y:y + height, x:x + width]
        if not light.any() or light.sum() > MOST_LIGHT * covered.sum():
            continue
        text_height = PageStats.of(light).line_height
        if text_height <= TALLEST_TEXT * line_height and holds_text(light, (0, 0, width, height), text_height):
            found.append(((x, y, x + width, y + height), covered))
    return found


def light_on_dark(image: Image.Image, mask: np.ndarray) -> Image.Image:
    """`image` with every dark area that holds light text (`dark_areas`; `mask`: the
    image's ink) inverted; `image` itself when there is none."""
    areas = dark_areas(mask)
    if not areas:
        return image
    pixels = np.asarray(image.convert("RGB")).copy()
    for (x0, y0, x1, y1), covered in areas:
        area = pixels[y0:y1, x0:x1]
        area[covered] = 255 - area[covered]
    return Image.fromarray(pixels)
