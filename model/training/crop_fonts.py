"""The fonts synthetic crops are drawn in (matplotlib's bundled fonts): each font's usable
characters and a size chosen so its average advance is about one token column (TOKEN_PX)
and a line about two token rows tall.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import matplotlib
from PIL import ImageFont

from gravityocr.model.training.curriculum import CHARSETS, TOKEN_PX

_OT1_FONTS = {"cmr10", "cmss10", "cmb10", "cmti10"}
_OT1_WRONG_GLYPHS = set("\"<>\\_{|}`'")  # these code points hold other glyphs in OT1 fonts


@dataclass(frozen=True)
class FontInfo:
    path: str
    charset: frozenset[str]
    size: int  # px, so the average advance is ~TOKEN_PX and a line ~2 token rows
    line_top: int  # offset that puts the tallest reference glyph at y=0
    line_height: int


def _font_dir() -> Path:
    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


_ADVANCE_SAMPLE = "The quick brown fox jumps over the lazy dog, 1234567890. Licence terms: (c) 2019 holders."
_HEIGHT_SAMPLE = "ÁÉÖbdfhklgjpqy()[]|"


@functools.cache
def font_info(stem: str) -> FontInfo:
    from fontTools.ttLib import TTFont  # a matplotlib dependency

    path = str(_font_dir() / f"{stem}.ttf")
    cmap = TTFont(path, lazy=True).getBestCmap()
    charset = frozenset(c for c in CHARSETS["full"] if ord(c) in cmap)
    if stem in _OT1_FONTS:
        charset -= _OT1_WRONG_GLYPHS
    probe = ImageFont.truetype(path, 100)
    advance = probe.getlength(_ADVANCE_SAMPLE) / len(_ADVANCE_SAMPLE) / 100
    core = probe.getbbox("Hgjy()")
    size = int(round(min(TOKEN_PX / advance, 58 / ((core[3] - core[1]) / 100))))
    font = ImageFont.truetype(path, size)
    top, bottom = font.getbbox(_HEIGHT_SAMPLE)[1::2]
    return FontInfo(path, charset, size, top, bottom - top)


def sized_font(stem: str) -> ImageFont.FreeTypeFont:
    return _truetype(font_info(stem).path, font_info(stem).size)


@functools.cache
def _truetype(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, size)


def bold_variant(stem: str) -> str:
    for candidate in (stem.split("-")[0] + "-Bold", {"STIXGeneral": "STIXGeneralBol"}.get(stem, "")):
        if candidate and (_font_dir() / f"{candidate}.ttf").exists():
            return candidate
    return stem
