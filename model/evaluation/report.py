"""Score a recogniser on the crops of an evaluation set (text lines, tables, formulas).

Every item is decoded by the batched engine with the given decoding settings (by default
the product's: self-speculative at every batch size); with `check_exact` the same
items are decoded again in plain AR mode (and, where a `speculative_max_batch` cap made the
measured run take AR rounds, with speculation at every batch size), and `exact` says whether every output is
identical. An item whose image cannot be read scores 0 and is listed. Whole
pages are read by the page pipeline (`gravityocr eval`, model/evaluation/eval_command.py), which
builds on this module; the model room does not import the pipelines.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from gravityocr.model.decode.crop_text import crop_text
from gravityocr.model.decode.draft_rules import DraftRules
from gravityocr.model.decode.reference import DRAFT_SOURCES
from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.model.engine import Engine, EngineConfig, Request
from gravityocr.model.engine.threads import engine_threads, on_engine_thread
from gravityocr.model.network.loading import Recognizer
from gravityocr.model.evaluation.manifest import ManifestItem
from gravityocr.model.evaluation.scores import score
from gravityocr.model.network.processor import InvalidInput

# Response budgets by content type (tokens; the character tokenizer spends one per character).
MAX_NEW_TOKENS = {"text": 256, "table": 512, "formula": 256}


@dataclass
class ItemOutcome:
    id: str
    type: str
    score: float
    prediction: str
    committed_tokens: int = 0
    forward_passes: int = 0
    accepted_per_round: list[int] = field(default_factory=list)
    drafted_tokens: dict[str, int] = field(default_factory=dict)  # accepted drafts committed, by source
    error: str | None = None


@dataclass
class EvalReport:
    n: int
    overall: float
    scores: dict[str, float]  # mean score per type present
    tpf: float  # committed tokens / forward passes over all items
    tpf_by_type: dict[str, float]  # the same within each type
    accepted_per_round: dict[str, float]  # mean accepted drafts per round, by type
    # by type: the share of committed tokens that were accepted mask drafts, accepted reading
    # drafts, and the passes' own greedy tokens (AR steps, each round's y and bonus)
    committed_by_source: dict[str, dict[str, float]]
    unreadable: list[dict]  # {"id", "error"} of items scored 0 because they could not be read
    exact: bool | None  # every spec output equal to AR output (None: not checked)
    decode: dict  # DecodeSettings.report(): the settings measured, the cap written out
    items: list[ItemOutcome]

    def to_json(self) -> dict:
        summary = {"n": self.n, "overall": self.overall, **self.scores, "tpf": self.tpf,
                   "tpf_by_type": self.tpf_by_type, "accepted_per_round": self.accepted_per_round,
                   "committed_by_source": self.committed_by_source, "unreadable": self.unreadable}
        if self.exact is not None:
            summary["exact"] = self.exact
        summary["decode"] = self.decode
        return summary


def _decode_all(recognizer: Recognizer, items: list[ManifestItem], decode: DecodeSettings, batch_size: int,
                structured_drafts: bool = True) -> tuple[dict[str, object], dict[str, str]]:
    """Engine results by item id, and the read errors of items that never reached it."""
    processor = recognizer.processor
    requests, errors = [], {}
    for item in items:
        try:
            prompt = processor.encode(item.load_image(), item.type)
        except (OSError, InvalidInput, ValueError) as error:
            errors[item.id] = f"{type(error).__name__}: {error}"
            continue
        requests.append(Request(item.id, prompt, MAX_NEW_TOKENS[item.type]))
    longest = max((r.prompt.length + r.max_new_tokens for r in requests), default=2)
    model = recognizer.model
    config = EngineConfig.from_decode(decode, device=str(model.device), dtype=model.dtype, threads=engine_threads(),
                                      max_batch_size=batch_size, max_seq_len=longest)

    def generate() -> dict[str, object]:
        engine = Engine(model, config, eos_token_ids=processor.eos_token_ids, tokenizer=processor.tokenizer,
                        draft_rules=DraftRules.of(processor.tokenizer) if structured_drafts else None)
        return {r.request_id: r for r in engine.generate(requests)}

    # on a thread of its own, as the page pipeline's engine runs (model/engine/threads.py)
    results = on_engine_thread(generate) if requests else {}
    return results, errors


def decode_report(recognizer: Recognizer, decode: DecodeSettings) -> dict:
    """What an evaluation says it measured: `decode` resolved for this model's device and
    the process's engine threads, as the engines of `evaluate` resolve it."""
    return decode.report(str(recognizer.model.device), engine_threads())


def evaluate(recognizer: Recognizer, items: list[ManifestItem], batch_size: int = 32,
             decode: DecodeSettings | None = None, check_exact: bool = False,
             structured_drafts: bool = True) -> EvalReport:
    """`decode`: the decoding settings measured (None: the product's defaults, so the figures
    are what a user gets). `structured_drafts`: keep a formula's drafts to LaTeX's command
    names (model/decode/draft_rules.py); off to measure what it buys. Crops only:
    a whole page is read by the page pipeline, not as one crop."""
    decode = decode or DecodeSettings()
    pages = [item.id for item in items if item.type not in MAX_NEW_TOKENS]
    if pages:
        raise ValueError(f"evaluate() reads crops; {len(pages)} item(s) are of another type (first: {pages[0]!r})")
    results, errors = _decode_all(recognizer, items, decode, batch_size, structured_drafts)
    exact = None
    if check_exact:
        ar_results, _ = _decode_all(recognizer, items, dataclasses.replace(decode, mode="ar"), batch_size)
        checked = [results]
        if decode.mode == "spec" and decode_report(recognizer, decode)["speculative_max_batch"] != 0:
            # Past the cap the measured run took AR rounds: speculate at every batch size too,
            # so that every item is checked through speculative rounds.
            speculating, _ = _decode_all(recognizer, items, dataclasses.replace(decode, speculative_max_batch=0),
                                         batch_size, structured_drafts)
            checked.append(speculating)
        exact = all(run[i].token_ids == ar_results[i].token_ids for run in checked for i in run)
    outcomes = []
    for item in items:
        if item.id in errors:
            outcomes.append(ItemOutcome(item.id, item.type, 0.0, "", error=errors[item.id]))
            continue
        result = results[item.id]
        prediction = crop_text(recognizer.processor, recognizer.lexicon, result.token_ids, result.finish_reason,
                               item.type)
        outcomes.append(ItemOutcome(item.id, item.type, score(item.type, prediction, item.text), prediction,
                                    result.stats.committed_tokens, result.stats.forward_passes,
                                    list(result.stats.accepted_per_round), dict(result.stats.drafted_tokens)))
    return summarize(outcomes, exact, decode_report(recognizer, decode))


def summarize(outcomes: list[ItemOutcome], exact: bool | None, decode: dict) -> EvalReport:
    by_type: dict[str, list[ItemOutcome]] = defaultdict(list)
    for outcome in outcomes:
        by_type[outcome.type].append(outcome)
    scores = {t: statistics.fmean(o.score for o in group) for t, group in sorted(by_type.items())}
    accepted = {}
    for t, group in sorted(by_type.items()):
        rounds = [a for o in group for a in o.accepted_per_round]
        accepted[t] = statistics.fmean(rounds) if rounds else 0.0
    return EvalReport(
        n=len(outcomes),
        overall=statistics.fmean(scores.values()) if scores else 0.0,
        scores=scores,
        tpf=_tokens_per_pass(outcomes),
        tpf_by_type={t: _tokens_per_pass(group) for t, group in sorted(by_type.items())},
        accepted_per_round=accepted,
        committed_by_source={t: _committed_by_source(group) for t, group in sorted(by_type.items())},
        unreadable=[{"id": o.id, "error": o.error} for o in outcomes if o.error],
        exact=exact,
        decode=decode,
        items=outcomes,
    )


def _committed_by_source(outcomes: list[ItemOutcome]) -> dict[str, float]:
    committed = sum(o.committed_tokens for o in outcomes)
    drafted = {source: sum(o.drafted_tokens.get(source, 0) for o in outcomes) for source in DRAFT_SOURCES}
    shares = {**drafted, "ar": committed - sum(drafted.values())}
    return {source: round(count / committed, 4) if committed else 0.0 for source, count in shares.items()}


def _tokens_per_pass(outcomes: list[ItemOutcome]) -> float:
    passes = sum(o.forward_passes for o in outcomes)
    return sum(o.committed_tokens for o in outcomes) / passes if passes else 0.0
