"""Drafts kept to a table's structure: the rules (decoding with them: test_structured_drafts.py)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gravityocr.model.structured_drafts import kept_to_structure
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


def repaired(tokenizer, table_tokens, prefix: str, drafts: str) -> str:
    """The drafts after `prefix`, kept to the table's structure, as text."""
    shape = shape_after(table_tokens, ids(tokenizer, prefix))
    out = repair_drafts(shape, ids(tokenizer, drafts))
    assert kept_to_structure(shape, ids(tokenizer, drafts)) == shape.repair(ids(tokenizer, drafts)) == out
    return text(tokenizer, out)


def test_rows_end_at_the_first_rows_column_count(tokenizer, table_tokens):
    prefix = "<table><tr><td>a</td><td>b</td><td>c</td></tr><tr><td>1</td><td>2</td>"
    drafts = repaired(tokenizer, table_tokens, prefix, "<td>3</td><td>4</td></tr>")
    # third cell kept; the fourth is a row end; after it a row, then a cell, and the </tr>
    # the drafter wrote inside that cell is dropped
    assert drafts == "<td>3</td></tr><tr><td>"


def test_colspans_and_rowspans_count_as_the_columns_they_cover(tokenizer, table_tokens):
    prefix = ('<table><tr><td colspan="2">a</td><td>b</td></tr>'  # three columns
              '<tr><td rowspan="2">x</td><td>y</td><td>z</td></tr><tr><td>p</td>')  # x covers one here
    assert repaired(tokenizer, table_tokens, prefix, "</tr><td>q</td><td>") == "<td>q</td></tr>"


def test_after_a_row_the_next_row_or_the_tables_end_and_then_eos(tokenizer, table_tokens):
    prefix = "<table><tr><td>a</td></tr>"
    assert repaired(tokenizer, table_tokens, prefix, "<tr>") == "<tr>"
    assert repaired(tokenizer, table_tokens, prefix, "x") == "<tr>"
    assert repaired(tokenizer, table_tokens, prefix, "<|endoftext|><td>x") == "</table><|endoftext|>"  # nothing after
    assert repaired(tokenizer, table_tokens, prefix + "</table>", "<td>x") == "<|endoftext|>"


def test_the_first_row_ends_where_the_drafter_ends_it(tokenizer, table_tokens):
    prefix = "<table><tr><td>a</td>"
    assert repaired(tokenizer, table_tokens, prefix, "</table>") == "</tr>"
    assert repaired(tokenizer, table_tokens, prefix, "x") == "<td>"
    assert repaired(tokenizer, table_tokens, "<table>", "<td>") == "<tr>"
    assert repaired(tokenizer, table_tokens, "<table><tr>", "x") == "<td>"


def test_tags_inside_a_cell_are_dropped_and_empty_cells_kept(tokenizer, table_tokens):
    assert repaired(tokenizer, table_tokens, "<table><tr><td>", "ab<td>c<tr></td>") == "abc</td>"
    assert repaired(tokenizer, table_tokens, "<table><tr><td>", "</td>") == "</td>"
    assert repaired(tokenizer, table_tokens, '<table><tr><td colspan="', '2">a<td>') == '2">a'


def test_text_and_tables_inside_a_page_are_left_to_the_drafter_outside_the_table(tokenizer, table_tokens):
    for prefix, drafts in [("plain text", "more<tr><|endoftext|>x"),
                           ("Title\n<table><tr><td>a</td></tr></table>", "\n<td>x")]:
        assert repaired(tokenizer, table_tokens, prefix, drafts) == drafts
    # a table opened inside the drafts is kept to its structure from its first tag (drafts
    # are replaced, never inserted: "a" stands where the drafter put the row's first cell)
    assert repaired(tokenizer, table_tokens, "Title\n", "<table><td>a") == "<table><tr><td>"
    assert kept_to_structure(None, [5, 6]) == [5, 6]


def test_no_table_tokens_where_tags_are_not_single_tokens():
    vocabulary = {c: i for i, c in enumerate(["<unk>", "<eos>"] + list("<>/tabledr0123456789 colspan=\""))}
    core = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    assert len(tokenizer.encode("<table>", add_special_tokens=False)) > 1
    assert TableTokens.of(tokenizer, [1]) is None
