"""Photos and dim scans: a page lit unevenly is evened out before layout, a clean page is left
byte for byte as it is (pipelines/illumination.py); the photo-like degradation that makes such
pages (corpus/augment.py `photo_like`); and a page that still reads almost nothing says so
(`PageResult.warnings`, on stderr from `gravityocr ocr`)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from document_fixtures import png_bytes, tiny_model_dir  # noqa: F401
from gravityocr.corpus.synthetic_pages import single_column_page, table_formula_page
from gravityocr.corpus.augment import photo_like
from gravityocr.pipelines.documents import Page
from gravityocr.pipelines.illumination import measure, normalise
from gravityocr.pipelines.page_ocr import PagePlanner, ink_glyphs
from gravityocr.pipelines.recognizer import CropResult

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
REAL_PAGE = "page-bash-doc-1cee70c9c713"  # bash's manual, p. 26


def _page(image: Image.Image) -> Page:
    return Page("page", 1, image, image.width, image.height)


def _real_page() -> tuple[Image.Image, str]:
    from gravityocr.model.evaluation.manifest import read_manifest

    [item] = [item for item in read_manifest(REAL) if item.id == REAL_PAGE]
    return item.load_image().convert("RGB"), item.text


def test_a_clean_rendered_page_is_left_untouched():
    for image in (single_column_page(seed=1).image, table_formula_page(seed=2).image, _real_page()[0]):
        before = np.asarray(image).copy()
        assert not measure(image).needs_normalising, measure(image)
        assert normalise(image) is image
        assert np.array_equal(np.asarray(image), before)


def test_photo_like_is_seeded_and_deterministic():
    image = single_column_page(seed=3).image
    (first, label), (again, label_again) = photo_like(image, random.Random(7)), photo_like(image, random.Random(7))
    assert label == label_again and first.tobytes() == again.tobytes()
    other, other_label = photo_like(image, random.Random(8))
    assert other.tobytes() != first.tobytes() and other_label != label
    assert label.startswith("contrast") and "shadow" in label and "jpeg" in label
    assert photo_like(image, random.Random(7), contrast=0.45)[1].startswith("contrast0.45")


def test_a_photo_like_page_is_evened_out_and_laid_out_as_the_clean_page():
    clean = single_column_page(seed=4).image
    photo, _ = photo_like(clean, random.Random(4))
    assert measure(photo).needs_normalising
    evened = normalise(photo)
    assert evened is not photo and not np.array_equal(np.asarray(evened), np.asarray(photo))
    assert not measure(evened).needs_normalising
    clean_plan, photo_plan = PagePlanner().plan(_page(clean)), PagePlanner().plan(_page(photo))
    assert [r.type for r in photo_plan.result.regions] == [r.type for r in clean_plan.result.regions]
    assert len(photo_plan.crops) == len(clean_plan.crops)


@pytest.mark.skipif(not (REAL / "manifest.jsonl").exists(), reason="no data/real")
def test_a_photo_like_manual_page_reads_as_its_clean_render():
    from gravityocr.model.evaluation.scores import page_similarity
    from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer
    from gravityocr.pipelines.ocr_cli import default_model_path, has_weights
    from gravityocr.pipelines.page_ocr import PageOcr
    from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig

    if not has_weights(default_model_path()):
        pytest.skip("no default model in model/default")
    image, truth = _real_page()
    photo, _ = photo_like(image, random.Random(REAL_PAGE))
    reader = PageOcr(CropRecognizer(load_recognizer(DEFAULT_MODEL_DIR), RecognizerConfig()))
    [result] = reader.read_pages([_page(photo)])
    assert page_similarity(result.text(include_furniture=True), truth) >= 0.97
    assert result.warnings == []


def _filled(image: Image.Image, read) -> object:
    plan = PagePlanner().plan(_page(image))
    return PagePlanner.fill(plan, [read(crop) for crop in plan.crops], 0.0)


def test_a_page_that_reads_almost_nothing_says_so():
    image = single_column_page(seed=5).image
    nothing = _filled(image, lambda crop: CropResult("", finish_reason="eos"))
    [warning] = nothing.warnings
    assert warning.startswith("almost nothing read: 0 characters for about ")
    assert nothing.to_dict()["warnings"] == [warning]
    assert type(nothing).from_dict(json.loads(json.dumps(nothing.to_dict()))).warnings == [warning]
    # a page read as it should be (a character a glyph of ink, about): no warning
    words = lambda crop: CropResult(" ".join(["word"] * max(1, crop.image.width // 60)), finish_reason="eos")
    assert _filled(image, words).warnings == []
    # the glyphs are counted however the page is lit, and never in a picture
    assert abs(ink_glyphs(photo_like(image, random.Random(5))[0], []) - ink_glyphs(image, [])) < 0.2 * ink_glyphs(image, [])
    assert ink_glyphs(image, [(0, 0, image.width, image.height)]) == 0


def test_a_photo_like_page_read_before_it_was_evened_out_says_so(monkeypatch):
    """The page pipeline before the normaliser (layout on the photo as it is: one region of
    noise) reads almost nothing; the page says so."""
    import gravityocr.pipelines.page_ocr as page_ocr

    monkeypatch.setattr(page_ocr, "normalise", lambda image: image)
    photo, _ = photo_like(single_column_page(seed=4).image, random.Random(4))
    plan = PagePlanner().plan(_page(photo))
    assert len(plan.crops) < 10  # the lines were not found
    result = PagePlanner.fill(plan, [CropResult("a few words", finish_reason="eos") for _ in plan.crops], 0.0)
    assert result.warnings and result.warnings[0].startswith("almost nothing read")


def test_ocr_prints_a_pages_warnings_on_stderr_and_in_its_json(tmp_path, tiny_model_dir, capsys):
    """A recogniser allowed three tokens a crop reads almost nothing of a page: `ocr` exits 0
    (the page was read) and says so on stderr and in the page's JSON."""
    from gravityocr.pipelines import ocr_cli

    path = tmp_path / "page.png"
    path.write_bytes(png_bytes(single_column_page(seed=6, paragraphs=1).image))
    code = ocr_cli.main([str(path), "--model", str(tiny_model_dir), "--format", "json", "--max-new-tokens", "3",
                         "--no-progress"])
    captured = capsys.readouterr()
    [record] = [json.loads(line) for line in captured.out.splitlines()]
    [warning] = record["pages"][0]["warnings"]
    assert code == 0 and warning.startswith("almost nothing read: ")
    assert captured.err == f"gravityocr ocr: {path}: page 1: warning: {warning}\n"
