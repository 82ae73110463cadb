"""The evaluation manifest: round trip, clear errors for malformed lines, the committed held-out set."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from gravityocr.model.evaluation.manifest import ManifestItem, read_manifest, write_manifest
from gravityocr.model.training.heldout import write_synthetic_set
from gravityocr.model.training.curriculum import CURRICULUM, MAX_HEIGHT, MAX_WIDTH, VOCABULARY

HELDOUT = Path(__file__).resolve().parents[1] / "data" / "heldout"


def _write_lines(directory: Path, lines: list[str]) -> None:
    (directory / "manifest.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_write_then_read_round_trip(tmp_path):
    (tmp_path / "images").mkdir()
    image_path = tmp_path / "images" / "a.png"
    Image.new("RGB", (4, 4), "white").save(image_path)
    items = [ManifestItem("a", image_path, "text", "héllo\nworld"), ManifestItem("b", tmp_path / "b.png", "page", "")]
    write_manifest(tmp_path, items)
    record = json.loads((tmp_path / "manifest.jsonl").read_text().splitlines()[0])
    assert record == {"id": "a", "image": "images/a.png", "type": "text", "text": "héllo\nworld"}
    back = read_manifest(tmp_path)
    assert [(i.id, i.image_path, i.type, i.text) for i in back] == [(i.id, i.image_path.resolve(), i.type, i.text) for i in items]
    assert back[0].image_path.is_absolute() and back[0].load_image().mode == "RGB"
    assert not back[1].image_path.exists()  # a missing image is for the evaluator to score, not an error here


GOOD = json.dumps({"id": "x", "image": "images/x.png", "type": "text", "text": "t"})


@pytest.mark.parametrize("bad, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"id": "y", "image": "y.png", "type": "text"}), "missing key"),
    (json.dumps({"id": "y", "image": "y.png", "type": "figure", "text": ""}), "unknown type"),
    (json.dumps({"id": "y", "image": 3, "type": "text", "text": ""}), "must be strings"),
    (json.dumps(["id", "image"]), "expected a JSON object"),
    (GOOD, "duplicate id"),
])
def test_malformed_line_names_its_line_number(tmp_path, bad, message):
    _write_lines(tmp_path, [GOOD, "", bad])
    with pytest.raises(ValueError, match=rf"line 3: .*{message}"):
        read_manifest(tmp_path)


def test_write_synthetic_set(tmp_path):
    items = write_synthetic_set(tmp_path, seed=5, n=3, stage=CURRICULUM[-1])
    back = read_manifest(tmp_path)
    assert [i.id for i in back] == [i.id for i in items] == ["synthetic-5", "synthetic-6", "synthetic-7"]
    assert all(i.image_path == tmp_path.resolve() / "images" / f"{i.id}.png" and i.image_path.exists() for i in back)


def test_heldout_set_reads_and_is_complete():
    items = read_manifest(HELDOUT)
    assert Counter(item.type for item in items) == {"text": 200, "table": 60, "formula": 60}
    assert all(int(item.id.rsplit("-", 1)[1]) >= 10**9 for item in items), "held-out seeds start at 10**9"
    for item in items:
        assert item.image_path.is_file(), item.id
        assert set(item.text) <= VOCABULARY, item.id
    with Image.open(items[-1].image_path) as image:
        assert image.width <= MAX_WIDTH and image.height <= MAX_HEIGHT
    size = sum(p.stat().st_size for p in HELDOUT.rglob("*") if p.is_file())
    assert size < 8.5e6
