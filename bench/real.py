"""Ours against rapidocr and Tesseract on a real-document evaluation set (`data/real`), in one run.

Lines: each system reads every text-line crop of the set; score = 1 - normalised edit
distance (whitespace folded), the evaluator's text score; speed = seconds per line one at a
time (batch 1) and lines per second in batches of 32. Pages: each system reads every page
image whole, the systems taking turns a few pages at a time (ours: the page pipeline
`gravityocr ocr` runs, with the engine's split of its time: the vision tower's and the
decoder's seconds per page); score = the evaluator's page score. rapidocr and Tesseract read text only, so tables and formulas are not compared here
(`gravityocr eval data/real` scores ours on them). With `--photo-like`, every system reads
the pages and the lines as a phone photographs them (corpus/augment.py `photo_like`, seeded by
each item's id: the same images for every system and every run).

    gravityocr bench real [--data data/real] [--model DIR] [--json FILE] [--skip-peers] [--skip-lines] [--photo-like]

Prints figures, never passes or fails on them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gravityocr.model.decode.flags import add_model_argument, add_threads_argument
from gravityocr.model.evaluation.manifest import ManifestItem, read_manifest
from gravityocr.model.evaluation.scores import score

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data" / "real"


@dataclass
class Figures:
    system: str
    kind: str  # lines | pages
    scores: list[float] = field(default_factory=list)
    seconds_per_item: float = 0.0  # one item at a time
    items_per_second_batched: float | None = None  # batches of 32 (lines)
    extra: dict = field(default_factory=dict)

    def row(self) -> dict:
        row = {"system": self.system, "kind": self.kind, "n": len(self.scores),
               "score": round(statistics.fmean(self.scores), 4) if self.scores else None,
               "seconds_per_item": round(self.seconds_per_item, 4)}
        if self.items_per_second_batched is not None:
            row["items_per_second_batch32"] = round(self.items_per_second_batched, 2)
        return {**row, **self.extra}


def _timed(function):
    started = time.perf_counter()
    result = function()
    return result, time.perf_counter() - started


# --- ours -------------------------------------------------------------------------------

def ours_lines(recognizer, items: list[ManifestItem]) -> Figures:
    from gravityocr.model.evaluation.report import evaluate

    figures = Figures("gravityocr", "lines")
    _, seconds = _timed(lambda: [evaluate(recognizer, [item], batch_size=1) for item in items[:64]])
    figures.seconds_per_item = seconds / min(64, len(items))
    report, seconds = _timed(lambda: evaluate(recognizer, items, batch_size=32))
    figures.items_per_second_batched = len(items) / seconds
    figures.scores = [outcome.score for outcome in report.items]
    # the exactness check decodes the lines again (AR, and speculating at every batch size): not timed
    figures.extra = {"tpf": round(report.tpf, 3), "exact": evaluate(recognizer, items, batch_size=32,
                                                                       check_exact=True).exact}
    return figures


def pages_side_by_side(recognizer, items: list[ManifestItem], peers: bool = True,
                       photo: bool = False) -> list[Figures]:
    """Whole pages, ours and the peers taking turns a batch of pages at a time (our page
    pipeline's `batch_pages`), each warmed up on the first page first: a slower phase of a
    shared machine slows every system alike, so the ratio of their seconds a page holds
    within a run. Ours: the page pipeline as `gravityocr ocr` runs it (product defaults),
    with the engine's own split of its time (the vision tower's and the decoder's seconds a
    page); the peers: `gravityocr bench pages`' readers (rapidocr, Tesseract) where installed.
    `photo`: every system reads the pages as `photo_like` degrades them, seeded by their ids."""
    from gravityocr.bench.pages import BenchPage, RapidOcrPages, TesseractPages
    from gravityocr.corpus.augment import photo_like

    image = lambda item: photo_like(item.load_image(), random.Random(item.id))[0] if photo else item.load_image()
    pages = [BenchPage(item.id, image(item), item.text) for item in items]
    with contextlib.ExitStack() as stack:
        peer_readers = []
        for make in (RapidOcrPages, TesseractPages) if peers else ():
            try:
                peer_readers.append(stack.enter_context(make(pages)))
            except (ImportError, FileNotFoundError) as error:
                print(f"{make.name}: skipped: {error}")
        return _pages_in_turn(recognizer, items, pages, peer_readers)


def _pages_in_turn(recognizer, items: list[ManifestItem], pages: list, peer_readers: list) -> list[Figures]:
    """`pages_side_by_side` once the peers' readers are made (their preparation untimed)."""
    from gravityocr.pipelines.assembly import sum_stats
    from gravityocr.pipelines.documents import Page
    from gravityocr.pipelines.page_ocr import PageOcr, PageOcrConfig
    from gravityocr.pipelines.recognizer import CropRecognizer

    engine = {}

    def record(stats, finished, lanes) -> None:
        engine["stats"] = stats

    page_config = PageOcrConfig()
    ours = Figures("gravityocr", "pages")
    peer_figures = [Figures(reader.name, "pages") for reader in peer_readers]
    texts: dict[str, list[str]] = {figures.system: [] for figures in [ours, *peer_figures]}
    seconds = {figures.system: 0.0 for figures in [ours, *peer_figures]}
    region_stats = []
    with CropRecognizer(recognizer, on_step=record) as crops:
        pipeline = PageOcr(crops, page_config)

        def read_ours(batch: list) -> list:
            return pipeline.read_pages([Page(page.name, 1, page.image, page.image.width, page.image.height)
                                        for page in batch])

        read_ours(pages[:1])  # warm-up, as the peers' readers are
        warm_up = engine.get("stats")
        warm_up = (warm_up.encode_seconds, warm_up.decoder_seconds()) if warm_up else (0.0, 0.0)
        for start in range(0, len(pages), page_config.batch_pages):
            batch = range(start, min(start + page_config.batch_pages, len(pages)))
            started = time.perf_counter()
            results = read_ours([pages[i] for i in batch])
            seconds[ours.system] += time.perf_counter() - started
            for result in results:
                texts[ours.system].append(result.text(include_furniture=True))
                region_stats += [region.stats for region in result.regions]
            for reader, figures in zip(peer_readers, peer_figures):
                started = time.perf_counter()
                texts[figures.system] += [reader.read(i) for i in batch]
                seconds[figures.system] += time.perf_counter() - started
    for figures in [ours, *peer_figures]:
        figures.seconds_per_item = seconds[figures.system] / len(items)
        figures.scores = [score("page", text, item.text) for text, item in zip(texts[figures.system], items)]
    decoded = sum_stats(region_stats)
    ours.extra = {"tpf": round(decoded["tokens_per_forward"], 3) if decoded else None}
    stats = engine.get("stats")  # none when the engine read no crop
    if stats is not None:
        ours.extra["tower_seconds_per_item"] = round((stats.encode_seconds - warm_up[0]) / len(items), 4)
        ours.extra["decoder_seconds_per_item"] = round((stats.decoder_seconds() - warm_up[1]) / len(items), 4)
    return [ours, *peer_figures]


# --- rapidocr ---------------------------------------------------------------------------------

def _bgr(item: ManifestItem) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(item.load_image())[:, :, ::-1])


def rapidocr_lines(items: list[ManifestItem]) -> Figures:
    from rapidocr import RapidOCR
    from rapidocr.ch_ppocr_rec.typings import TextRecInput

    engine = RapidOCR(params={"Global.log_level": "warning", "Rec.rec_batch_num": 32})
    images = [_bgr(item) for item in items]
    engine(images[0], use_det=False, use_cls=False, use_rec=True)  # loads the model
    figures = Figures("rapidocr (PP-OCRv6 rec)", "lines")
    _, seconds = _timed(lambda: [engine(image, use_det=False, use_cls=False, use_rec=True) for image in images[:64]])
    figures.seconds_per_item = seconds / min(64, len(images))
    texts: list[str] = []

    def batched():
        for start in range(0, len(images), 32):
            texts.extend(engine.text_rec(TextRecInput(img=images[start:start + 32])).txts)

    _, seconds = _timed(batched)
    figures.items_per_second_batched = len(images) / seconds
    figures.scores = [score("text", text, item.text) for text, item in zip(texts, items)]
    return figures


# --- Tesseract ---------------------------------------------------------------------------------

def _tesseract(paths: list[Path]) -> list[str]:
    """One process over a list file of lines (page segmentation 7: one text line); Tesseract
    separates the images' texts with form feeds."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as listing:
        listing.write("".join(f"{path}\n" for path in paths))
    done = subprocess.run(["tesseract", listing.name, "stdout", "-l", "eng", "--psm", "7"],
                          capture_output=True, text=True, check=True)
    Path(listing.name).unlink()
    texts = done.stdout.split("\f")
    return [text.strip() for text in texts[:len(paths)]]


def tesseract_lines(items: list[ManifestItem]) -> Figures:
    version = subprocess.run(["tesseract", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    figures = Figures(version.strip() or "tesseract", "lines")
    paths = [item.image_path for item in items]
    _, seconds = _timed(lambda: [_tesseract([path]) for path in paths[:64]])
    figures.seconds_per_item = seconds / min(64, len(paths))
    texts, seconds = _timed(lambda: _tesseract(paths))
    figures.items_per_second_batched = len(paths) / seconds
    figures.scores = [score("text", text, item.text) for text, item in zip(texts, items)]
    return figures


def photographed(items: list[ManifestItem], directory: Path) -> list[ManifestItem]:
    """The items with their images as `photo_like` degrades them (seeded by their ids), written
    to `directory`, so every system reads the same files."""
    from gravityocr.corpus.augment import photo_like

    out = []
    for item in items:
        path = directory / f"{item.id}.png"
        photo_like(item.load_image(), random.Random(item.id))[0].save(path)
        out.append(dataclasses.replace(item, image_path=path))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gravityocr bench real", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="evaluation set (default: data/real)")
    add_model_argument(parser)
    add_threads_argument(parser)
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--skip-pages", action="store_true")
    parser.add_argument("--skip-lines", action="store_true")
    parser.add_argument("--photo-like", action="store_true",
                        help="read the pages and lines as photographed (corpus.augment.photo_like, seeded by item id)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from gravityocr.model.engine.threads import engine_threads, reserve_for_engine
    from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer

    reserve_for_engine(args.threads)
    items = read_manifest(args.data)
    lines = [] if args.skip_lines else [item for item in items if item.type == "text"]
    pages = [] if args.skip_pages else [item for item in items if item.type == "page"]
    recognizer = load_recognizer(args.model or DEFAULT_MODEL_DIR)
    print(f"{args.data}: {len(lines)} lines, {len(pages)} pages; engine threads {engine_threads()}"
          f"{'; photo-like' if args.photo_like else ''}")
    with tempfile.TemporaryDirectory() as scratch:
        if args.photo_like:
            lines = photographed(lines, Path(scratch))
        results = [ours_lines(recognizer, lines)] if lines else []
        if pages:
            results += pages_side_by_side(recognizer, pages, peers=not args.skip_peers, photo=args.photo_like)
        if lines and not args.skip_peers:
            results.append(rapidocr_lines(lines))
            if shutil.which("tesseract"):
                results.append(tesseract_lines(lines))
            else:
                print("tesseract: not installed (apt-get install -y tesseract-ocr)")
    rows = [{**figures.row(), "photo_like": args.photo_like} for figures in results]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
