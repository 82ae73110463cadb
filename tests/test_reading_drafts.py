"""Reading drafts (model/decode/reading_drafts.py): where they are read from, and that an
engine verifying them decodes exactly what greedy AR decoding writes, on real lines read
by the shipped model, in fewer passes than mask drafts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gravityocr.model.decode.draft_rules import DraftRules
from gravityocr.model.decode.reading_drafts import NO_COPY, ReadingIndex, reading_with_eos
from gravityocr.model.decode.reference import greedy_decode
from gravityocr.model.engine import Engine, EngineConfig, Request
from gravityocr.model.evaluation.manifest import read_manifest
from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer

REAL = Path(__file__).resolve().parents[1] / "data" / "real"


def reading_drafts(committed: list[int], reading: list[int], count: int) -> list[int]:
    return ReadingIndex(reading).drafts(committed, count)


def test_drafts_follow_the_reading_where_the_text_agrees_with_it():
    reading = list(b"Hello world!")
    assert reading_drafts([], reading, 3) == list(b"Hel")
    assert reading_drafts(list(b"Hello"), reading, 4) == list(b" wor")  # aligned at position 5
    assert reading_drafts(list(b"Hello world!"), reading, 4) == []  # nothing after the end


def test_after_a_drift_drafts_continue_from_the_last_tokens_place_in_the_reading():
    reading = list(b"the cat sat on the mat")
    # the decoder wrote one character more than the reading has ("cats"): the last tokens
    # " sa" are found in the reading, and the drafts go on after them
    assert reading_drafts(list(b"the cats sa"), reading, 3) == list(b"t o")
    # of two places with the same last tokens, the one nearest the decoder's position
    assert reading_drafts(list(b"the cat sat on th"), reading, 3) == list(b"e m")
    assert reading_drafts(list(b"xyz"), list(b"abc"), 3) == []  # no place to continue from


def test_the_copy_token_is_the_readings_token_at_the_texts_place():
    reading = ReadingIndex(list(b"the cat") + [1])  # 1: the eos
    # agreeing text: the next character; after the reading's last, its eos
    assert reading.copy_tokens(list(b"the cat")) == list(b"the cat") + [1]
    # "cats": after the inserted "s" no place has "ts", "s"; the copy goes on after " "
    assert reading.copy_token(list(b"the cats")) == NO_COPY
    assert reading.copy_token(list(b"the cats ")) == ord("c")  # " " occurs once, before "cat"
    # a pass's inputs: input i predicts token first + i, masks past the text get none
    assert reading.copy_row(list(b"the"), 2, 4) == [ord("e"), ord(" "), NO_COPY, NO_COPY]


def test_the_reading_ends_with_the_eos_where_the_model_has_one():
    assert reading_with_eos([7, 8], frozenset({1})) == [7, 8, 1]
    assert reading_with_eos([7, 8], frozenset({1, 2})) == [7, 8]


@pytest.fixture(scope="module")
def shipped():
    return load_recognizer(DEFAULT_MODEL_DIR)


def test_reading_drafts_are_exact_and_take_fewer_passes_on_real_lines(shipped):
    processor = shipped.processor
    manifest = read_manifest(REAL)
    items = [item for item in manifest if item.type == "text"][::40]
    # a formula and a table beside them: rows that take AR steps in the same prefills and
    # rounds (the shortest of each: what they are here for is to run beside the lines)
    items += [min((item for item in manifest if item.type == kind), key=lambda item: len(item.text))
              for kind in ("formula", "table")]
    prompts = [processor.encode(item.load_image(), item.type) for item in items]
    budgets = [min(256, processor.output_budget(prompt)) for prompt in prompts]
    eos = processor.eos_token_ids
    with torch.no_grad():
        greedy = [greedy_decode(shipped.model, prompt, budget, set(eos)).token_ids
                  for prompt, budget in zip(prompts, budgets)]
    passes, one_pass = {}, {}
    for reading in (True, False):
        for batch in (1, 4):  # one at a time, and rows drafting from the reading beside rows that do not
            config = EngineConfig(max_batch_size=batch, max_seq_len=2048, num_threads=1, reading_drafts=reading)
            engine = Engine(shipped.model, config, eos, draft_rules=DraftRules.of(processor.tokenizer))
            results = engine.generate([Request(str(i), p, b) for i, (p, b) in enumerate(zip(prompts, budgets))])
            assert [r.token_ids for r in results] == greedy
            for item, result in zip(items, results):  # drafts chosen by content
                sources = {source for source, count in result.stats.drafted_tokens.items() if count}
                if reading:  # lines from their reading; a table or a formula none (AR steps)
                    assert sources <= ({"reading"} if item.type == "text" else set()), (item.id, sources)
                else:
                    assert sources <= {"mask"}, (item.id, sources)
                by_source = result.stats.committed_by_source()
                assert sum(by_source.values()) == len(result.token_ids) and min(by_source.values()) >= 0
            passes[reading, batch] = sum(r.stats.forward_passes for r in results)
            one_pass[reading, batch] = sum(r.stats.forward_passes == 1 and len(r.token_ids) > 1 for r in results)
    assert passes[True, 1] < passes[False, 1] and passes[True, 4] < passes[False, 4]
    # the prefill verifies the reading's first tokens: a short line read as the tower reads
    # it ends in that one pass; mask drafts need a verify pass after the prefill
    assert one_pass[True, 1] > 0 and one_pass[True, 4] > 0
    assert one_pass[False, 1] == one_pass[False, 4] == 0
