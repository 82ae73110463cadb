"""A page scanned askew is straightened before layout (pipelines/deskew.py); a straight page
is left as it is."""

from __future__ import annotations

import pytest
from PIL import Image

from gravityocr.bench.synthetic_pages import single_column_page
from gravityocr.pipelines.deskew import skew_degrees, straighten
from gravityocr.pipelines.documents import Page
from gravityocr.pipelines.layout import ink_mask
from gravityocr.pipelines.page_ocr import PagePlanner


def _page(seed: int = 7) -> Image.Image:
    return single_column_page(seed=seed, furniture=False).image.convert("RGB")


def _lines(planner: PagePlanner, image: Image.Image):
    plan = planner.plan(Page("page", 1, image, image.width, image.height))
    return plan, [crop.line for crop in plan.crops]


@pytest.mark.parametrize("degrees", [-2.0, 1.2, 3.5])
def test_a_skewed_page_is_measured_and_straightened(degrees):
    straight = _page()
    skewed = straight.rotate(degrees, resample=Image.BICUBIC, fillcolor=(255, 255, 255))
    assert skew_degrees(ink_mask(skewed)) == pytest.approx(-degrees, abs=0.15)
    planner = PagePlanner()
    plan, lines = _lines(planner, skewed)
    _, straight_lines = _lines(planner, straight)
    assert plan.result.rotation == pytest.approx(-degrees, abs=0.15)
    assert plan.result.to_dict()["rotation"] == plan.result.rotation
    # the same lines, each one text line high, not bands of several lines across the skew
    assert len(lines) == len(straight_lines)
    tallest = max(y1 - y0 for _, y0, _, y1 in straight_lines)
    assert max(y1 - y0 for _, y0, _, y1 in lines) <= tallest + 6


def test_a_straight_page_is_left_untouched():
    straight = _page(seed=8)
    mask = ink_mask(straight)
    assert skew_degrees(mask) == 0.0
    image, degrees = straighten(straight, mask)
    assert image is straight and degrees == 0.0
    plan, _ = _lines(PagePlanner(), straight)
    assert plan.result.rotation == 0.0
    # a slight tilt within a line's band is left alone too
    slight = straight.rotate(0.15, resample=Image.BICUBIC, fillcolor=(255, 255, 255))
    assert skew_degrees(ink_mask(slight)) == 0.0


def test_a_blank_page_has_no_skew():
    blank = Image.new("RGB", (400, 300), "white")
    assert skew_degrees(ink_mask(blank)) == 0.0
