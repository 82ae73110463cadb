"""Score a recogniser on the crops of an evaluation set (text lines, tables, formulas).

Every item is read through the recogniser's front door (pipelines/recognizer.py
`CropRecognizer`, as `ocr`, the batch job and serve read crops) with the given decoding
settings (by default the product's: self-speculative at every batch size); with `check_exact` the same
items are decoded again in plain AR mode (and, where a `speculative_max_batch` cap made the
measured run take AR rounds, with speculation at every batch size), and `exact` says whether every output is
identical, token for token. An item whose image cannot be read scores 0 and is listed.
Whole pages are read by the page pipeline (`gravityocr eval`, model/evaluation/eval_command.py),
which builds on this module.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from gravityocr.model.decode.reference import DRAFT_SOURCES
from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.model.engine.threads import engine_threads
from gravityocr.model.evaluation.manifest import ManifestItem
from gravityocr.model.evaluation.scores import score
from gravityocr.model.network.loading import Recognizer
from gravityocr.model.network.tasks import TASK_PROMPTS
from gravityocr.pipelines.recognizer import CropRecognizer, CropResult, RecognizerConfig

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


def _read_all(recognizer: Recognizer, items: list[ManifestItem], decode: DecodeSettings,
              batch_size: int) -> tuple[dict[str, CropResult], dict[str, str]]:
    """Each item read through the recogniser's front door, as every entry point reads a crop
    (the same budgets, stopping rule and glyph fixes): results by item id, and the errors of
    items that could not be read."""
    loaded, errors = [], {}
    for item in items:
        try:
            loaded.append((item, item.load_image()))
        except OSError as error:
            errors[item.id] = f"{type(error).__name__}: {error}"
    with CropRecognizer(recognizer, RecognizerConfig(decode=decode, max_batch_size=batch_size)) as crops:
        read = crops.recognize([(image, item.type) for item, image in loaded])
    results = {}
    for (item, _), result in zip(loaded, read):
        if result.ok:
            results[item.id] = result
        else:
            errors[item.id] = result.error
    return results, errors


def decode_report(recognizer: Recognizer, decode: DecodeSettings) -> dict:
    """What an evaluation says it measured: `decode` resolved for this model's device and
    the process's engine threads, as the engines of `evaluate` resolve it."""
    return decode.report(str(recognizer.model.device), engine_threads())


def evaluate(recognizer: Recognizer, items: list[ManifestItem], batch_size: int = 32,
             decode: DecodeSettings | None = None, check_exact: bool = False) -> EvalReport:
    """`decode`: the decoding settings measured (None: the product's defaults, so the figures
    are what a user gets). Crops only: a whole page is read by the page pipeline, not as one
    crop."""
    decode = decode or DecodeSettings()
    pages = [item.id for item in items if item.type not in TASK_PROMPTS]
    if pages:
        raise ValueError(f"evaluate() reads crops; {len(pages)} item(s) are of another type (first: {pages[0]!r})")
    results, errors = _read_all(recognizer, items, decode, batch_size)
    exact = None
    if check_exact:
        ar_results, _ = _read_all(recognizer, items, dataclasses.replace(decode, mode="ar"), batch_size)
        checked = [results]
        if decode.mode == "spec" and decode_report(recognizer, decode)["speculative_max_batch"] != 0:
            # Past the cap the measured run took AR rounds: speculate at every batch size too,
            # so that every item is checked through speculative rounds.
            speculating, _ = _read_all(recognizer, items, dataclasses.replace(decode, speculative_max_batch=0),
                                       batch_size)
            checked.append(speculating)
        exact = all(run[i].token_ids == ar_results[i].token_ids for run in checked for i in run)
    outcomes = []
    for item in items:
        if item.id in errors:
            outcomes.append(ItemOutcome(item.id, item.type, 0.0, "", error=errors[item.id]))
            continue
        result = results[item.id]
        outcomes.append(ItemOutcome(item.id, item.type, score(item.type, result.text, item.text), result.text,
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
