"""`gravityocr eval DIR`: score a recogniser on an evaluation set, crops and whole pages.

Text lines and formulas go straight to the recogniser (model/evaluation/report.py). Pages
go through the page pipeline a user runs (`gravityocr ocr`: layout, line crops, recogniser,
assembly) and are scored on the page text, so a page figure is the product's figure; a
table's image goes through the same pipeline as one table region (its grid, its cells'
lines, its HTML: pipelines/tables.py), as a table on a page is read. All decode with the
decoding flags every command takes (by default the product's settings: speculation at
every batch size; `--speculative-max-batch N` caps it), and the JSON's `decode` says which settings were measured. With `--check-exact`
all are decoded again in plain AR mode and `exact` says whether every output is identical.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import asdict

from gravityocr.model.decode.settings import DecodeSettings, add_decode_arguments, decode_settings_from_args
from gravityocr.model.decode.flags import add_model_argument, add_threads_argument
from gravityocr.model.engine.threads import reserve_for_engine
from gravityocr.model.evaluation.report import ItemOutcome, decode_report, evaluate, summarize
from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, Recognizer, load_recognizer
from gravityocr.model.evaluation.manifest import ManifestItem, read_manifest
from gravityocr.model.evaluation.scores import score

from gravityocr.pipelines.documents import Page
from gravityocr.pipelines.page_ocr import PageOcr, PageOcrConfig, add_page_arguments
from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig
from gravityocr.pipelines.regions import Region


# Item types read through the page pipeline rather than as one crop.
PIPELINE_TYPES = ("page", "table")


def read_pages(recognizer: Recognizer, items: list[ManifestItem], config: RecognizerConfig,
               page_config: PageOcrConfig, as_region: str | None = None) -> dict[str, tuple[str, int, int, dict]]:
    """Page text (a table's HTML), committed tokens, forward passes and accepted drafts by
    source (`DecodeStats.drafted_tokens`) by item id (errors: empty text). `as_region`: each
    item's image is one region of this type (a table's image), not laid out."""
    read: dict[str, tuple[str, int, int, dict]] = {}
    with CropRecognizer(recognizer, config) as crops:
        pipeline = PageOcr(crops, page_config)
        for start in range(0, len(items), page_config.batch_pages):
            batch, pages = items[start:start + page_config.batch_pages], []
            for item in batch:
                image = item.load_image()
                pages.append(Page(item.id, 1, image, image.width, image.height))
            regions = [[Region((0, 0, page.width, page.height), as_region, 0)] for page in pages] if as_region else None
            for item, result in zip(batch, pipeline.read_pages(pages, regions=regions)):
                stats = [r.stats for r in result.regions if r.stats]
                drafted: dict[str, int] = {}
                for region in stats:
                    for source, count in region["drafted_tokens"].items():
                        drafted[source] = drafted.get(source, 0) + count
                read[item.id] = (result.text(include_furniture=True), sum(s["committed_tokens"] for s in stats),
                                 sum(s["forward_passes"] for s in stats), drafted)
    return read


def evaluate_set(recognizer: Recognizer, items: list[ManifestItem], batch_size: int = 32,
                 decode: DecodeSettings | None = None, check_exact: bool = False,
                 page_config: PageOcrConfig | None = None):
    """One report over crops and pages (model.evaluation.EvalReport), both decoded with
    `decode` (None: the product's defaults)."""
    decode = decode or DecodeSettings()
    crops = [item for item in items if item.type not in PIPELINE_TYPES]
    report = evaluate(recognizer, crops, batch_size, decode, check_exact)
    outcomes, exact = list(report.items), report.exact
    page_config = page_config or PageOcrConfig()
    config = RecognizerConfig(decode=decode, max_batch_size=batch_size)
    ar_config = dataclasses.replace(config, decode=dataclasses.replace(decode, mode="ar"))
    for kind in PIPELINE_TYPES:
        mine = [item for item in items if item.type == kind]
        if not mine:
            continue
        as_region = None if kind == "page" else kind
        read = read_pages(recognizer, mine, config, page_config, as_region)
        for item in mine:
            text, tokens, passes, drafted = read[item.id]
            outcomes.append(ItemOutcome(item.id, kind, score(kind, text, item.text), text, tokens, passes,
                                        drafted_tokens=drafted))
        if check_exact:
            ar = read_pages(recognizer, mine, ar_config, page_config, as_region)
            exact = (exact if exact is not None else True) and all(ar[i][0] == read[i][0] for i in read)
    order = {item.id: n for n, item in enumerate(items)}
    return summarize(sorted(outcomes, key=lambda o: order[o.id]), exact, decode_report(recognizer, decode))


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="evaluation directory with manifest.jsonl")
    add_model_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences decoded together (default: 32)")
    parser.add_argument("--limit", type=int, help="only the first N items")
    parser.add_argument("--types", help="only these types, comma-separated (text,table,formula,page)")
    parser.add_argument("--check-exact", action="store_true", help="also decode with plain AR and compare outputs")
    add_threads_argument(parser)
    parser.add_argument("--items", metavar="FILE", help="write per-item outcomes as JSON lines here")
    add_page_arguments(parser, dpi=False)  # page items are images: no PDF to render
    # The product's decoding by default; `--speculative-max-batch 0` measures speculation at
    # every batch size.
    add_decode_arguments(parser)


def run(args) -> int:
    try:
        decode = decode_settings_from_args(args)
    except ValueError as error:
        raise SystemExit(f"gravityocr eval: {error}") from None
    reserve_for_engine(args.threads)
    items = read_manifest(args.directory)
    if args.types:
        wanted = {t.strip() for t in args.types.split(",")}
        items = [item for item in items if item.type in wanted]
    if args.limit:
        items = items[:args.limit]
    recognizer = load_recognizer(args.model or DEFAULT_MODEL_DIR)
    report = evaluate_set(recognizer, items, args.batch_size, decode, args.check_exact,
                          PageOcrConfig.from_args(args))
    if args.items:
        with open(args.items, "w") as stream:
            for outcome in report.items:
                stream.write(json.dumps(asdict(outcome)) + "\n")
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(f"items: {report.n}   overall: {report.overall:.4f}   tpf: {report.tpf:.2f}")
        print("  decode: " + ", ".join(f"{k}={v}" for k, v in report.decode.items()))
        for kind, value in report.scores.items():
            print(f"  {kind:8s} score {value:.4f}   tpf {report.tpf_by_type[kind]:.2f}   "
                  f"accepted/round {report.accepted_per_round[kind]:.2f}")
        if report.exact is not None:
            print(f"  spec == AR on every item: {report.exact}")
        for entry in report.unreadable:
            print(f"  unreadable {entry['id']}: {entry['error']}", file=sys.stderr)
    return 0
