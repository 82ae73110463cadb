"""When a decoded sequence stops: at eos, at its token budget, or in a repetition loop.

One rule for every decoder (the reference decoders in `reference.py` and the engine's
sequences): each commits token by token and asks `stop_reason` before every token, so
speculative and greedy AR decoding stop at the same token and exactness holds with the
loop cut as well.

A loop: the tail repeats a unit of p ≤ 16 tokens holding at least 3 distinct tokens over
at least max(24, 3p) tokens ("or an or an or an …", "its its its …"). Units of one or two
distinct tokens are dot leaders, rules and spaced dots that real lines hold, so they are
never cut; table outputs repeat empty cells legitimately and are not checked (their
budget bounds them).
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_LOOP_SPAN = 24
MAX_LOOP_UNIT = 16
MIN_UNIT_DISTINCT = 3
LOOP_TASKS = frozenset({"text", "formula"})


def loop_unit(tokens: Sequence[int]) -> int:
    """Length of the unit the tail of `tokens` loops on (module docstring), 0 if none."""
    n = len(tokens)
    for unit in range(MIN_UNIT_DISTINCT, MAX_LOOP_UNIT + 1):
        span = max(MIN_LOOP_SPAN, 3 * unit)
        if span > n:
            break
        start = n - span
        # newest tokens first: a sequence that is not looping fails on its last token, and
        # this runs before every committed token
        if all(tokens[i] == tokens[i - unit] for i in range(n - 1, start + unit - 1, -1)) \
                and len(set(tokens[start:start + unit])) >= MIN_UNIT_DISTINCT:
            return unit
    return 0


def stop_reason(tokens: Sequence[int], eos_ids, max_new_tokens: int, task: str) -> str | None:
    """"eos", "repetition", "length" or None (not finished)."""
    if tokens and tokens[-1] in eos_ids:
        return "eos"
    if task in LOOP_TASKS and len(tokens) >= MIN_LOOP_SPAN and loop_unit(tokens):
        return "repetition"
    if len(tokens) >= max_new_tokens:
        return "length"
    return None


def without_loop(tokens: Sequence[int]) -> list[int]:
    """`tokens` with a looping tail kept to its first unit (the text a reader is shown)."""
    unit = loop_unit(tokens)
    if not unit:
        return list(tokens)
    start = len(tokens) - unit
    while start - unit >= 0 and tokens[start - unit:start] == tokens[start:start + unit]:
        start -= unit
    return list(tokens[:start + unit])
