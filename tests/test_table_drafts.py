"""Drafts kept to a table's structure: the rules, and that decoding with them stays greedy
AR's output (reference decoder and engine) while it takes fewer passes on real tables."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gravityocr.model.decoding import greedy_decode, speculative_decode
from gravityocr.model.draft_ahead import DraftAhead
from gravityocr.model.engine import Engine, EngineConfig, Request
from gravityocr.model.evaluation import MAX_NEW_TOKENS
from gravityocr.model.loading import DEFAULT_MODEL_DIR, load_recognizer
from gravityocr.model.manifest import read_manifest
from gravityocr.model.table_drafts import TableShape, TableTokens, branch_tails, kept_to_structure, repair_drafts

HELDOUT = DEFAULT_MODEL_DIR.parents[1] / "data" / "heldout"


@pytest.fixture(scope="module")
def table_tokens(tokenizer):
    return TableTokens.of(tokenizer, [tokenizer.eos_token_id])


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def text(tokenizer, token_ids: list[int]) -> str:
    return "".join(tokenizer.convert_ids_to_tokens(token_ids))


def shape_after(table_tokens, token_ids: list[int]) -> TableShape:
    shape = TableShape(table_tokens)
    for token in token_ids:
        shape.feed(token)
    return shape


def repaired(tokenizer, table_tokens, prefix: str, drafts: str):
    """(drafts, second choices, confidence flags) after `prefix`, as text and flags; the
    drafts' own second choices are the drafts themselves, so a changed one shows."""
    draft_ids = ids(tokenizer, drafts)
    out = repair_drafts(shape_after(table_tokens, ids(tokenizer, prefix)), draft_ids, draft_ids,
                        [True] * len(draft_ids))
    return text(tokenizer, out.drafts), text(tokenizer, out.alternates), out.confident


def test_rows_end_at_the_first_rows_column_count(tokenizer, table_tokens):
    prefix = "<table><tr><td>a</td><td>b</td><td>c</td></tr><tr><td>1</td><td>2</td>"
    drafts, alternates, confident = repaired(tokenizer, table_tokens, prefix, "<td>3</td><td>4</td></tr>")
    # third cell kept; the fourth is a row end; after it a row (the table's end the other
    # choice), then a cell, and the </tr> the drafter wrote inside that cell is dropped
    assert drafts == "<td>3</td></tr><tr><td>"
    assert alternates == "<td>3</td><td></table></td>"
    assert confident == [True, True, True, False, False, False]  # replaced drafts are doubtful


def test_colspans_and_rowspans_count_as_the_columns_they_cover(tokenizer, table_tokens):
    prefix = ('<table><tr><td colspan="2">a</td><td>b</td></tr>'  # three columns
              '<tr><td rowspan="2">x</td><td>y</td><td>z</td></tr><tr><td>p</td>')  # x covers one here
    drafts, alternates, _ = repaired(tokenizer, table_tokens, prefix, "</tr><td>q</td><td>")
    assert drafts == "<td>q</td></tr>"
    assert alternates.startswith("</tr>")


def test_after_a_row_the_next_row_or_the_tables_end_and_then_eos(tokenizer, table_tokens):
    prefix = "<table><tr><td>a</td></tr>"
    assert repaired(tokenizer, table_tokens, prefix, "<tr>")[:2] == ("<tr>", "</table>")
    drafts, alternates, confident = repaired(tokenizer, table_tokens, prefix, "<|endoftext|><td>x")
    assert drafts == "</table><|endoftext|>"  # and nothing after the eos
    assert alternates == "<tr><td>"
    assert confident == [False, False]
    assert repaired(tokenizer, table_tokens, prefix + "</table>", "<td>x")[0] == "<|endoftext|>"


def test_the_first_row_ends_where_the_drafter_ends_it(tokenizer, table_tokens):
    prefix = "<table><tr><td>a</td>"
    assert repaired(tokenizer, table_tokens, prefix, "</table>")[:2] == ("</tr>", "<td>")
    assert repaired(tokenizer, table_tokens, prefix, "x")[:2] == ("<td>", "</tr>")
    assert repaired(tokenizer, table_tokens, "<table>", "<td>")[0] == "<tr>"
    assert repaired(tokenizer, table_tokens, "<table><tr>", "x")[0] == "<td>"


def test_tags_inside_a_cell_are_dropped_and_empty_cells_kept(tokenizer, table_tokens):
    assert repaired(tokenizer, table_tokens, "<table><tr><td>", "ab<td>c<tr></td>")[0] == "abc</td>"
    assert repaired(tokenizer, table_tokens, "<table><tr><td>", "</td>")[0] == "</td>"
    assert repaired(tokenizer, table_tokens, '<table><tr><td colspan="', '2">a<td>')[0] == '2">a'


def test_text_and_tables_inside_a_page_are_left_to_the_drafter_outside_the_table(tokenizer, table_tokens):
    for prefix, drafts in [("plain text", "more<tr><|endoftext|>x"),
                           ("Title\n<table><tr><td>a</td></tr></table>", "\n<td>x")]:
        assert repaired(tokenizer, table_tokens, prefix, drafts)[0] == drafts
    # a table opened inside the drafts is kept to its structure from its first tag (drafts
    # are replaced, never inserted: "a" stands where the drafter put the row's first cell)
    assert repaired(tokenizer, table_tokens, "Title\n", "<table><td>a")[0] == "<table><tr><td>"
    assert kept_to_structure(None, [5, 6]) == [5, 6]


def test_branch_tails_follow_the_second_choice(tokenizer, table_tokens):
    shape = shape_after(table_tokens, ids(tokenizer, "<table><tr><td>a</td></tr>"))
    drafts = ids(tokenizer, "<tr><td>b</td></tr>")
    out = repair_drafts(shape, drafts, drafts, [True] * len(drafts), keep_shapes=True)
    assert text(tokenizer, [out.alternates[0]]) == "</table>"
    tails = branch_tails(shape, out, [1, 3], block=16)
    assert text(tokenizer, tails[0]) == "<|endoftext|>"  # after the table's end
    # at depth 3 ("b" in the cell, its second choice "b" too): the drafts after it, unchanged
    assert text(tokenizer, tails[1]) == "</td></tr>"
    assert len(branch_tails(shape, out, [1], block=1)[0]) == 0  # a branch of one token has no tail


def test_a_rounds_layout_carries_the_kept_drafts_and_branch_tails(tokenizer, table_tokens):
    shape = shape_after(table_tokens, ids(tokenizer, "<table><tr><td>a</td></tr>"))
    drafts = ids(tokenizer, "<tr><td>b<tr>")
    layout = DraftAhead(4, branches=1).layout(drafts[0], drafts, drafts, [False] * len(drafts), 3, shape)
    assert text(tokenizer, layout.tokens[1:1 + layout.draft_count]) == "<tr><td>b"
    [branch] = layout.branches
    assert branch.depth == 1
    assert text(tokenizer, layout.tokens[branch.start:branch.start + branch.length]) == "</table><|endoftext|>"
    plain = DraftAhead(4, branches=1).layout(drafts[0], drafts, drafts, [False] * len(drafts), 3)
    assert plain.tokens[1:1 + plain.draft_count] == drafts


def test_no_table_tokens_where_tags_are_not_single_tokens():
    vocabulary = {c: i for i, c in enumerate(["<unk>", "<eos>"] + list("<>/tabledr0123456789 colspan=\""))}
    core = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    assert len(tokenizer.encode("<table>", add_special_tokens=False)) > 1
    assert TableTokens.of(tokenizer, [1]) is None


# --- the shipped model on held-out tables ----------------------------------------------

@pytest.fixture(scope="module")
def shipped():
    recognizer = load_recognizer(DEFAULT_MODEL_DIR, dtype=torch.float64)
    tables = [item for item in read_manifest(HELDOUT) if item.type == "table"][:6]
    prompts = [recognizer.processor.encode(item.load_image(), "table") for item in tables]
    return recognizer, prompts


DECODERS = {"classic": None, "ahead": DraftAhead(16), "branches": DraftAhead(16, branches=4)}


@pytest.mark.parametrize("decoder", DECODERS)
def test_shipped_model_tables_stay_exact_in_fewer_passes(shipped, decoder):
    recognizer, prompts = shipped
    model, processor, ahead = recognizer.model, recognizer.processor, DECODERS[decoder]
    eos, limit = set(processor.eos_token_ids), MAX_NEW_TOKENS["table"]
    passes = {"kept": 0, "free": 0}
    for prompt in prompts:
        greedy = greedy_decode(model, prompt, limit, eos).token_ids
        for name, table_tokens in (("kept", processor.table_tokens), ("free", None)):
            result = speculative_decode(model, prompt, limit, eos, 32, ahead, table_tokens)
            assert result.token_ids == greedy
            passes[name] += result.stats.forward_passes
    assert passes["kept"] <= passes["free"]
    if ahead is not None:  # every round's drafts pass the host: the structure saves passes
        assert passes["kept"] < passes["free"]


@pytest.mark.parametrize("decoder", DECODERS)
def test_engine_keeps_drafts_to_tables_as_the_reference_does(shipped, decoder):
    recognizer, prompts = shipped
    model, processor, ahead = recognizer.model, recognizer.processor, DECODERS[decoder]
    eos, limit = processor.eos_token_ids, MAX_NEW_TOKENS["table"]
    longest = max(prompt.length for prompt in prompts) + limit
    engine = Engine(model, EngineConfig(max_batch_size=4, max_seq_len=longest, dtype=torch.float64, num_threads=1,
                                        draft_ahead=ahead),
                    eos, table_tokens=processor.table_tokens)
    results = engine.generate([Request(str(i), prompt, limit) for i, prompt in enumerate(prompts)])
    for prompt, result in zip(prompts, results):
        reference = speculative_decode(model, prompt, limit, set(eos), 32, ahead, processor.table_tokens)
        assert result.token_ids == reference.token_ids
        assert result.stats.accepted_per_round == reference.stats.accepted_per_round
        assert result.stats.forward_passes == reference.stats.forward_passes
