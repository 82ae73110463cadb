"""Drafts kept to the structure of what is being written, whatever the structure.

A shape (`TableShape` in model/table_drafts.py, `CommandShape` in model/formula_drafts.py)
is fed the committed tokens one at a time and offers `copy()`, `feed(token)` and
`repair(drafts, alternates, confident, keep_shapes)`. Decoders call it on drafts before
they are verified: output is unchanged, drafts only choose what is verified.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RepairedDrafts:
    drafts: list[int]
    alternates: list[int]  # second choice per draft (a branch's first token)
    confident: list[bool]
    shapes: list | None  # the shape after each draft (kept on request); None: drafts unchanged


def kept_to_structure(shape, drafts: list[int]) -> list[int]:
    """Drafts after the tokens `shape` has been fed, kept to its structure (as they are
    where no shape is kept)."""
    if shape is None:
        return drafts
    return shape.repair(drafts, drafts, [True] * len(drafts)).drafts


def branch_tails(shape, repaired: RepairedDrafts, depths: list[int], block: int) -> list[list[int]]:
    """For each branch at draft `depth` (its first token the second choice there): the
    drafts after it, kept to the structure that follows that second choice (at most
    block - 1). `repaired` must keep its shapes."""
    tails = []
    for depth in depths:
        before = repaired.shapes[depth - 2] if depth > 1 else shape
        branch_shape = before.copy()
        branch_shape.feed(repaired.alternates[depth - 1])
        rest = repaired.drafts[depth:depth - 1 + block]
        tails.append(branch_shape.repair(rest, rest, [True] * len(rest)).drafts)
    return tails
