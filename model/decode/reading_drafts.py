"""The place in the reading prefix a decoder's text has reached (strip models whose config
has `reading_prefix`), and what is read from there: drafts and the copy token.

The vision tower's CTC classifier reads each crop before the decoder writes a token
(model/network/strip_vision.py); on most lines the decoder writes what it reads. So a
round can verify the reading's next characters instead of running a draft pass: one pass
a round instead of two, and a line the decoder reads as the classifier does is accepted
in long runs (the reading ends with the eos, so the line can end in the same round).

Where the decoder's text has drifted from the reading (a corrected character, an
insertion), the place to continue from is found as prompt-lookup decoding finds it: the
longest of the last 4..1 committed tokens that occurs in the reading, nearest to the
decoder's position. Drafts are only proposals: the verify pass accepts those equal to the
greedy token, so the output is greedy AR decoding whatever the reading says.

The same place gives a model with `reading_copy` its copy token: the reading's token at
that place is added to the input of the position that predicts the next token
(GravityOcrForConditionalGeneration.embed). It is a function of the tokens before it and
of the reading alone, computed the same way in training, in the reference decoder and in
every engine pass that commits tokens, so greedy decoding stays one function.
"""

from __future__ import annotations

from bisect import bisect_left

LOOKUP_LENGTHS = (4, 3, 2, 1)
NO_COPY = -1  # a position without a copy token (no place in the reading, or past its end)
# Contents whose output is the reading's text: they draft from the reading. A table's HTML
# and a formula's LaTeX are not (their drafts from the reading are mostly rejected): they
# take AR steps (model/engine/rounds.py `drafts_from_reading`, docs/decoding.md).
DRAFTED_TASKS = ("text",)


def reading_with_eos(reading: list[int], eos_ids: frozenset[int]) -> list[int]:
    """The reading as drafts see it: followed by the eos where the model has a single one."""
    return reading + sorted(eos_ids)[:1] if len(eos_ids) == 1 else list(reading)


class ReadingIndex:
    """A reading and, per lookup length, where each of its n-grams starts: finding a place
    after a drift costs a dictionary lookup and a bisection, not a scan of the reading."""

    def __init__(self, reading: list[int]):
        self.tokens = list(reading)
        self._starts: dict[int, dict[tuple[int, ...], list[int]]] = {}
        for n in LOOKUP_LENGTHS:
            starts: dict[tuple[int, ...], list[int]] = {}
            for start in range(len(self.tokens) - n + 1):
                starts.setdefault(tuple(self.tokens[start:start + n]), []).append(start)
            self._starts[n] = starts

    def place(self, committed: list[int]) -> int | None:
        """Index in the reading of the token after `committed`: position k when the reading
        agrees with the last committed token there, else just after the occurrence of the
        longest of the last 4..1 committed tokens nearest to k (the earlier one of two as
        near); None where the reading has no such place."""
        return self._place(committed, len(committed))

    def _place(self, tokens: list[int], k: int) -> int | None:
        """`place(tokens[:k])` without copying the tokens."""
        if k == 0:
            return 0
        if k <= len(self.tokens) and self.tokens[k - 1] == tokens[k - 1]:
            return k
        for n in LOOKUP_LENGTHS:
            if k < n:
                continue
            starts = self._starts[n].get(tuple(tokens[k - n:k]))
            if not starts:
                continue
            # the start s nearest to k - n; on a tie the earlier one
            i = bisect_left(starts, k - n)
            candidates = starts[max(0, i - 1):i + 1]
            best = min(candidates, key=lambda s: (abs(s + n - k), s))
            return best + n
        return None

    def drafts(self, committed: list[int], count: int) -> list[int]:
        """Up to `count` tokens of the reading from `committed`'s place (none without one)."""
        place = self.place(committed)
        return [] if place is None else self.tokens[place:place + count]

    def copy_token(self, committed: list[int]) -> int:
        """The reading's token at `committed`'s place, or NO_COPY."""
        return self._copy(committed, len(committed))

    def copy_tokens(self, tokens: list[int], first: int = 0) -> list[int]:
        """`copy_token(tokens[:j])` for j = first..len(tokens): the copy tokens of the
        positions that predict token j."""
        return [self._copy(tokens, j) for j in range(first, len(tokens) + 1)]

    def copy_row(self, text: list[int], first: int, width: int) -> list[int]:
        """Copy tokens of a pass's `width` inputs of which input i predicts token `first + i`
        of `text` (the inputs are `text[first - 1:]`); NO_COPY past `text` (masks)."""
        known = self.copy_tokens(text[:first + width - 1], first)[:width]
        return known + [NO_COPY] * (width - len(known))

    def _copy(self, tokens: list[int], k: int) -> int:
        place = self._place(tokens, k)
        return self.tokens[place] if place is not None and place < len(self.tokens) else NO_COPY
