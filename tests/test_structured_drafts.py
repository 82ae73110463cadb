"""Decoding with drafts kept to the structure of what is written (LaTeX command names in
formulas) stays greedy AR's output, in the reference decoder and the engine alike, and takes
fewer passes on the shipped model's held-out formulas."""

from __future__ import annotations

import pytest
import torch

from gravityocr.model.decode.reference import greedy_decode, speculative_decode
from gravityocr.model.decode.draft_rules import DraftRules
from gravityocr.model.engine import Engine, EngineConfig, Request
from gravityocr.model.network.tasks import TASK_TOKEN_BUDGETS as MAX_NEW_TOKENS
from gravityocr.model.decode.formula_drafts import CommandShape
from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer
from gravityocr.model.evaluation.manifest import read_manifest

HELDOUT = DEFAULT_MODEL_DIR.parents[1] / "data" / "heldout"
KINDS = ["table", "formula"]  # tables: rows without a shape, beside formulas in one batch


@pytest.fixture(scope="module")
def shipped():
    recognizer = load_recognizer(DEFAULT_MODEL_DIR, dtype=torch.float64)
    items = read_manifest(HELDOUT)
    prompts = {kind: [recognizer.processor.encode(item.load_image(), kind)  # every fifteenth: easy to hard
                      for item in [i for i in items if i.type == kind][::15]] for kind in KINDS}
    return recognizer, prompts


def test_rules_by_task(processor):
    rules = DraftRules.of(processor.tokenizer)
    assert isinstance(rules, DraftRules)
    assert isinstance(rules.shape_for("formula"), CommandShape)
    assert all(rules.shape_for(task) is None for task in ("table", "text", "page"))
    assert DraftRules(None).shape_for("formula") is None


def test_shipped_model_stays_exact_in_fewer_passes(shipped):
    recognizer, prompts = shipped
    model, processor = recognizer.model, recognizer.processor
    eos, limit = set(processor.eos_token_ids), MAX_NEW_TOKENS["formula"]
    passes = {"kept": 0, "free": 0}
    for prompt in prompts["formula"]:
        greedy = greedy_decode(model, prompt, limit, eos).token_ids
        for name, rules in (("kept", DraftRules.of(processor.tokenizer)), ("free", None)):
            result = speculative_decode(model, prompt, limit, eos, 32, rules, reading_drafts=False)  # mask drafts
            assert result.token_ids == greedy
            passes[name] += result.stats.forward_passes
    assert passes["kept"] < passes["free"]  # every round's drafts are kept to structure


def test_engine_keeps_drafts_to_structure_as_the_reference_does(shipped):
    recognizer, prompts = shipped
    model, processor = recognizer.model, recognizer.processor
    eos, limit = processor.eos_token_ids, MAX_NEW_TOKENS["formula"]
    longest = max(prompt.length for prompt in prompts["formula"]) + limit
    # Fixed blocks and mask drafts, as the reference decoder's: the same rounds (the shipped
    # model's own default drafts lines from its reading and reads formulas in AR steps).
    engine = Engine(model, EngineConfig(max_batch_size=4, max_seq_len=longest, dtype=torch.float64, num_threads=1,
                                        adaptive_block=False, reading_drafts=False),
                    eos, draft_rules=DraftRules.of(processor.tokenizer))
    results = engine.generate([Request(str(i), prompt, limit) for i, prompt in enumerate(prompts["formula"])])
    for prompt, result in zip(prompts["formula"], results):
        reference = speculative_decode(model, prompt, limit, set(eos), 32, DraftRules.of(processor.tokenizer), reading_drafts=False)
        assert result.token_ids == reference.token_ids
        assert result.stats.accepted_per_round == reference.stats.accepted_per_round
        assert result.stats.forward_passes == reference.stats.forward_passes


def test_engine_classic_rounds_keep_each_rows_drafts_to_its_own_structure(shipped):
    """Tables and formulas in one batch: each drafted formula row is repaired by its own
    shape between the passes (and shrinks by what it drops) while the others, tables with
    no shape among them, decode beside it."""
    recognizer, prompts = shipped
    model, processor = recognizer.model, recognizer.processor
    mixed = [(kind, prompt) for pair in zip(prompts["table"], prompts["formula"]) for kind, prompt in
             zip(KINDS, pair)]
    longest = max(prompt.length for _, prompt in mixed) + max(MAX_NEW_TOKENS[kind] for kind in KINDS)
    # Fixed blocks and mask drafts, as the reference decoder's: the same rounds (the shipped
    # model's own default drafts lines from its reading and reads formulas in AR steps).
    engine = Engine(model, EngineConfig(max_batch_size=3, max_seq_len=longest, dtype=torch.float64, num_threads=1,
                                        adaptive_block=False, reading_drafts=False),
                    processor.eos_token_ids, draft_rules=DraftRules.of(processor.tokenizer))
    results = engine.generate([Request(str(i), prompt, MAX_NEW_TOKENS[kind]) for i, (kind, prompt) in enumerate(mixed)])
    # Per-row blocks from each row's acceptance: repaired within its own block, same output.
    adaptive = Engine(model, EngineConfig(max_batch_size=3, max_seq_len=longest, dtype=torch.float64, num_threads=1,
                                          adaptive_block=True, reading_drafts=False),
                      processor.eos_token_ids, draft_rules=DraftRules.of(processor.tokenizer))
    adaptive_results = adaptive.generate([Request(str(i), prompt, MAX_NEW_TOKENS[kind])
                                          for i, (kind, prompt) in enumerate(mixed)])
    for (kind, prompt), result, adaptive_result in zip(mixed, results, adaptive_results):
        reference = speculative_decode(model, prompt, MAX_NEW_TOKENS[kind], set(processor.eos_token_ids), 32,
                                       DraftRules.of(processor.tokenizer), reading_drafts=False)
        assert result.token_ids == reference.token_ids == adaptive_result.token_ids
        assert result.stats.accepted_per_round == reference.stats.accepted_per_round
