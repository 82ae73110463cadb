"""`gravityocr bench decode`: how much faster self-speculative decoding is than AR decoding,
on the same weights and the same crops, by batch size and content type.

Both modes run through the same `Engine`; speed is the decoder's (tokens committed / time
in the decoder's passes, the prefill's included: where the prefill verifies a reading's
first tokens it commits many; the vision tower is excluded, it is the same work in both
modes). `exact` says whether every spec output equals its AR
output. Hugging Face `generate()` greedy and prompt-lookup decoding at batch 1 on a few
items are outside reference points ("peers"). Prints figures; never judges them.

The decoding flags are every command's (model/decode/settings.py); each column is those
settings with what it does not measure turned off: "spec" speculative rounds at every
batch size, "capped" speculative rounds under --speculative-max-batch, AR rounds above
(unset here it is 0, every batch size, so there is no such column).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from gravityocr.model.decode.flags import add_model_argument, add_threads_argument
from gravityocr.model.decode.draft_rules import DraftRules
from gravityocr.model.decode.settings import DecodeSettings, add_decode_arguments, decode_settings_from_args
from gravityocr.model.engine import Engine, EngineConfig, Request, RequestResult
from gravityocr.model.network.processor import EncodedPrompt

TASK_OF_TYPE = {"text": "text", "table": "table", "formula": "formula", "page": "text"}
SYNTHETIC_SIZES = [(112, 56), (224, 56), (84, 84), (168, 112), (280, 56), (140, 140)]  # (width, height)
PEER_ITEMS = 3
PROMPT_LOOKUP_TOKENS = 10


@dataclass
class BenchItem:
    id: str
    type: str
    prompt: EncodedPrompt


@dataclass
class ModeRun:
    results: list[RequestResult]
    tokens_per_second: float  # in the decoder's passes (EngineStats.decoder_seconds)


# --- inputs ----------------------------------------------------------------------------

def load_model(path: str | None, dtype: torch.dtype):
    """(model, processor, what was loaded): the given path, else the shipped default, else
    the TINY random model (seeded), which is said in the output since its drafts are noise."""
    from gravityocr.model.network import loading

    default_dir = loading.DEFAULT_MODEL_DIR
    if path is None and (Path(default_dir) / "config.json").exists():
        path = str(default_dir)
    if path is not None:
        recognizer = loading.load_recognizer(path, dtype=dtype)
        return recognizer.model, recognizer.processor, f"{path}"
    from gravityocr.model.network.configs import TINY, build_config
    from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration
    from gravityocr.model.network.processor import OcrProcessor, make_image_processor
    from gravityocr.model.network.tokenizer import build_char_tokenizer

    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    model = GravityOcrForConditionalGeneration(build_config(tokenizer, TINY)).to(dtype).eval()
    note = "no trained model found: TINY random model (seed 0); its drafts are rarely accepted"
    return model, OcrProcessor(tokenizer, make_image_processor()), note


def _read_manifest(directory: str) -> list[tuple[str, Path, str]]:
    """(id, image path, type) per item of `directory`/manifest.jsonl."""
    try:
        from gravityocr.model.evaluation.manifest import read_manifest
    except ImportError:
        root = Path(directory)
        records = [json.loads(line) for line in (root / "manifest.jsonl").read_text().splitlines() if line.strip()]
        return [(r["id"], root / r["image"], r["type"]) for r in records]
    return [(item.id, item.image_path, item.type) for item in read_manifest(directory)]


def load_items(processor, data: str | None, limit: int | None) -> tuple[list[BenchItem], str]:
    if data is None:
        rng = np.random.RandomState(0)
        types = ["text", "table", "formula"]
        items = []
        for i, (width, height) in enumerate(SYNTHETIC_SIZES[:limit]):
            image = Image.fromarray(rng.randint(0, 256, size=(height, width, 3), dtype=np.uint8))
            items.append(BenchItem(f"noise-{i}", types[i % 3], processor.encode(image, types[i % 3])))
        return items, f"{len(items)} synthetic random-noise images of different sizes (no --data given)"
    items = []
    for item_id, image_path, item_type in _read_manifest(data)[:limit]:
        with Image.open(image_path) as image:
            prompt = processor.encode(image.convert("RGB"), TASK_OF_TYPE[item_type])
        items.append(BenchItem(item_id, item_type, prompt))
    return items, f"{len(items)} items from {data}"


# --- runs --------------------------------------------------------------------------------

def run_mode(model, eos_ids, items: list[BenchItem], count: int, max_new_tokens: int, decode: DecodeSettings,
             batch_size: int, threads: int, engine_variant: dict | None = None, clock: str = "wall",
             draft_rules=None) -> ModeRun:
    """`count` requests cycling through `items`, decoded by a fresh engine with `decode`,
    `batch_size` slots and `threads` torch threads (`engine_variant`: EngineConfig fields set
    otherwise than the product does, e.g. fixed blocks or mask drafts instead of reading drafts). clock "cpu" divides by the process's CPU time instead of wall time: on
    a machine shared with other jobs it is the steadier figure, but it counts every thread's
    time, so it cannot show what extra threads buy."""
    requests = [Request(f"{i}", items[i % len(items)].prompt, max_new_tokens) for i in range(count)]
    longest = max(r.prompt.length for r in requests) + max_new_tokens
    config = EngineConfig.from_decode(decode, device=str(model.device), dtype=model.dtype, threads=threads,
                                      max_batch_size=batch_size, max_seq_len=longest)
    config = dataclasses.replace(config, **(engine_variant or {}))
    engine = Engine(model, config, eos_ids, draft_rules=draft_rules)
    results = engine.generate(requests)
    stats = engine.stats()
    seconds = stats.decoder_seconds(clock)
    return ModeRun(results, stats.committed_tokens / seconds if seconds else 0.0)


def engine_variant(args) -> dict:
    """The EngineConfig fields the flags set otherwise than the product does."""
    return {**({"adaptive_block": False} if args.fixed_block else {}),
            **({"reading_drafts": False} if args.no_reading_drafts else {})}


def columns(decode: DecodeSettings) -> dict[str, DecodeSettings]:
    """The settings of each column: AR, then `decode` with what a column does not measure
    turned off (see the module docstring)."""
    spec = dataclasses.replace(decode, mode="spec")
    modes = {"ar": dataclasses.replace(spec, mode="ar"), "spec": dataclasses.replace(spec, speculative_max_batch=0)}
    if decode.speculative_max_batch != 0:
        modes["capped"] = spec
    return modes


def compare(model, eos_ids, items, batch_size, type_name, args, draft_rules=None) -> dict:
    """AR and spec on the same requests. Runs alternate (AR, spec, AR, spec, ...) and the
    fastest of each counts: other processes only ever slow a run down, and alternating
    exposes both modes to the same spells of contention."""
    count = max(batch_size, len(items))
    modes = columns(args.decode)
    best: dict[str, ModeRun] = {}
    for _ in range(args.repeats):
        for name, decode in modes.items():
            run = run_mode(model, eos_ids, items, count, args.max_new_tokens, decode, batch_size, args.threads,
                           engine_variant(args), args.clock, draft_rules)
            if name not in best or run.tokens_per_second > best[name].tokens_per_second:
                best[name] = run
    ar = best["ar"]
    row = {"batch_size": batch_size, "type": type_name, "requests": count,
           "ar_tok_s": round(ar.tokens_per_second, 1)}
    for name in modes.keys() - {"ar"}:
        run = best[name]
        prefix = "" if name == "spec" else f"{name}_"
        committed = sum(r.stats.committed_tokens for r in run.results)
        passes = sum(r.stats.forward_passes for r in run.results)
        rounds = [a for r in run.results for a in r.stats.accepted_per_round]
        row[f"{name}_tok_s"] = round(run.tokens_per_second, 1)
        row[f"{prefix}speedup"] = round(run.tokens_per_second / ar.tokens_per_second, 3) if ar.tokens_per_second else None
        row[f"{prefix}tpf"] = round(committed / passes, 3) if passes else 0.0
        row[f"{prefix}accepted_per_round"] = round(statistics.fmean(rounds), 2) if rounds else 0.0
    row["exact"] = all(s.token_ids == a.token_ids for name in modes.keys() - {"ar"}
                       for s, a in zip(best[name].results, ar.results))
    return row


def _hf_generate(model, prompt: EncodedPrompt, max_new_tokens: int, eos_id: int, pad_id: int, **options) -> list[int]:
    output = model.generate(
        input_ids=prompt.input_ids.to(model.device),
        pixel_values=prompt.pixel_values.to(model.device, model.dtype),
        image_grid_thw=prompt.image_grid_thw.to(model.device),
        mm_token_type_ids=(prompt.input_ids == model.config.image_token_id).int().to(model.device),
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos_id, pad_token_id=pad_id, **options,
    )
    return output[0, prompt.length:].tolist()


def peers(model, processor, items: list[BenchItem], args) -> dict:
    """Batch 1 on the first few items: HF greedy, HF prompt lookup, and this engine's two
    modes on the same items. HF's decode time is its full time less a 1-token run's."""
    chosen = items[:PEER_ITEMS]
    eos_id, pad_id = processor.tokenizer.eos_token_id, processor.tokenizer.pad_token_id
    modes = columns(args.decode)
    engine_ar = run_mode(model, processor.eos_token_ids, chosen, len(chosen), args.max_new_tokens, modes["ar"], 1,
                         args.threads, clock=args.clock)
    engine_spec = run_mode(model, processor.eos_token_ids, chosen, len(chosen), args.max_new_tokens, modes["spec"], 1,
                           args.threads, engine_variant(args), clock=args.clock)
    now = time.process_time if args.clock == "cpu" else time.perf_counter
    out = {"items": len(chosen),
           "engine_ar_tok_s": round(engine_ar.tokens_per_second, 1),
           "engine_spec_tok_s": round(engine_spec.tokens_per_second, 1)}
    for name, options in [("hf_generate_greedy", {}),
                          (f"hf_prompt_lookup_{PROMPT_LOOKUP_TOKENS}", {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS})]:
        tokens, seconds, same = 0, 0.0, True
        try:
            for item, reference in zip(chosen, engine_ar.results):
                start = now()
                _hf_generate(model, item.prompt, 1, eos_id, pad_id)
                prefill = now() - start
                start = now()
                output = _hf_generate(model, item.prompt, args.max_new_tokens, eos_id, pad_id, **options)
                seconds += max(0.0, now() - start - prefill)
                tokens += len(output) - 1
                same &= output == reference.token_ids
            out[name] = {"tok_s": round(tokens / seconds, 1) if seconds else None, "same_as_engine_ar": same}
        except Exception as error:  # a peer that cannot run here is reported, not fatal
            out[name] = {"error": f"{type(error).__name__}: {error}"}
    return out


# --- the command ---------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gravityocr bench decode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_argument(parser, default_text="the shipped model, else a random TINY one")
    parser.add_argument("--data", help="directory with manifest.jsonl, e.g. data/real (default: synthetic noise images, for random models)")
    parser.add_argument("--batch-sizes", default="1,8,32,64", help="comma-separated (default 1,8,32,64)")
    parser.add_argument("--fixed-block", action="store_true",
                        help="every round drafts the full block (the engine's default: each request's block "
                             "follows its recent acceptance)")
    parser.add_argument("--no-reading-drafts", action="store_true",
                        help="mask drafts in every round, also for a model with a reading prefix (the engine's "
                             "default there: verify the reading's next tokens, model/decode/reading_drafts.py)")
    parser.add_argument("--no-structured-drafts", action="store_true",
                        help="leave LaTeX command names in formulas to the drafter "
                             "(model/decode/draft_rules.py keeps a formula's drafts to them)")
    add_threads_argument(parser, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--limit", type=int, help="only the first N items")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the fastest counts")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="time decode rounds by wall clock (default) or by process CPU time")
    parser.add_argument("--dtype", choices=["float32", "float64", "bfloat16"], default="float32")
    parser.add_argument("--no-peers", action="store_true", help="skip the Hugging Face generate() reference points")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    # Unset, the speculative cap is 0 here (every batch size): a cap adds the "capped" column.
    add_decode_arguments(parser, DecodeSettings(speculative_max_batch=0))
    return parser


def _print_table(report: dict) -> None:
    print(f"model: {report['model']}")
    print(f"data: {report['data']}")
    print("settings: " + ", ".join(f"{k}={v}" for k, v in report["settings"].items()))
    extra = [name for name in ("capped",) if any(f"{name}_tok_s" in row for row in report["rows"])]
    header = f"{'batch':>5} {'type':<8} {'req':>4} {'AR tok/s':>9} {'spec tok/s':>10} {'speed-up':>8} {'TPF':>6} {'acc/round':>9}"
    for name in extra:
        header += f" {name + ' tok/s':>14} {'speed-up':>8} {'TPF':>6} {'acc/round':>9}"
    print(header + "  exact")
    for row in report["rows"]:
        line = (f"{row['batch_size']:>5} {row['type']:<8} {row['requests']:>4} {row['ar_tok_s']:>9.1f} "
                f"{row['spec_tok_s']:>10.1f} {row['speedup'] or 0:>8.2f} {row['tpf']:>6.2f} "
                f"{row['accepted_per_round']:>9.2f}")
        for name in extra:
            line += (f" {row[name + '_tok_s']:>14.1f} {row[name + '_speedup'] or 0:>8.2f} {row[name + '_tpf']:>6.2f} "
                     f"{row[name + '_accepted_per_round']:>9.2f}")
        print(f"{line}  {row['exact']}")
    if report["peers"]:
        print("peers (batch 1): " + json.dumps(report["peers"]))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.decode = decode_settings_from_args(args)
    except ValueError as error:
        parser.error(str(error))
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    torch.set_num_threads(args.threads)
    model, processor, model_note = load_model(args.model, getattr(torch, args.dtype))
    items, data_note = load_items(processor, args.data, args.limit)
    if not items:
        print("no items to decode", file=sys.stderr)
        return 1
    eos_ids = processor.eos_token_ids
    run_mode(model, eos_ids, items[:1], 1, 4, columns(args.decode)["spec"], 1, args.threads)  # warm-up: first-call costs

    groups = {"all": items}
    for item in items:
        groups.setdefault(item.type, []).append(item)
    draft_rules = None if args.no_structured_drafts else DraftRules.of(processor.tokenizer)
    rows = [compare(model, eos_ids, group, batch_size, type_name, args, draft_rules)
            for batch_size in batch_sizes for type_name, group in groups.items()
            if not (type_name != "all" and len(groups) == 2)]  # one type only: "all" says it
    report = {
        "model": model_note,
        "data": data_note,
        "settings": {"threads": args.threads, **args.decode.to_dict(), "fixed_block": args.fixed_block,
                     "reading_drafts": not args.no_reading_drafts,
                     "structured_drafts": draft_rules is not None,
                     "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "repeats": args.repeats,
                     "clock": args.clock},
        "rows": rows,
        "peers": {} if args.no_peers else peers(model, processor, items, args),
    }
    if args.json:
        print(json.dumps(report))
    else:
        _print_table(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
