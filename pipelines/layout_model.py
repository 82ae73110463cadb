"""The rapid-layout backend: `RapidLayout` finds typed regions on a page image (unordered)
with rapid-layout's bundled PP-Layout CDLA ONNX model on onnxruntime, the ink it misses
recovered by the projection backend (pipelines/projection_layout.py). `CDLA_TYPES` maps the
model's labels to region types.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from gravityocr.pipelines.projection_layout import ProjectionLayout
from gravityocr.pipelines.regions import Box, PageStats, Region

# PP-Layout CDLA's labels -> our region types.
CDLA_TYPES = {
    "text": "text", "title": "title", "figure": "figure", "figure_caption": "caption", "table": "table",
    "table_caption": "caption", "header": "header", "footer": "footer", "reference": "reference",
    "equation": "formula",
}


class RapidLayout:
    """rapid-layout's PP-Layout CDLA model (bundled in its wheel, runs offline on onnxruntime).

    The model is coarse: it misses small blocks (page numbers, short lines) and its boxes
    clip ink. With `fill_gaps`, ink that no detected region covers is laid out by the
    projection backend and added, so no text is silently dropped; overlapping detections
    are resolved in favour of the more confident one."""

    name = "rapid"

    def __init__(self, model_type: str = "pp_layout_cdla", conf_thresh: float = 0.5, fill_gaps: bool = True):
        try:
            from rapid_layout import RapidLayout as _RapidLayout
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError("the 'rapid' layout backend needs rapid-layout and onnxruntime: "
                              "pip install -e . (rapidocr, rapid-layout, onnxruntime)") from error
        import logging

        logging.getLogger("rapid_layout").setLevel(logging.WARNING)
        self._engine = _RapidLayout(model_type=model_type, conf_thresh=conf_thresh)
        for name in list(logging.root.manager.loggerDict):
            if name.startswith("rapid_layout"):
                logging.getLogger(name).setLevel(logging.WARNING)
        self.fill_gaps = fill_gaps
        self._fallback = ProjectionLayout()

    def detect(self, image: Image.Image, mask: np.ndarray) -> list[Region]:
        result = self._engine(np.asarray(image.convert("RGB"))[:, :, ::-1])  # the model expects BGR
        height, width = mask.shape
        candidates = []
        for box, label, score in zip(result.boxes or [], result.class_names or [], result.scores or []):
            x0, y0, x1, y1 = (int(round(v)) for v in box)
            x0, y0, x1, y1 = max(0, x0), max(0, y0), min(width, x1), min(height, y1)
            if x1 - x0 < 2 or y1 - y0 < 2:
                continue
            candidates.append(Region((x0, y0, x1, y1), CDLA_TYPES.get(label, "text"), score=float(score)))
        regions = _drop_contained(candidates)
        if self.fill_gaps:
            regions += self._uncovered(mask, regions)
        return regions

    def _uncovered(self, mask: np.ndarray, regions: list[Region]) -> list[Region]:
        rest = mask.copy()
        for region in regions:
            x0, y0, x1, y1 = region.bbox
            rest[y0:y1, x0:x1] = False
        if rest.sum() < 50:
            return []
        stats = PageStats.of(mask)
        new: list[Region] = []
        for extra in self._fallback.detect(Image.fromarray(~rest), rest):
            # Ink a detected box clipped (a line's last word, a descender) grows that box.
            owners = [r for r in regions if _adjacent(r.bbox, extra.bbox, stats.line_height)]
            owner = min(owners, key=lambda r: (_gap(r.bbox, extra.bbox), r.type == "figure"), default=None)
            if owner is not None:
                owner.bbox = (min(owner.bbox[0], extra.bbox[0]), min(owner.bbox[1], extra.bbox[1]),
                              max(owner.bbox[2], extra.bbox[2]), max(owner.bbox[3], extra.bbox[3]))
            elif (extra.bbox[2] - extra.bbox[0]) * (extra.bbox[3] - extra.bbox[1]) > stats.line_height ** 2 / 4:
                new.append(extra)
        return new


def _gap(a: Box, b: Box) -> int:
    return max(a[0] - b[2], b[0] - a[2], 0) + max(a[1] - b[3], b[1] - a[3], 0)


def _adjacent(box: Box, piece: Box, reach: float) -> bool:
    """`piece` overlaps `box` along one axis and is within `reach` of it along the other."""
    overlap_y = min(box[3], piece[3]) - max(box[1], piece[1])
    overlap_x = min(box[2], piece[2]) - max(box[0], piece[0])
    gap_x = max(box[0] - piece[2], piece[0] - box[2], 0)
    gap_y = max(box[1] - piece[3], piece[1] - box[3], 0)
    return ((overlap_y > 0.5 * (piece[3] - piece[1]) and gap_x <= reach)
            or (overlap_x > 0.5 * (piece[2] - piece[0]) and gap_y <= reach / 2))


def _area(box: Box) -> int:
    return max(0, box[2] - box[0]) * max(0, box[3] - box[1])


def _intersection(a: Box, b: Box) -> int:
    return _area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def _drop_contained(regions: list[Region], contained: float = 0.7) -> list[Region]:
    """Keep the more confident of two regions when one lies mostly inside the other."""
    kept: list[Region] = []
    for region in sorted(regions, key=lambda r: -r.score):
        if all(_intersection(region.bbox, k.bbox) < contained * min(_area(region.bbox), _area(k.bbox)) for k in kept):
            kept.append(region)
    return kept

