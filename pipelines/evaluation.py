"""`gravityocr eval DIR`: score a recogniser on an evaluation set, crops and whole pages.

Crops (text lines, tables, formulas) go straight to the recogniser (model/evaluation.py).
Pages go through the page pipeline a user runs (`gravityocr ocr`: layout, line crops,
recogniser, assembly) and are scored on the page text, so a page figure is the product's
figure. With `--check-exact` both are decoded again in plain AR mode and `exact` says
whether every output is identical.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import asdict

import torch

from gravityocr.model.draft_ahead import DraftAhead
from gravityocr.model.evaluation import ItemOutcome, evaluate, summarize
from gravityocr.model.loading import DEFAULT_MODEL_DIR, Recognizer, load_recognizer
from gravityocr.model.manifest import ManifestItem, read_manifest
from gravityocr.model.metrics import score

from .documents import Page
from .layout import LAYOUT_BACKENDS, LINE_SPLITTERS
from .page_ocr import PageOcr, PageOcrConfig
from .recognizer import CropRecognizer, RecognizerConfig


def read_pages(recognizer: Recognizer, items: list[ManifestItem], config: RecognizerConfig,
               page_config: PageOcrConfig) -> dict[str, tuple[str, int, int]]:
    """Page text, committed tokens and forward passes by item id (errors: empty text)."""
    pipeline = PageOcr(CropRecognizer(recognizer, config), page_config)
    read: dict[str, tuple[str, int, int]] = {}
    for start in range(0, len(items), page_config.batch_pages):
        batch, pages = items[start:start + page_config.batch_pages], []
        for item in batch:
            image = item.load_image()
            pages.append(Page(item.id, 1, image, image.width, image.height))
        for item, result in zip(batch, pipeline.read_pages(pages)):
            tokens = sum(r.stats["committed_tokens"] for r in result.regions if r.stats)
            passes = sum(r.stats["forward_passes"] for r in result.regions if r.stats)
            read[item.id] = (result.text(include_furniture=True), tokens, passes)
    return read


def evaluate_set(recognizer: Recognizer, items: list[ManifestItem], batch_size: int = 32, block_size: int = 32,
                 check_exact: bool = False, draft_ahead: DraftAhead | None = None, structured_drafts: bool = True,
                 page_config: PageOcrConfig | None = None):
    """One report over crops and pages (model.evaluation.EvalReport)."""
    crops = [item for item in items if item.type != "page"]
    pages = [item for item in items if item.type == "page"]
    report = evaluate(recognizer, crops, batch_size, block_size, check_exact, draft_ahead, structured_drafts)
    outcomes, exact = list(report.items), report.exact
    if pages:
        page_config = page_config or PageOcrConfig()
        spec = RecognizerConfig(mode="spec", block_size=block_size, max_batch_size=batch_size,
                                draft_ahead=draft_ahead.block if draft_ahead else 0,
                                draft_branches=draft_ahead.branches if draft_ahead else 0,
                                speculative_max_batch=0)
        read = read_pages(recognizer, pages, spec, page_config)
        for item in pages:
            text, tokens, passes = read[item.id]
            outcomes.append(ItemOutcome(item.id, "page", score("page", text, item.text), text, tokens, passes))
        if check_exact:
            ar = read_pages(recognizer, pages, dataclasses.replace(spec, mode="ar", draft_ahead=0, draft_branches=0),
                            page_config)
            exact = (exact if exact is not None else True) and all(ar[i][0] == read[i][0] for i in read)
    order = {item.id: n for n, item in enumerate(items)}
    return summarize(sorted(outcomes, key=lambda o: order[o.id]), exact)


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="evaluation directory with manifest.jsonl")
    parser.add_argument("--model", default=str(DEFAULT_MODEL_DIR), help="model directory or hub name")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--draft-ahead", type=int, default=0, metavar="L",
                        help="draft-ahead rounds with blocks of L masks (one pass per round); default: classic rounds")
    parser.add_argument("--draft-branches", type=int, default=0, metavar="N",
                        help="with --draft-ahead: also verify second-choice branches at the first N doubtful drafts")
    parser.add_argument("--limit", type=int, help="only the first N items")
    parser.add_argument("--types", help="only these types, comma-separated (text,table,formula,page)")
    parser.add_argument("--check-exact", action="store_true", help="also decode with plain AR and compare outputs")
    parser.add_argument("--threads", type=int, help="torch threads (default: all the process may use)")
    parser.add_argument("--items", metavar="FILE", help="write per-item outcomes as JSON lines here")
    parser.add_argument("--layout", choices=LAYOUT_BACKENDS, default=PageOcrConfig.layout,
                        help="layout backend for page items (as `gravityocr ocr --layout`)")
    parser.add_argument("--lines", choices=LINE_SPLITTERS, default=PageOcrConfig.lines,
                        help="line splitter for page items (as `gravityocr ocr --lines`)")
    parser.add_argument("--no-structured-drafts", action="store_true",
                        help="leave table structure and LaTeX command names to the drafter (to measure what "
                             "keeping drafts to them buys)")


def run(args) -> int:
    if args.draft_branches and not args.draft_ahead:
        raise SystemExit("gravityocr eval: --draft-branches needs --draft-ahead")
    if args.threads:
        torch.set_num_threads(args.threads)
    items = read_manifest(args.directory)
    if args.types:
        wanted = {t.strip() for t in args.types.split(",")}
        items = [item for item in items if item.type in wanted]
    if args.limit:
        items = items[:args.limit]
    recognizer = load_recognizer(args.model)
    report = evaluate_set(recognizer, items, args.batch_size, args.block_size, args.check_exact,
                          DraftAhead(args.draft_ahead, branches=args.draft_branches) if args.draft_ahead else None,
                          not args.no_structured_drafts, PageOcrConfig(layout=args.layout, lines=args.lines))
    if args.items:
        with open(args.items, "w") as stream:
            for outcome in report.items:
                stream.write(json.dumps(asdict(outcome)) + "\n")
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(f"items: {report.n}   overall: {report.overall:.4f}   tpf: {report.tpf:.2f}")
        for kind, value in report.scores.items():
            print(f"  {kind:8s} score {value:.4f}   tpf {report.tpf_by_type[kind]:.2f}   "
                  f"accepted/round {report.accepted_per_round[kind]:.2f}")
        if report.exact is not None:
            print(f"  spec == AR on every item: {report.exact}")
        for entry in report.unreadable:
            print(f"  unreadable {entry['id']}: {entry['error']}", file=sys.stderr)
    return 0
