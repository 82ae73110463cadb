"""Drafts kept to a table's structure: the rules (decoding with them: test_structured_drafts.py)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gravityocr.model.draft_ahead import DraftAhead
from gravityocr.model.structured_drafts import branch_tails, kept_to_structure
from gravityocr.model.table_drafts import TableShape, TableTokens, repair_drafts


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
