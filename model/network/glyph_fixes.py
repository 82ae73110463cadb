"""A digit read for the letter it looks like, or a letter for a digit, set right by the word
around it, after decoding: the decoded tokens are untouched, and with them every exactness
guarantee; only the text of a crop read as text changes.

- In a number, an `o` or `O` between two digits, or after a digit and a dot (`v3.o5`), is the
  digit 0. Always on.
- A word that mixes letters with the digits `1` or `0` and that the lexicon (the training
  documents' words, saved beside the weights: corpus/lexicon.py) never saw, whose letter
  reading it saw at least `MIN_SEEN` times, is that reading: `ful1` -> `full`, `0verview` ->
  `Overview`, `\\cel1` -> `\\cell`. The letter reading of `1` is `l`, or `I` where the word's
  other letters are capitals; of `0`, `O` at the start of a word or among capitals, else `o`.
  Words the documents write with digits (`0pt`, `file1`, `log10`) are in the lexicon as they
  are and stay; a word with other digits (`v2`, `x86`) is a name, and one that goes on through
  a dot and a digit (`i0.9.7`) a number: both stay too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LEXICON_FILE = "lexicon.txt"
MIN_SEEN = 5  # a letter reading is taken only when the documents wrote it at least this often

ZERO_IN_NUMBER = re.compile(r"(?<=\d)[oO](?=\d)|(?<=\d\.)[oO](?=\d)")
MIXED_WORD = re.compile(r"[^\W_]+")
CONFUSABLE = frozenset("01")


@dataclass(frozen=True)
class Lexicon:
    counts: dict[str, int]

    @classmethod
    def read(cls, path: str | Path) -> "Lexicon":
        counts = {}
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            word, _, count = line.partition("\t")
            counts[word] = int(count)
        return cls(counts)

    def write(self, path: str | Path) -> None:
        ranked = sorted(self.counts.items(), key=lambda item: -item[1])
        Path(path).write_text("".join(f"{word}\t{count}\n" for word, count in ranked), encoding="utf-8")

    def seen(self, word: str) -> int:
        return self.counts.get(word, 0)


def _letter_reading(word: str) -> str:
    capitals = [c for c in word if c.isalpha()]
    all_capitals = bool(capitals) and all(c.isupper() for c in capitals)
    letters = []
    for index, char in enumerate(word):
        if char == "1":
            letters.append("I" if all_capitals else "l")
        elif char == "0":
            letters.append("O" if all_capitals or index == 0 else "o")
        else:
            letters.append(char)
    return "".join(letters)


def _in_a_number(match: re.Match) -> bool:
    """The word goes on as a number through a dot: `i0.9.7`, `2.1o`."""
    text, start, end = match.string, match.start(), match.end()
    return (text[end:end + 1] == "." and text[end + 1:end + 2].isdigit()) or \
        (text[start - 1:start] == "." and text[start - 2:start - 1].isdigit())


def _fixed_word(match: re.Match, lexicon: Lexicon) -> str:
    word = match.group(0)
    digits = {c for c in word if c.isdigit()}
    if not digits or not digits <= CONFUSABLE or not any(c.isalpha() for c in word) or lexicon.seen(word) \
            or _in_a_number(match):
        return word
    reading = _letter_reading(word)
    seen = lexicon.seen(reading) + (lexicon.seen(reading.lower()) if reading != reading.lower() else 0)
    return reading if seen >= MIN_SEEN else word


def fix_glyphs(text: str, lexicon: Lexicon | None) -> str:
    """`text` with the confusions above set right (without a lexicon, the numbers only)."""
    text = ZERO_IN_NUMBER.sub("0", text)
    if lexicon is None:
        return text
    return MIXED_WORD.sub(lambda match: _fixed_word(match, lexicon), text)
