"""Line splitters: a `LineSplitter` cuts a text region into lines, because the recogniser
reads lines: `ProjectionLines` (row profile) or `RapidOcrLines` (PP-OCR text detection from
rapidocr's bundled models); `NoLines` reads each text region whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from gravityocr.pipelines.regions import Box, runs, trim


@dataclass
class ProjectionLines:
    """Lines from the row profile of the region's ink; slivers (an accent, the dot of an i
    alone on a row band) are merged into the nearest line; a line with a wide blank
    stretch is read as its pieces, left to right."""

    name: str = "projection"
    sliver: float = 0.35  # bands under this fraction of the median band height are merged
    # A line is cut where a blank run is this many times its height wide (a grammar's name
    # and its `::=`, a term and its description): the recogniser reads a line of words, and
    # wide blank stretches inside a crop make it lose its place. Word spaces are a third of that.
    cell_gap: float = 2.5

    def split(self, image: Image.Image, mask: np.ndarray, box: Box) -> list[Box]:
        x0, y0, x1, y1 = box
        sub = mask[y0:y1, x0:x1]
        bands = [list(span) for span in runs(sub.any(axis=1), 1)]
        if not bands:
            return []
        median = float(np.median([b - a for a, b in bands]))
        i = 0
        while len(bands) > 1 and i < len(bands):
            a, b = bands[i]
            if b - a < self.sliver * median:
                gap_up = a - bands[i - 1][1] if i > 0 else 10**9
                gap_down = bands[i + 1][0] - b if i + 1 < len(bands) else 10**9
                j = i - 1 if gap_up <= gap_down else i + 1
                bands[j] = [min(bands[j][0], a), max(bands[j][1], b)]
                del bands[i]
                i = 0
                continue
            i += 1
        lines = []
        for a, b in bands:
            trimmed = trim(mask, (x0, y0 + a, x1, y0 + b))
            if trimmed is None:
                continue
            lx0, ly0, lx1, ly1 = trimmed
            gap = max(1, int(self.cell_gap * (ly1 - ly0)))
            for c0, c1 in runs(mask[ly0:ly1, lx0:lx1].any(axis=0), gap):
                piece = trim(mask, (lx0 + c0, ly0, lx0 + c1, ly1))
                if piece is not None:
                    lines.append(piece)
        return lines


class RapidOcrLines:
    """PP-OCR text detection (rapidocr's bundled PP-OCRv6 det model, offline), run once per
    page; a region's lines are the detected boxes centred in it, grouped by vertical overlap
    and clipped to the region. A region where nothing was detected falls back to the
    projection splitter, so detection misses never drop text."""

    name = "rapidocr"

    def __init__(self):
        try:
            from rapidocr import RapidOCR
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError("the 'rapidocr' line splitter needs rapidocr and onnxruntime: "
                              "pip install -e . (rapidocr, rapid-layout, onnxruntime)") from error
        self._engine = RapidOCR(params={"Global.log_level": "warning", "Global.use_cls": False,
                                        "Global.use_rec": False})
        self._page: Image.Image | None = None  # the page the cached boxes belong to
        self._boxes: list[Box] = []

    def _detect(self, image: Image.Image) -> list[Box]:
        if self._page is not image:
            result = self._engine(np.asarray(image.convert("RGB"))[:, :, ::-1], use_det=True, use_cls=False,
                                  use_rec=False)
            quads = getattr(result, "boxes", None)
            quads = [] if quads is None else np.asarray(quads)
            self._boxes = [(int(q[:, 0].min()), int(q[:, 1].min()), int(q[:, 0].max()) + 1, int(q[:, 1].max()) + 1)
                           for q in quads]
            self._page = image
        return self._boxes

    def split(self, image: Image.Image, mask: np.ndarray, box: Box) -> list[Box]:
        x0, y0, x1, y1 = box
        inside = [b for b in self._detect(image)
                  if x0 <= (b[0] + b[2]) / 2 <= x1 and y0 <= (b[1] + b[3]) / 2 <= y1]
        if not inside:
            return ProjectionLines().split(image, mask, box)
        lines: list[list[int]] = []
        for bx0, by0, bx1, by1 in sorted(inside, key=lambda b: (b[1] + b[3]) / 2):
            if lines:
                last = lines[-1]
                overlap = min(last[3], by1) - max(last[1], by0)
                if overlap > 0.5 * min(last[3] - last[1], by1 - by0):
                    lines[-1] = [min(last[0], bx0), min(last[1], by0), max(last[2], bx1), max(last[3], by1)]
                    continue
            lines.append([bx0, by0, bx1, by1])
        clipped = [(max(x0, a), max(y0, b), min(x1, c), min(y1, d)) for a, b, c, d in lines]
        return [line for line in clipped if line[2] > line[0] and line[3] > line[1]]


class NoLines:
    """Read each text region whole (for recognisers trained on paragraphs)."""

    name = "none"

    def split(self, image: Image.Image, mask: np.ndarray, box: Box) -> list[Box]:
        return []

