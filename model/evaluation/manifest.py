"""The evaluation data contract: a directory holding `manifest.jsonl` and the images it names.

One JSON object per line: {"id", "image" (path relative to the directory), "type", "text"},
type one of text | table | formula | page, and optionally "source": where a real item came
from (package, file, page), so a set can be checked for sources it must not hold. Any evaluation set (the committed synthetic
held-out set, or an independent one) is read the same way. A missing image file is not an
error here: the evaluator scores that item 0 and lists it, so one lost file cannot hide
the rest of a run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from PIL import Image

from gravityocr.pipelines.documents import png_bytes

MANIFEST_NAME = "manifest.jsonl"
MANIFEST_TYPES = ("text", "table", "formula", "page")
_KEYS = ("id", "image", "type", "text")


@dataclass
class ManifestItem:
    id: str
    image_path: Path  # absolute
    type: str
    text: str  # the reference
    source: str | None = None  # where the item came from, for real-document sets

    def load_image(self) -> Image.Image:
        """The image as RGB (the set may store grayscale PNGs to stay small)."""
        with Image.open(self.image_path) as image:
            return image.convert("RGB")


def _manifest_file(directory: str | os.PathLike) -> Path:
    return Path(directory) / MANIFEST_NAME


def read_manifest(directory: str | os.PathLike) -> list[ManifestItem]:
    """All items of the set in `directory`; ValueError naming the line for anything malformed."""
    directory = Path(directory).resolve()
    path = _manifest_file(directory)
    items: list[ManifestItem] = []
    seen: set[str] = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        missing = [key for key in _KEYS if key not in record]
        if missing:
            raise ValueError(f"{where}: missing key(s) {missing}")
        wrong = [key for key in _KEYS if not isinstance(record[key], str)]
        if wrong:
            raise ValueError(f"{where}: key(s) {wrong} must be strings")
        if record["type"] not in MANIFEST_TYPES:
            raise ValueError(f"{where}: unknown type {record['type']!r}; expected one of {list(MANIFEST_TYPES)}")
        if record["id"] in seen:
            raise ValueError(f"{where}: duplicate id {record['id']!r}")
        if not isinstance(record.get("source", ""), str):
            raise ValueError(f"{where}: key 'source' must be a string")
        seen.add(record["id"])
        items.append(ManifestItem(record["id"], directory / record["image"], record["type"], record["text"],
                                  record.get("source")))
    return items


def write_manifest(directory: str | os.PathLike, items: Iterable[ManifestItem]) -> Path:
    """Write `manifest.jsonl` for items whose images lie inside `directory`."""
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for item in items:
        if item.type not in MANIFEST_TYPES:
            raise ValueError(f"item {item.id!r}: unknown type {item.type!r}")
        relative = Path(os.path.relpath(Path(item.image_path).resolve(), directory)).as_posix()
        record = {"id": item.id, "image": relative, "type": item.type, "text": item.text}
        if item.source is not None:
            record["source"] = item.source
        lines.append(json.dumps(record, ensure_ascii=False))
    path = _manifest_file(directory)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def save_crop_image(image: Image.Image, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png_bytes(image))
