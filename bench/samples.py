"""The page pipeline on the bundled samples that carry their true text: per-sample page score and seconds.

Every document under samples/ (PDF, PNG, JPEG, TIFF, WebP) with a true text `data/samples/<stem>.md` is read
whole by the pipeline `gravityocr ocr` runs (layout, line crops, recogniser, assembly). Its
text (pages in order, each page's regions in reading order with running headers and footers,
figures left out: what `gravityocr eval` compares for a page) is scored against the .md with
the evaluator's page score, `model.metrics.score("page", ...)`: 1 - normalised edit distance
with whitespace folded. Seconds: one document at a time, model loading left out.

    gravityocr bench samples [--model PATH] [--only NAME ...] [--json [FILE]]

Prints figures, never passes or fails on them. data/samples/README.md says where each sample
comes from; docs/samples.md how to read the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gravityocr.model.decode.flags import add_model_argument, add_threads_argument
from gravityocr.model.decode.settings import add_decode_arguments, decode_settings_from_args
from gravityocr.model.evaluation.scores import score
from gravityocr.pipelines.page_ocr import PageOcrConfig

SAMPLES = Path(__file__).resolve().parents[1] / "samples"  # documents only: the main job's input
TRUE_TEXTS = Path(__file__).resolve().parents[1] / "data" / "samples"  # <document stem>.md, README.md
DOCUMENT_SUFFIXES = (".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class Sample:
    name: str  # the document's file name
    path: Path
    truth: str


@dataclass
class Outcome:
    sample: str
    pages: int
    score: float
    seconds: float
    error: str | None = None


def find_samples(directory: Path = SAMPLES, only: list[str] | None = None,
                 true_texts: Path = TRUE_TEXTS) -> list[Sample]:
    """The documents of `directory` with a true text `<stem>.md` in `true_texts`, by file
    name (the texts live apart so that `directory` holds documents only: `gravityocr batch
    samples/ out/` reads every file there); `only`: these names (file name or stem) alone,
    ValueError for a name that is not one."""
    truth = Path(true_texts)
    found = [Sample(path.name, path, (truth / f"{path.stem}.md").read_text(encoding="utf-8"))
             for path in sorted(Path(directory).iterdir())
             if path.is_file() and path.suffix.lower() in DOCUMENT_SUFFIXES and (truth / f"{path.stem}.md").is_file()]
    if not only:
        return found
    wanted = [name for names in only for name in names.split(",") if name]
    known = {key: sample for sample in found for key in (sample.name, sample.path.stem)}
    missing = [name for name in wanted if name not in known]
    if missing:
        raise ValueError(f"no sample with a true text named {', '.join(missing)} in {directory} "
                         f"(have: {', '.join(sample.name for sample in found) or 'none'})")
    chosen = {known[name].name: known[name] for name in wanted}
    return [sample for sample in found if sample.name in chosen]


def document_text(result) -> str:
    """The text a page score compares, for a whole document: its pages' texts in order."""
    return "\n\n".join(page.text(include_furniture=True) for page in result.pages)


def read_sample(pipeline, sample: Sample) -> Outcome:
    started = time.perf_counter()
    (result,) = list(pipeline.run([sample.path]))
    seconds = time.perf_counter() - started
    if not result.ok:
        return Outcome(sample.name, 0, 0.0, seconds, f"{result.error.reason}: {result.error.message}")
    errors = [f"page {page.page_number}: {page.error}" for page in result.pages if page.error]
    return Outcome(sample.name, len(result.pages), score("page", document_text(result), sample.truth), seconds,
                   "; ".join(errors) or None)


def summary(outcomes: list[Outcome]) -> dict:
    return {"samples": len(outcomes), "pages": sum(o.pages for o in outcomes),
            "mean_score": round(statistics.fmean(o.score for o in outcomes), 4) if outcomes else None,
            "seconds": round(sum(o.seconds for o in outcomes), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gravityocr bench samples", description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--samples", metavar="DIR", type=Path, default=SAMPLES,
                        help="folder of documents (default: the repository's samples/); true texts: data/samples/<stem>.md")
    parser.add_argument("--only", metavar="NAME", action="append", default=None,
                        help="only this sample (file name or stem; repeat or separate with commas)")
    parser.add_argument("--json", metavar="FILE", nargs="?", const="-", default=None,
                        help="print the figures as one JSON object instead of the table (or, with FILE, "
                             "also write them there)")
    parser.add_argument("--dpi", type=float, default=PageOcrConfig.dpi, help="PDF render resolution")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    add_threads_argument(parser)
    add_decode_arguments(parser, with_mode=True)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        decode = decode_settings_from_args(args)
    except ValueError as error:
        parser.error(str(error))

    from gravityocr.pipelines.ocr_cli import default_model_path, has_weights

    try:
        samples = find_samples(args.samples, args.only)
    except (OSError, ValueError) as error:
        print(f"gravityocr bench samples: {error}", file=sys.stderr)
        return 2
    if not samples:
        print(f"gravityocr bench samples: no document with a true text (data/samples/<stem>.md) in {args.samples}", file=sys.stderr)
        return 2
    model_path = Path(args.model) if args.model else default_model_path()
    if not has_weights(model_path):
        print(f"gravityocr bench samples: no model found at {model_path} (expected config.json and *.safetensors)",
              file=sys.stderr)
        return 2

    import torch
    import transformers

    from gravityocr.model.engine.threads import engine_threads, reserve_for_engine
    from gravityocr.pipelines.page_ocr import PageOcr
    from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig

    transformers.utils.logging.disable_progress_bar()
    reserve_for_engine(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    started = time.perf_counter()
    recognizer = CropRecognizer.load(model_path, RecognizerConfig(decode=decode), device=device)
    pipeline = PageOcr(recognizer, PageOcrConfig.from_args(args))
    load_seconds = time.perf_counter() - started

    quiet = args.json == "-"
    if not quiet:
        print(f"{len(samples)} samples; model {model_path} on {device} ({load_seconds:.1f} s to load), "
              f"mode {decode.mode}, engine threads {engine_threads()}")
        print(f"{'sample':28s} {'pages':>5s} {'score':>7s} {'seconds':>8s}")
    outcomes = []
    for sample in samples:
        outcome = read_sample(pipeline, sample)
        outcomes.append(outcome)
        if not quiet:
            print(f"{outcome.sample:28s} {outcome.pages:5d} {outcome.score:7.4f} {outcome.seconds:8.1f}"
                  + (f"   ({outcome.error})" if outcome.error else ""), flush=True)
    total = summary(outcomes)
    figures = {"model": str(model_path), "device": device, "decode": decode.to_dict(),
               "samples": [{**asdict(o), "score": round(o.score, 4), "seconds": round(o.seconds, 2)} for o in outcomes],
               "summary": total}
    if quiet:
        print(json.dumps(figures))
    else:
        print(f"{'mean':28s} {total['pages']:5d} {total['mean_score']:7.4f} {total['seconds']:8.1f}")
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
