"""Drafts of LaTeX command names kept to names LaTeX has (decoding with them:
test_structured_drafts.py)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gravityocr.model.formula_drafts import CommandShape, LatexNames


@pytest.fixture(scope="module")
def names(tokenizer):
    return LatexNames.of(tokenizer)


def repaired(tokenizer, names, written: str, drafts: str):
    """(drafts, second choices, confidence flags) after `written`, as text and flags; the
    drafts' own second choices are the drafts themselves, so a changed one shows."""
    shape = CommandShape(names)
    for token in tokenizer.encode(written, add_special_tokens=False):
        shape.feed(token)
    draft_ids = tokenizer.encode(drafts, add_special_tokens=False)
    out = shape.repair(draft_ids, draft_ids, [True] * len(draft_ids), keep_shapes=True)
    assert len(out.shapes) == len(out.drafts)
    return tokenizer.decode(out.drafts), tokenizer.decode(out.alternates), out.confident


def test_a_misspelt_name_becomes_the_nearest_command(tokenizer, names):
    drafts, alternates, confident = repaired(tokenizer, names, "x+\\frac{\\", "eppsiln}{2}")
    assert drafts == "epsilon}{2}"
    assert alternates == "eppsiln}{2}"  # the drafter's letters where they were replaced
    assert confident == [True, True, False, False, False, False, True, True, True, True, True]


def test_a_name_begun_in_committed_tokens_is_finished(tokenizer, names):
    assert repaired(tokenizer, names, "1\\pm\\sqr", "{x}")[0] == "t{x"  # no more drafts than given
    assert repaired(tokenizer, names, "1\\pm\\sqr", "{")[0] == "t"
    assert repaired(tokenizer, names, "a\\tim", "es b")[0] == "es b"  # already right


def test_known_names_partial_names_and_other_backslashes_are_kept(tokenizer, names):
    for written, drafts in [("\\", "alpha+\\beta"),  # commands as drafted
                            ("\\", "fra"),  # the drafts end inside a command: it may go on
                            ("\\mathscr", "{A}"),  # no listed command starts so: left to the drafter
                            ("a\\\\", "bc"),  # a line break, not a command
                            ("\\", "{x\\}"),  # an escaped brace
                            ("y=", "ab+c")]:  # no command at all
        assert repaired(tokenizer, names, written, drafts)[0] == drafts, (written, drafts)


def test_a_second_command_in_the_drafts_is_kept_to_names_too(tokenizer, names):
    assert repaired(tokenizer, names, "", "\\summ_{k}\\inffty")[0] == "\\sum_{k}\\infty"
    assert repaired(tokenizer, names, "", "\\lpha")[0] == "\\alph"  # a wrong first letter too


def test_no_names_where_letters_are_not_single_tokens():
    vocabulary = {"<unk>": 0, "ab": 1, "c": 2}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab=vocabulary,
                                                                                    unk_token="<unk>")),
                                        unk_token="<unk>")
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    assert LatexNames.of(tokenizer) is None
