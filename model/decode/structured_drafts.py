"""Drafts kept to the structure of what is being written, whatever the structure.

A shape (`CommandShape` in model/decode/formula_drafts.py: LaTeX's command names in a formula)
is fed the committed tokens one at a time and offers `copy()`, `feed(token)` and
`repair(drafts)`. Decoders call it on drafts before they are verified: output is
unchanged, drafts only choose what is verified.
"""

from __future__ import annotations


def kept_to_structure(shape, drafts: list[int]) -> list[int]:
    """Drafts after the tokens `shape` has been fed, kept to its structure (as they are
    where no shape is kept)."""
    if shape is None:
        return drafts
    return shape.repair(drafts)
