"""Whole pages: seconds per page and page score for our pipeline (AR and self-speculative
decoding of the same weights, on the same pages, in the same run) and for two peers run
on the same pages: rapidocr (PP-OCRv6, its bundled models) and Tesseract. Also the
layout backends on their own: seconds per page and how well they find the generated
pages' regions; and our pipeline through each door a user has (`ocr`, `batch`, serve:
bench/doors.py), seconds per page on the same pages.

Page score = the evaluator's (`model/evaluation/scores.py` `page_similarity`): 1 - normalized
edit distance between the page's text in reading order and the truth (tables count by their
cells' text, dot leaders left out, whitespace collapsed; figures left out; headers and footers kept, since every system reads them; formulas are
LaTeX in the truth, which plain-text peers cannot match). Truth: the generator's text for synthetic pages; the PDF's own text
layer for real, born-digital PDFs rendered with pdfium.

    python -m gravityocr.bench.pages [--model PATH | --random tiny] [--pages 6] [--pdf FILE ...]

Prints figures, never passes or fails on them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from gravityocr.model.decode.flags import add_model_argument
from gravityocr.pipelines.layout import LAYOUT_BACKENDS, layout_page, make_layout, make_line_splitter
from gravityocr.pipelines.page_ocr import PageOcrConfig, add_page_arguments
from gravityocr.corpus.synthetic_pages import sample_pages
from gravityocr.model.evaluation.scores import page_similarity, page_text

# Born-digital PDFs with a text layer that Debian installs with common packages.
DEFAULT_PDFS = (
    "/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf",
    "/usr/share/doc/libtasn1-doc/libtasn1.pdf",
)


@dataclass
class BenchPage:
    name: str
    image: Image.Image
    truth: str
    truth_types: list[str] | None = None  # synthetic pages only
    truth_boxes: list[tuple] | None = None


@dataclass
class SystemFigures:
    name: str
    seconds: float = 0.0
    scores: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    skipped: str | None = None

    def row(self, pages: int) -> dict:
        if self.skipped:
            return {"system": self.name, "skipped": self.skipped}
        mean = sum(self.scores) / max(1, len(self.scores))
        return {"system": self.name, "s_per_page": round(self.seconds / max(1, pages), 3),
                "page_score": round(mean, 4), **self.extra}


# --- pages --------------------------------------------------------------------------------

def synthetic_pages(count: int, seed: int) -> list[BenchPage]:
    out = []
    for i, page in enumerate(sample_pages(count, seed)):
        out.append(BenchPage(f"synthetic-{i + 1}", page.image, page.text(include_furniture=True), page.types,
                             [r.bbox for r in page.regions]))
    return out


def pdf_pages(paths: list[str], per_pdf: int, dpi: float) -> list[BenchPage]:
    import pypdfium2 as pdfium

    out = []
    for path in paths:
        document = pdfium.PdfDocument(path)
        taken = 0
        for index in range(len(document)):
            if taken >= per_pdf:
                break
            page = document[index]
            truth = page.get_textpage().get_text_range()
            if len(page_text(truth)) < 200:  # a cover or a blank page says little
                continue
            image = page.render(scale=dpi / 72, fill_color=(255, 255, 255, 255)).to_pil().convert("RGB")
            out.append(BenchPage(f"{Path(path).name}#{index + 1}", image, truth))
            taken += 1
    return out


# --- our pipeline -------------------------------------------------------------------------

def build_recognizer(args):
    from gravityocr.pipelines.ocr_cli import default_model_path, has_weights
    from gravityocr.pipelines.recognizer import RecognizerConfig

    config = RecognizerConfig()
    if args.random:
        import torch

        from gravityocr.model.network.configs import SMALL, TINY, build_config
        from gravityocr.model.network.loading import Recognizer
        from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration
        from gravityocr.model.network.processor import OcrProcessor, make_image_processor
        from gravityocr.model.network.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
        torch.manual_seed(0)
        model = GravityOcrForConditionalGeneration(build_config(tokenizer, TINY if args.random == "tiny" else SMALL))
        pixels = 28 * 28 * (64 if args.random == "tiny" else 1024)
        recognizer = Recognizer(model.eval(), OcrProcessor(tokenizer, make_image_processor(max_pixels=pixels)))
        label = f"random {args.random} model"
    else:
        path = Path(args.model) if args.model else default_model_path()
        if not has_weights(path):
            raise SystemExit("no default model found; pass --model PATH or --random tiny")
        from gravityocr.model.network.loading import load_recognizer

        recognizer = load_recognizer(path)
        label = str(path)
    max_new = args.max_new_tokens or (16 if args.random else None)
    if max_new:
        config = config.capped(max_new)
    return recognizer, config, label


def run_ours(pages: list[BenchPage], recognizer, config, mode: str, args) -> SystemFigures:
    import dataclasses

    from gravityocr.pipelines.documents import Page
    from gravityocr.pipelines.page_ocr import PageOcr, PageOcrConfig
    from gravityocr.pipelines.recognizer import CropRecognizer

    crop_recognizer = CropRecognizer(recognizer, dataclasses.replace(config, decode=dataclasses.replace(config.decode, mode=mode)))
    pipeline = PageOcr(crop_recognizer, PageOcrConfig.from_args(args, batch_pages=args.batch_pages))
    figures = SystemFigures(f"gravityocr-{mode}")
    inputs = [Page(p.name, i + 1, p.image, p.image.width, p.image.height) for i, p in enumerate(pages)]
    start = time.perf_counter()
    results = []
    for i in range(0, len(inputs), args.batch_pages):
        results += pipeline.read_pages(inputs[i:i + args.batch_pages])
    figures.seconds = time.perf_counter() - start
    tokens = passes = 0
    for page, result in zip(pages, results):
        text = result.text(include_furniture=True)
        figures.texts.append(text)
        figures.scores.append(page_similarity(text, page.truth))
        for region in result.regions:
            if region.stats:
                tokens += region.stats["committed_tokens"]
                passes += region.stats["forward_passes"]
    figures.extra = {"tokens_per_forward": round(tokens / max(1, passes), 3), "decoder": crop_recognizer.config.decoder,
                     "layout_s_per_page": round(sum(r.seconds["layout"] for r in results) / max(1, len(results)), 3)}
    return figures


# --- peers --------------------------------------------------------------------------------

class PageReader:
    """A peer reading whole pages: made on the pages (untimed preparation and warm-up), then
    `read(i)` gives page i's text; a context manager that frees what it prepared."""

    name: str

    def read(self, index: int) -> str:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> "PageReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RapidOcrPages(PageReader):
    """rapidocr (its bundled PP-OCRv6 models) reading whole pages; sessions loaded and warmed
    up on the first page when made. ImportError without rapidocr."""

    name = "rapidocr (PP-OCRv6)"

    def __init__(self, pages: list[BenchPage]):
        import numpy as np
        from rapidocr import RapidOCR

        self._bgr = [np.ascontiguousarray(np.asarray(page.image)[:, :, ::-1]) for page in pages]
        self._engine = RapidOCR(params={"Global.log_level": "warning"})
        self._engine(self._bgr[0])  # warm-up: sessions and first-run allocations

    def read(self, index: int) -> str:
        return "\n".join(self._engine(self._bgr[index]).txts or ())


class TesseractPages(PageReader):
    """Tesseract (its `--psm 3` page segmentation, English) reading whole pages, one process a
    page, from PNGs written when made. FileNotFoundError without the binary."""

    name = "tesseract"

    def __init__(self, pages: list[BenchPage]):
        self._binary = shutil.which("tesseract")
        if self._binary is None:
            raise FileNotFoundError("tesseract is not installed (apt-get install -y tesseract-ocr)")
        version = subprocess.run([self._binary, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        self.name = version.strip() or "tesseract"
        self._directory = tempfile.TemporaryDirectory()
        self._paths = []
        for i, page in enumerate(pages):
            path = Path(self._directory.name) / f"{i}.png"
            page.image.save(path)
            self._paths.append(path)

    def read(self, index: int) -> str:
        return subprocess.run([self._binary, str(self._paths[index]), "stdout", "-l", "eng", "--psm", "3"],
                              capture_output=True, text=True).stdout

    def close(self) -> None:
        self._directory.cleanup()


def _read_every_page(figures: SystemFigures, reader: PageReader, pages: list[BenchPage]) -> SystemFigures:
    start = time.perf_counter()
    figures.texts = [reader.read(i) for i in range(len(pages))]
    figures.seconds = time.perf_counter() - start
    figures.scores = [page_similarity(text, page.truth) for text, page in zip(figures.texts, pages)]
    return figures


def run_rapidocr(pages: list[BenchPage]) -> SystemFigures:
    figures = SystemFigures(RapidOcrPages.name)
    try:
        reader = RapidOcrPages(pages)
    except ImportError:
        figures.skipped = "rapidocr is not installed (pip install -e .)"
        return figures
    with reader:
        return _read_every_page(figures, reader, pages)


def run_tesseract(pages: list[BenchPage]) -> SystemFigures:
    figures = SystemFigures(TesseractPages.name)
    try:
        reader = TesseractPages(pages)
    except FileNotFoundError as error:
        figures.skipped = str(error)
        return figures
    with reader:
        figures.name = reader.name
        return _read_every_page(figures, reader, pages)


# --- layout on its own ------------------------------------------------------------------------

def _iou(a, b) -> float:
    inter = max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0


def measure_layout(pages: list[BenchPage], name: str) -> dict:
    try:
        backend = make_layout(name)
    except ImportError as error:
        return {"layout": name, "skipped": str(error)}
    lines = make_line_splitter(PageOcrConfig.lines)
    layout_page(pages[0].image, backend, lines)  # warm-up
    seconds, truths, matched, same_type, exact = 0.0, 0, 0, 0, 0
    synthetic = [p for p in pages if p.truth_types]
    for page in pages:
        start = time.perf_counter()
        regions = layout_page(page.image, backend, lines)
        seconds += time.perf_counter() - start
        if not page.truth_types:
            continue
        exact += [r.type for r in regions] == page.truth_types
        for kind, box in zip(page.truth_types, page.truth_boxes):
            truths += 1
            best = max(regions, key=lambda r: _iou(r.bbox, box), default=None)
            if best is not None and _iou(best.bbox, box) >= 0.5:
                matched += 1
                same_type += best.type == kind
    return {"layout": name, "s_per_page": round(seconds / len(pages), 3),
            "region_recall_iou50": round(matched / max(1, truths), 3),
            "type_accuracy_of_matched": round(same_type / max(1, matched), 3),
            "pages_all_types_in_order": f"{exact}/{len(synthetic)}"}


# --- main -----------------------------------------------------------------------------------------

def parse_args(argv):
    parser = argparse.ArgumentParser(prog="gravityocr bench pages", description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--random", choices=("tiny", "small"), default=None,
                        help="use a random model of this size (proves the pipeline runs; scores ~0)")
    parser.add_argument("--pages", type=int, default=6, help="synthetic pages (default: 6)")
    parser.add_argument("--pdf", nargs="*", default=None, help="real PDFs (default: Debian docs when present)")
    parser.add_argument("--pdf-pages", type=int, default=2, help="pages taken from each PDF (default: 2)")
    add_page_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-pages", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="cap per crop (default: none; 16 with --random)")
    parser.add_argument("--skip-ours", action="store_true")
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--skip-doors", action="store_true",
                        help="leave out `ocr`, `batch` and serve read as commands (bench/doors.py)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    pdfs = args.pdf if args.pdf is not None else [p for p in DEFAULT_PDFS if Path(p).is_file()]
    pages = synthetic_pages(args.pages, args.seed) + pdf_pages(pdfs, args.pdf_pages, args.dpi)
    if not pages:
        print("no pages to measure", file=sys.stderr)
        return 2
    from gravityocr.model.engine.threads import reserve_for_engine

    threads = reserve_for_engine()
    print(f"pages: {len(pages)} ({args.pages} synthetic, {len(pages) - args.pages} from {len(pdfs)} PDFs at "
          f"{args.dpi:g} DPI); engine threads {threads}, cpus {len(os.sched_getaffinity(0))}")
    report: dict = {"pages": [p.name for p in pages], "layout": [], "systems": []}

    for name in LAYOUT_BACKENDS:
        row = measure_layout(pages, name)
        report["layout"].append(row)
        print("layout", json.dumps(row))

    systems: list[SystemFigures] = []
    if not args.skip_ours:
        recognizer, config, label = build_recognizer(args)
        print(f"ours: {label}, max_new_tokens {config.max_new_tokens}")
        systems += [run_ours(pages, recognizer, config, "ar", args), run_ours(pages, recognizer, config, "spec", args)]
        same = systems[0].texts == systems[1].texts
        systems[1].extra["same_text_as_ar"] = same
        systems[1].extra["speedup_vs_ar"] = round(systems[0].seconds / max(1e-9, systems[1].seconds), 3)
    if not args.skip_peers:
        systems += [run_rapidocr(pages), run_tesseract(pages)]
    for system in systems:
        row = system.row(len(pages))
        if not system.skipped:
            row["per_page"] = {page.name: round(score, 3) for page, score in zip(pages, system.scores)}
        report["systems"].append(row)
        if system.skipped:
            print(f"{system.name}: skipped: {system.skipped}")
        else:
            extra = {k: v for k, v in row.items() if k not in ("system", "s_per_page", "page_score", "per_page")}
            print(f"{system.name:32s} {row['s_per_page']:8.3f} s/page  score {row['page_score']:.4f}  {extra}")
            print("   per page:", row["per_page"])
    if not args.skip_doors:
        if args.random:
            report["doors"] = {"skipped": "the doors read a model directory (--model or the embedded one)"}
        else:
            from gravityocr.bench.doors import measure_doors
            from gravityocr.pipelines.ocr_cli import default_model_path

            report["doors"] = measure_doors([page.image for page in pages], args.model or str(default_model_path()))
            for row in report["doors"]["doors"]:
                print("door", json.dumps(row))
            print("doors: same text", report["doors"]["same_text"], " ocr/batch s per page",
                  report["doors"].get("ocr_vs_batch_s_per_page"))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
