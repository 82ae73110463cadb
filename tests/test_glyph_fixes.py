"""Digits and letters read for each other, set right by their word after decoding: what the
rule changes, what it must leave alone, where it applies, and that the lexicon travels with
the weights."""

from __future__ import annotations

from conftest import make_tiny_model

from gravityocr.corpus.lexicon import words_of
from gravityocr.model.decode.crop_text import crop_text
from gravityocr.model.network.glyph_fixes import LEXICON_FILE, MIN_SEEN, Lexicon, fix_glyphs
from gravityocr.model.network.loading import Recognizer, load_recognizer, save_recognizer

LEXICON = Lexicon({"full": 40, "Overview": 12, "overview": 30, "cell": 25, "file1": 8, "0pt": 90, "opt": 50,
                   "FILE": 9, "rare": MIN_SEEN - 1, "level1": 6})


def test_a_digit_inside_a_word_of_letters_becomes_the_letter_the_documents_write():
    assert fix_glyphs("the ful1 story", LEXICON) == "the full story"
    assert fixed_once("0verview of the system") == "Overview of the system"
    assert fix_glyphs(r"a \cel1 in a table", LEXICON) == r"a \cell in a table"
    assert fix_glyphs("F1LE names", LEXICON) == "FILE names"  # among capitals a 1 reads as I


def fixed_once(text: str) -> str:
    fixed = fix_glyphs(text, LEXICON)
    assert fix_glyphs(fixed, LEXICON) == fixed  # a fixed text has nothing left to fix
    return fixed


def test_words_the_documents_write_with_digits_and_unseen_readings_stay():
    assert fix_glyphs("0pt and file1 and level1", LEXICON) == "0pt and file1 and level1"  # written so
    assert fix_glyphs("rar0 ful2 x86 md5 sha1", LEXICON) == "rar0 ful2 x86 md5 sha1"  # too rare; other digits
    assert fix_glyphs("11 items, 0 errors, 2010", LEXICON) == "11 items, 0 errors, 2010"  # numbers
    assert fix_glyphs("rare1", LEXICON) == "rare1"  # 'rarel' unseen
    assert fix_glyphs("section ful1.9.7 and 2.ful1", LEXICON) == "section ful1.9.7 and 2.ful1"  # numbers


def test_an_o_inside_a_number_is_a_zero_with_or_without_a_lexicon():
    assert fix_glyphs("v3.o5 and v3.o9a, 1o2", None) == "v3.05 and v3.09a, 102"
    assert fix_glyphs("O(n) and 2.o or do 3 o", None) == "O(n) and 2.o or do 3 o"  # no digit after it
    assert fix_glyphs("the ful1 story", None) == "the ful1 story"  # without a lexicon, numbers only


def test_only_text_crops_are_fixed_and_a_loop_is_still_shown_once(processor):
    ids = processor.tokenizer.encode("ful1 0verview", add_special_tokens=False)
    assert processor.decode(ids) == "ful1 0verview"
    assert crop_text(processor, LEXICON, ids, "eos", "text") == "full Overview"
    for task in ("formula", "table"):
        assert crop_text(processor, LEXICON, ids, "eos", task) == "ful1 0verview"
    loop = processor.tokenizer.encode("ful1 " + "abc" * 10, add_special_tokens=False)
    assert crop_text(processor, LEXICON, loop, "repetition", "text") == "full abc"


def test_the_lexicon_is_saved_and_loaded_beside_the_weights(tmp_path, tokenizer, processor):
    save_recognizer(Recognizer(make_tiny_model(tokenizer, seed=0), processor, LEXICON), tmp_path / "with")
    assert (tmp_path / "with" / LEXICON_FILE).is_file()
    assert load_recognizer(tmp_path / "with").lexicon == LEXICON
    save_recognizer(Recognizer(make_tiny_model(tokenizer, seed=0), processor), tmp_path / "without")
    assert load_recognizer(tmp_path / "without").lexicon is None


def test_the_lexicon_counts_the_words_the_fixes_look_up():
    assert words_of("The ful1 cell, 0pt -- v3.05 (file1) 42") == ["The", "ful1", "cell", "0pt", "v3", "file1"]
