"""The text a finished decode of a crop stands for, the same wherever a crop is read (the
recogniser's front door, the evaluation): a loop cut by the stopping rule shown once
(model/decode/stopping.py), and a text crop's digits and letters read for each other set right
(model/network/glyph_fixes.py). The tokens are not changed: exactness is about them."""

from __future__ import annotations

from gravityocr.model.decode.stopping import without_loop
from gravityocr.model.network.glyph_fixes import Lexicon, fix_glyphs


def crop_text(processor, lexicon: Lexicon | None, token_ids: list[int], finish_reason: str, task: str) -> str:
    if finish_reason == "repetition":
        token_ids = without_loop(token_ids)
    text = processor.decode(token_ids)
    return fix_glyphs(text, lexicon) if task == "text" else text
