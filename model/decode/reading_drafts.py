"""Drafts read off the reading prefix (strip models whose config has `reading_prefix`).

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
"""

from __future__ import annotations

LOOKUP_LENGTHS = (4, 3, 2, 1)
# Contents whose output is the reading's text. A table's HTML and a formula's LaTeX are not:
# their drafts from the reading are mostly rejected, and their rows take AR steps instead
# (`gravityocr bench decode`, docs/decoding.md).
DRAFTED_TASKS = ("text",)


def reading_with_eos(reading: list[int], eos_ids: frozenset[int]) -> list[int]:
    """The reading as drafts see it: followed by the eos where the model has a single one."""
    return reading + sorted(eos_ids)[:1] if len(eos_ids) == 1 else list(reading)


def reading_drafts(committed: list[int], reading: list[int], count: int) -> list[int]:
    """Up to `count` drafts for the tokens after `committed`, from `reading`: what follows
    the committed text's place in the reading (position k when the reading agrees with the
    last committed token there, else the nearest occurrence of its last tokens); none
    where the reading has no such place."""
    k = len(committed)
    if k == 0:
        return reading[:count]
    if k <= len(reading) and reading[k - 1] == committed[-1]:
        return reading[k:k + count]
    for n in LOOKUP_LENGTHS:
        if k < n:
            continue
        tail, best = committed[-n:], None
        for start in range(len(reading) - n + 1):
            if reading[start:start + n] == tail and (best is None or abs(start + n - k) < abs(best + n - k)):
                best = start
        if best is not None:
            return reading[best + n:best + n + count]
    return []
