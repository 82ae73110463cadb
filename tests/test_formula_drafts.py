"""Drafts of LaTeX command names kept to names LaTeX has (decoding with them:
test_structured_drafts.py)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gravityocr.model.decode.formula_drafts import CommandShape, LatexNames


@pytest.fixture(scope="module")
def names(tokenizer):
    return LatexNames.of(tokenizer)


def repaired(tokenizer, names, written: str, drafts: str) -> str:
    """The drafts after `written`, command names kept to known ones, as text."""
    shape = CommandShape(names)
    for token in tokenizer.encode(written, add_special_tokens=False):
        shape.feed(token)
    draft_ids = tokenizer.encode(drafts, add_special_tokens=False)
    out = shape.repair(draft_ids)
    assert len(out) <= len(draft_ids)
    return tokenizer.decode(out)


def test_a_misspelt_name_becomes_the_nearest_command(tokenizer, names):
    assert repaired(tokenizer, names, "x+\\frac{\\", "eppsiln}{2}") == "epsilon}{2}"


def test_a_name_begun_in_committed_tokens_is_finished(tokenizer, names):
    assert repaired(tokenizer, names, "1\\pm\\sqr", "{x}") == "t{x"  # no more drafts than given
    assert repaired(tokenizer, names, "1\\pm\\sqr", "{") == "t"
    assert repaired(tokenizer, names, "a\\tim", "es b") == "es b"  # already right


def test_known_names_partial_names_and_other_backslashes_are_kept(tokenizer, names):
    for written, drafts in [("\\", "alpha+\\beta"),  # commands as drafted
                            ("\\", "fra"),  # the drafts end inside a command: it may go on
                            ("\\mathscr", "{A}"),  # no listed command starts so: left to the drafter
                            ("a\\\\", "bc"),  # a line break, not a command
                            ("\\", "{x\\}"),  # an escaped brace
                            ("y=", "ab+c")]:  # no command at all
        assert repaired(tokenizer, names, written, drafts) == drafts, (written, drafts)


def test_a_second_command_in_the_drafts_is_kept_to_names_too(tokenizer, names):
    assert repaired(tokenizer, names, "", "\\summ_{k}\\inffty") == "\\sum_{k}\\infty"
    assert repaired(tokenizer, names, "", "\\lpha") == "\\alph"  # a wrong first letter too


def test_no_names_where_letters_are_not_single_tokens():
    vocabulary = {"<unk>": 0, "ab": 1, "c": 2}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab=vocabulary,
                                                                                    unk_token="<unk>")),
                                        unk_token="<unk>")
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    assert LatexNames.of(tokenizer) is None
