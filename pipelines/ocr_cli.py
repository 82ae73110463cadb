"""`gravityocr ocr FILE...`: local files in, markdown or JSON out, in-process, no cluster.
The quickest way for a person to try the product.

Exit status: 0 when every document was read, 1 when some were not (the others are still
written; one error line per failed document on stderr, and with `--format json` a record
per failed document too, its `error` naming the reason), 2 when nothing could start
(no model, bad arguments).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from typing import TYPE_CHECKING

from gravityocr.model.decode.settings import add_decode_arguments, decode_settings_from_args

from gravityocr.model.decode.flags import add_model_argument
from gravityocr.model.network.tasks import TASK_TOKEN_BUDGETS
from gravityocr.pipelines.page_ocr import PageOcrConfig, add_page_arguments  # torch loads only when a command runs

if TYPE_CHECKING:
    from gravityocr.pipelines.assembly import PageResult
    from gravityocr.pipelines.page_ocr import DocumentResult


def default_model_path() -> Path:
    from gravityocr.model.network.loading import DEFAULT_MODEL_DIR

    return Path(DEFAULT_MODEL_DIR)


def has_weights(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="PDF, PNG, JPEG, TIFF or WebP files")
    parser.add_argument("--format", choices=("markdown", "json"), default="markdown",
                        help="output format (default: markdown)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="write one NAME.EXT.md per document here, named as `gravityocr batch` names it "
                             "(report.pdf.md, its figure crops in report.pdf_figures/, linked from it), or "
                             "NAME.EXT.json; default: print to stdout (JSON: one document per line; markdown "
                             "without figures, whose boxes are in the JSON)")
    add_model_argument(parser)
    add_page_arguments(parser)
    parser.add_argument("--batch-pages", type=int, default=PageOcrConfig.batch_pages,
                        help=f"pages per recogniser batch (default: {PageOcrConfig.batch_pages})")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="cap on tokens written per crop (default: per task, "
                             + ", ".join(f"{n} {task}" for task, n in TASK_TOKEN_BUDGETS.items()) + ")")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress lines on stderr (by default a line per page read: N/M pages)")
    add_decode_arguments(parser, with_mode=True)


def _output_names(document_ids: list[str]) -> dict[str, str]:
    """A distinct output name per document id: its file name with its extension, as the batch
    job names a document's markdown (`markdown/KEY.md`), so report.pdf is written to
    report.pdf.md and its figures to report.pdf_figures/ by either command; a/x.pdf and
    b/x.pdf -> x.pdf, x-2.pdf."""
    names, used = {}, set()
    for document_id in document_ids:
        path = Path(document_id)
        stem, suffix = (path.stem, path.suffix) if path.name else ("document", "")
        name, n = stem + suffix, 1
        while name in used:
            n += 1
            name = f"{stem}-{n}{suffix}"
        used.add(name)
        names[document_id] = name
    return names


class _Progress:
    """Pages as they are read, a line each on stderr, whatever the input (one page too) and
    whether or not stderr is a terminal: `gravityocr ocr: N/M pages (DOCUMENT page P, S s)`, M
    counting the pages of the documents opened so far and S the seconds since the first
    document opened; at the end, how many pages were read in how long."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.total = 0
        self.done = 0
        self.started: float | None = None

    def opened(self, document: DocumentResult) -> None:
        self.total += document.page_count
        if self.started is None:
            self.started = time.perf_counter()

    def page(self, page: PageResult) -> None:
        self.done += 1
        if self.enabled:
            self.message(f"gravityocr ocr: {self.done}/{self.total} pages ({page.document_id} page "
                         f"{page.page_number}, {self._elapsed():.1f} s)")

    def message(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.done:
            self.message(f"gravityocr ocr: {self.done} page{'s' if self.done > 1 else ''} read in "
                         f"{self._elapsed():.1f} s")

    def _elapsed(self) -> float:
        return time.perf_counter() - self.started if self.started is not None else 0.0


def _write(result: DocumentResult, args, name: str) -> None:
    """One document out: its JSON (`DocumentResult.to_json`, as serve answers it) or its
    markdown (`DocumentResult.to_markdown`, as the batch job and serve write it). On stdout
    the markdown leaves figures out (there is no folder to write them to); with --out its
    figures are written to NAME.EXT_figures/ first and linked from NAME.EXT.md (`_output_names`)."""
    from gravityocr.pipelines.assembly import figure_crops, figure_png, figure_prefix_for, figures_folder

    if args.out is None:
        if args.format == "json":
            sys.stdout.write(json.dumps(result.to_json(), ensure_ascii=False) + "\n")
        else:
            if len(args.files) > 1:
                sys.stdout.write(f"<!-- document: {result.document_id} -->\n\n")
            sys.stdout.write(result.to_markdown(figure_prefix=None))
        sys.stdout.flush()
        return
    out = Path(args.out)
    if args.format == "json":
        (out / f"{name}.json").write_text(json.dumps(result.to_json(), ensure_ascii=False, indent=2) + "\n",
                                          encoding="utf-8")
        return
    figures = figure_crops(result.pages)
    if figures:
        folder = out / figures_folder(name)
        folder.mkdir(parents=True, exist_ok=True)
        for file_name, image in figures:
            (folder / file_name).write_bytes(figure_png(image))
    (out / f"{name}.md").write_text(result.to_markdown(figure_prefix=figure_prefix_for(name)), encoding="utf-8")


def run(args) -> int:
    model_path = Path(args.model) if args.model else default_model_path()
    if not has_weights(model_path):
        if args.model:
            print(f"gravityocr ocr: no model found at {model_path} (expected config.json and *.safetensors)",
                  file=sys.stderr)
        else:
            print("gravityocr ocr: no default model found; pass --model PATH", file=sys.stderr)
        return 2
    if args.out is not None:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    import torch
    import transformers

    from gravityocr.model.engine.threads import reserve_for_engine
    from gravityocr.pipelines.page_ocr import PageOcr
    from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig

    transformers.utils.logging.disable_progress_bar()  # our own lines are the ones that count pages
    # The engine decodes on one torch thread, as the batch job's engine actors and serve's
    # replicas do (each given one CPU, the page work beside it on other cores), while this
    # thread renders, lays out and encodes pages: the process's whole count for the engine
    # would outnumber the cores with this thread's work, and every op would wait
    # (model/engine/threads.py).
    reserve_for_engine(1)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        config = RecognizerConfig(decode=decode_settings_from_args(args))
        if args.max_new_tokens is not None:
            config = config.capped(args.max_new_tokens)
        recognizer = CropRecognizer.load(model_path, config, device=device)
        pipeline = PageOcr(recognizer, PageOcrConfig.from_args(args, batch_pages=args.batch_pages))
    except (OSError, ValueError, ImportError) as error:
        print(f"gravityocr ocr: cannot start: {error}", file=sys.stderr)
        return 2
    names = _output_names(list(args.files))
    progress = _Progress(enabled=not args.no_progress)
    failed = 0
    try:
        for result in pipeline.run(args.files, on_open=progress.opened, on_page=progress.page):
            if not result.ok:
                failed += 1
                progress.message(f"gravityocr ocr: {result.document_id}: {result.error.reason}: "
                                 f"{result.error.message}")
                if args.format == "json":  # JSON keeps a record per input: this one names the error
                    _write(result, args, names[result.document_id])
                continue
            for page in result.pages:
                if page.error:
                    progress.message(f"gravityocr ocr: {result.document_id}: page {page.page_number}: {page.error}")
                for warning in page.warnings:  # in the JSON too
                    progress.message(f"gravityocr ocr: {result.document_id}: page {page.page_number}: "
                                     f"warning: {warning}")
            _write(result, args, names[result.document_id])
    finally:
        progress.close()
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m gravityocr.pipelines.ocr_cli`); the `gravityocr ocr`
    subcommand wires `add_arguments` and `run` the same way."""
    parser = argparse.ArgumentParser(prog="gravityocr ocr", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
