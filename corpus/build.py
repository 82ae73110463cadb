"""`gravityocr data build`: training shards, and `gravityocr data eval-set`: a real evaluation set.

A training build is cut into units, one per (type, package, group of files), each with its
own seed derived from the build's seed, so the same seed gives the same items whatever
order or how often the build ran. A finished unit is one Parquet shard, written to a
temporary name and renamed, so a build killed at any point resumes by skipping the shards
that exist and never holds half a unit or an item twice. `manifest.jsonl` (one line per
item: id, shard, type, package, file, page, licence, renderer, augmentation) is rewritten
from the shards at the end of every run.

An evaluation set draws from the evaluation side of `sources.py`, round robin over its
packages for variety, and is written in the manifest format `gravityocr eval` reads, each
item with its source.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from gravityocr.pipelines.documents import png_bytes

from gravityocr.corpus.augment import scan_like
from gravityocr.corpus import lexicon
from gravityocr.corpus.debian import DEFAULT_CACHE, UnpackedPackage, check_not_reserved, fetch_package
from gravityocr.corpus.items import CorpusItem
from gravityocr.corpus.sources import DEVELOPMENT, EVALUATION, TRAINING, check_sources

TYPES = ("text", "page", "table", "formula")

# The files each type reads, and how many of them make one unit of a build.
_SUFFIXES = {"text": (".pdf",), "page": (".pdf",), "table": (".html", ".htm", ".tex"), "formula": (".tex",)}
_FILES_PER_UNIT = {"text": 4, "page": 4, "table": 40, "formula": 20}

SHARD_SCHEMA = pa.schema([
    ("id", pa.string()), ("type", pa.string()), ("text", pa.string()), ("image", pa.binary()),
    ("package", pa.string()), ("file", pa.string()), ("page", pa.int32()), ("locator", pa.string()),
    ("licence", pa.string()), ("renderer", pa.string()), ("augment", pa.string()),
])


def _table_items(package: UnpackedPackage, seed: int, limit: int | None) -> Iterator[CorpusItem]:
    from gravityocr.corpus.tables import html_table_items, latex_table_items

    yield from html_table_items(package, seed, limit)
    yield from latex_table_items(package, seed + 1, limit)


def _formula_items(package: UnpackedPackage, seed: int, limit: int | None,
                   exclude: frozenset[str] = frozenset()) -> Iterator[CorpusItem]:
    """Display and inline math in every math font style this machine typesets, none whose target
    is in `exclude` (what the evaluation and development packages hold: standard formulas recur
    across manuals)."""
    from gravityocr.corpus.formulas import formula_items

    yield from formula_items(package, seed, limit, config=training_formula_config(), exclude=exclude)


def _eval_formulas(package: UnpackedPackage, seed: int, limit: int | None) -> Iterator[CorpusItem]:
    """Display formulas in Computer Modern (pdflatex) and mathtext: how `data/real` was made."""
    from gravityocr.corpus.formulas import formula_items

    yield from formula_items(package, seed, limit)


def _text_items(package: UnpackedPackage, seed: int, limit: int | None) -> Iterator[CorpusItem]:
    """Single lines, then multi-line paragraphs (a tenth as many at most)."""
    from gravityocr.corpus.pdf_text import line_items, paragraph_items

    yield from line_items(package, seed, limit)
    yield from paragraph_items(package, seed, None if limit is None else max(1, limit // 10))


def _page_items(package: UnpackedPackage, seed: int, limit: int | None) -> Iterator[CorpusItem]:
    from gravityocr.corpus.pdf_text import page_items

    yield from page_items(package, seed, limit)


ITEM_SOURCES: dict[str, Callable[[UnpackedPackage, int, int | None], Iterator[CorpusItem]]] = {
    "text": _text_items, "page": _page_items, "table": _table_items, "formula": _formula_items,
}


@dataclass(frozen=True)
class Unit:
    type: str
    package: str
    index: int
    files: tuple[str, ...]

    def shard(self, build_seed: int) -> str:
        """Where the unit's items go; one build directory may hold several seeds' renderings."""
        return f"{self.type}/{self.package}/seed{build_seed}-{self.index:05d}.parquet"

    def seed(self, build_seed: int) -> int:
        key = f"{build_seed}:{self.type}:{self.package}:{self.index}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")


@dataclass(frozen=True)
class BuildConfig:
    output: Path
    cache: Path = DEFAULT_CACHE
    seed: int = 0
    types: tuple[str, ...] = TYPES
    packages: tuple[str, ...] | None = None  # None: every training package of each type
    items_per_unit: int | None = 400
    augment_share: float = 0.2  # share of items given scan-like degradation
    negatives: int = 0  # crops with nothing to read (corpus/negatives.py) per type built


def plan_units(package: UnpackedPackage, type: str) -> list[Unit]:
    files = [package.relative(p) for p in package.files(*_SUFFIXES[type])]
    size = _FILES_PER_UNIT[type]
    return [Unit(type, package.name, index, tuple(files[start:start + size]))
            for index, start in enumerate(range(0, len(files), size))]


def unit_items(unit: Unit, package: UnpackedPackage, build_seed: int, limit: int | None,
               augment_share: float, sources=ITEM_SOURCES) -> Iterator[CorpusItem]:
    """The unit's items, a share of them degraded like scans, deterministic for the seed."""
    seed = unit.seed(build_seed)
    rng = random.Random(seed ^ 0x5EED)
    for item in sources[unit.type](package.restricted_to(unit.files), seed, limit):
        if rng.random() < augment_share:
            item.image, item.augment = scan_like(item.image, rng)
        yield item


def _write_shard(path: Path, items: list[CorpusItem]) -> None:
    rows = defaultdict(list)
    for item in items:
        for key, value in (("id", item.id), ("type", item.type), ("text", item.text), ("image", png_bytes(item.image)),
                           ("package", item.source.package), ("file", item.source.file), ("page", item.source.page),
                           ("locator", item.source.locator), ("licence", item.source.licence),
                           ("renderer", item.source.renderer), ("augment", item.augment)):
            rows[key].append(value)
    table = pa.table({name: rows[name] for name in SHARD_SCHEMA.names}, schema=SHARD_SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    pq.write_table(table, partial)
    partial.rename(path)


def write_manifest(output: Path) -> int:
    """Rewrite manifest.jsonl from every finished shard; returns the number of items."""
    lines = []
    for shard in sorted(output.glob("shards/**/*.parquet")):
        columns = ["id", "type", "package", "file", "page", "licence", "renderer", "augment"]
        for row in pq.read_table(shard, columns=columns).to_pylist():
            lines.append(json.dumps({**row, "shard": shard.relative_to(output).as_posix()}, ensure_ascii=False))
    (output / "manifest.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def build(config: BuildConfig, log=print, training: dict[str, list[str]] = TRAINING,
          fetch: Callable[[str, Path], UnpackedPackage] = fetch_package,
          held_out: Sequence[str] | None = None) -> Counter:
    """Run (or resume) a training build; returns items written in this run, by type.
    `training` and `fetch` name the packages and get them (sources.TRAINING and apt by default);
    no formula target of a `held_out` package (the evaluation and development formula packages
    by default) is written."""
    check_sources()
    written: Counter = Counter()
    seconds: Counter = Counter()
    sources = ITEM_SOURCES
    if "formula" in config.types:
        if held_out is None:
            held_out = EVALUATION["formula"] + DEVELOPMENT.get("formula", [])
        exclude = formula_targets([fetch(check_not_reserved(name), config.cache) for name in held_out])
        sources = {**ITEM_SOURCES, "formula": functools.partial(_formula_items, exclude=exclude)}
    for type in config.types:
        if config.negatives and type != "page":
            from gravityocr.corpus.negatives import PACKAGE, negative_items

            shard = config.output / "shards" / type / PACKAGE / f"seed{config.seed}.parquet"
            if not shard.exists():
                _write_shard(shard, list(negative_items(type, config.seed, config.negatives)))
                written[type] += config.negatives
                log(f"{shard.relative_to(config.output / 'shards').as_posix()}: {config.negatives} items")
        packages = config.packages or tuple(training.get(type, ()))
        for name in packages:
            check_not_reserved(name)
            if name not in training.get(type, ()):
                raise ValueError(f"{name!r} is not a training source of {type} items (corpus/sources.py)")
            package = fetch(name, config.cache)
            for unit in plan_units(package, type):
                shard = config.output / "shards" / unit.shard(config.seed)
                if shard.exists():
                    continue
                started = time.perf_counter()
                items = list(unit_items(unit, package, config.seed, config.items_per_unit, config.augment_share,
                                        sources))
                _write_shard(shard, items)
                seconds[type] += time.perf_counter() - started
                written[type] += len(items)
                log(f"{unit.shard(config.seed)}: {len(items)} items")
    total = write_manifest(config.output)
    for type in config.types:
        rate = 60 * written[type] / seconds[type] if seconds[type] else 0.0
        log(f"{type}: {written[type]} items this run, {rate:.0f} items/minute")
    log(f"manifest: {total} items in {config.output / 'manifest.jsonl'}")
    return written


# --- the evaluation set ------------------------------------------------------------------

EVAL_COUNTS = {"text": 320, "page": 14, "table": 45, "formula": 66}
DEV_COUNTS = {"text": 300, "formula": 120}
DEV_PER_UNIT = {"text": 60, "formula": 24}  # the development packages hold few formulas


def build_eval_set(output: Path, cache: Path = DEFAULT_CACHE, seed: int = 0,
                   counts: dict[str, int] = EVAL_COUNTS, augment_share: float = 0.15, log=print,
                   evaluation: dict[str, list[str]] = EVALUATION,
                   fetch: Callable[[str, Path], UnpackedPackage] = fetch_package,
                   inline_formulas: bool = False, per_unit: dict[str, int] | None = None) -> int:
    """Write an evaluation manifest directory from the evaluation-side packages; with
    `inline_formulas`, formulas are drawn from inline math too (the development packages hold
    few display formulas). `per_unit`: at most this many items of a type from one unit
    (`_EVAL_PER_UNIT` by default)."""
    per_unit = per_unit or _EVAL_PER_UNIT
    from gravityocr.model.evaluation.manifest import ManifestItem, save_crop_image
    from gravityocr.model.evaluation.manifest import write_manifest as write_eval_manifest

    check_sources()
    output = Path(output).resolve()
    rng = random.Random(seed)
    chosen: list[ManifestItem] = []
    for type, wanted in counts.items():
        # Standard formulas recur across manuals: one the training side holds is not held out.
        known = training_formula_targets(cache) if type == "formula" else set()
        streams = []
        for name in evaluation[type]:
            package = fetch(check_not_reserved(name), cache)
            units = plan_units(package, type)
            random.Random(f"{seed}:{type}:{name}").shuffle(units)
            streams.append(_unit_streams(units, package, seed, inline_formulas))
        picked = _round_robin(streams, wanted, per_unit=per_unit[type], exclude=known)
        for item in picked:
            if rng.random() < augment_share:
                item.image, item.augment = scan_like(item.image, rng)
            path = output / "images" / f"{item.id}.png"
            save_crop_image(item.image, path)
            source = item.source.describe() + (f" [{item.augment}]" if item.augment else "")
            chosen.append(ManifestItem(item.id, path, item.type, item.text, source))
        log(f"{type}: {len(picked)} items")
    write_eval_manifest(output, chosen)
    return len(chosen)


def _unit_streams(units: list[Unit], package: UnpackedPackage, seed: int,
                  inline_formulas: bool = False) -> Iterator[Iterator[CorpusItem]]:
    sources = {**_EVAL_SOURCES, "formula": _eval_inline_formulas} if inline_formulas else _EVAL_SOURCES
    for unit in units:
        yield unit_items(unit, package, seed, None, 0.0, sources)


def _eval_lines(package: UnpackedPackage, seed: int, limit: int | None) -> Iterator[CorpusItem]:
    from gravityocr.corpus.pdf_text import TextConfig, line_items

    yield from line_items(package, seed, limit, TextConfig(lines_per_page=3, pages_per_file=400))


def _eval_pages(package: UnpackedPackage, seed: int, limit: int | None) -> Iterator[CorpusItem]:
    from gravityocr.corpus.pdf_text import TextConfig, page_items

    yield from page_items(package, seed, limit, config=TextConfig(pages_per_file=400))


def _eval_inline_formulas(package: UnpackedPackage, seed: int, limit: int | None) -> Iterator[CorpusItem]:
    """Display and inline formulas in Computer Modern (pdflatex) and mathtext."""
    from gravityocr.corpus.formula_extraction import FormulaConfig
    from gravityocr.corpus.formulas import formula_items

    yield from formula_items(package, seed, limit, config=FormulaConfig(inline=True))


# Evaluation items spread over many pages: a few lines a page, every page of a file a candidate.
_EVAL_SOURCES = {**ITEM_SOURCES, "text": _eval_lines, "page": _eval_pages, "formula": _eval_formulas}
# At most this many items from one unit of an evaluation package, so no file dominates.
_EVAL_PER_UNIT = {"text": 60, "page": 3, "table": 8, "formula": 6}


@functools.cache
def training_formula_config():
    from gravityocr.corpus.formula_extraction import FormulaConfig
    from gravityocr.corpus.formula_rendering import available_math_styles

    return FormulaConfig(inline=True, math_styles=available_math_styles())


def training_formula_targets(cache: Path) -> set[str]:
    """Every target a training build can hold: what an evaluation set leaves out."""
    return set(formula_targets([fetch_package(name, cache) for name in TRAINING["formula"]]))


def formula_targets(packages: list[UnpackedPackage]) -> frozenset[str]:
    """Every formula target of the packages, display and inline."""
    from gravityocr.corpus.formula_extraction import FormulaConfig
    from gravityocr.corpus.formulas import package_formulas

    return frozenset(formula.target for package in packages
                     for _, formula in package_formulas(package, FormulaConfig(inline=True)))


def _round_robin(streams: list[Iterator[Iterator[CorpusItem]]], wanted: int, per_unit: int,
                 exclude: set[str] = frozenset()) -> list[CorpusItem]:
    picked: list[CorpusItem] = []
    seen: set[str] = set(exclude)
    live = list(streams)
    while live and len(picked) < wanted:
        for stream in list(live):
            unit = next(stream, None)
            if unit is None:
                live.remove(stream)
                continue
            taken = 0
            for item in unit:
                if item.text in seen:
                    continue
                seen.add(item.text)
                picked.append(item)
                taken += 1
                if taken >= per_unit or len(picked) >= wanted:
                    break
            if len(picked) >= wanted:
                break
    return picked


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    train = actions.add_parser("build", help="training shards from Debian documentation (resumable)")
    train.add_argument("output", type=Path, help="build directory (shards/ and manifest.jsonl)")
    train.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where packages are downloaded and unpacked")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--types", default=",".join(TYPES), help="comma-separated: text,page,table,formula")
    train.add_argument("--packages", help="comma-separated training packages (default: all of each type)")
    train.add_argument("--items-per-unit", type=int, default=400, help="at most this many items per shard")
    train.add_argument("--augment-share", type=float, default=0.2,
                       help="share of items degraded like scans (default: 0.2)")
    train.add_argument("--negatives", type=int, default=0,
                       help="crops with nothing to read, empty target, per type built (default: 0)")
    evaluation = actions.add_parser("eval-set", help="a real-document evaluation set from the evaluation packages")
    evaluation.add_argument("output", type=Path, help="directory for manifest.jsonl and images/")
    evaluation.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    evaluation.add_argument("--seed", type=int, default=0)
    evaluation.add_argument("--development", action="store_true",
                            help="the development set (data/dev) from the development packages instead")
    lexicon.add_arguments(actions.add_parser("lexicon", help="the training documents' words, for the glyph fixes"))


def run(args) -> int:
    if args.action == "lexicon":
        return lexicon.run(args)
    if args.action == "eval-set":
        if args.development:
            build_eval_set(args.output, args.cache, args.seed, counts=DEV_COUNTS, evaluation=DEVELOPMENT,
                           inline_formulas=True, per_unit=DEV_PER_UNIT)
        else:
            build_eval_set(args.output, args.cache, args.seed)
        return 0
    types = tuple(t.strip() for t in args.types.split(",") if t.strip())
    unknown = [t for t in types if t not in TYPES]
    if unknown:
        print(f"gravityocr data build: unknown type(s) {unknown}; expected some of {list(TYPES)}", file=sys.stderr)
        return 2
    if not 0.0 <= args.augment_share <= 1.0:
        print("gravityocr data build: --augment-share must be within [0, 1]", file=sys.stderr)
        return 2
    packages = tuple(p.strip() for p in args.packages.split(",")) if args.packages else None
    try:
        build(BuildConfig(args.output, args.cache, args.seed, types, packages, args.items_per_unit,
                          args.augment_share, args.negatives))
    except ValueError as error:  # a reserved or unknown package, named in the message
        print(f"gravityocr data build: {error}", file=sys.stderr)
        return 2
    return 0
