"""Text crops: a line or a short paragraph of sampled text, drawn as an ink mask in one of the
stage's fonts; the target is the text drawn, lines joined by "\n".
"""

from __future__ import annotations

import random

from PIL import Image, ImageDraw, ImageFont

from gravityocr.model.training.crop_fonts import font_info, sized_font
from gravityocr.model.training.curriculum import CHARSETS, MAX_WIDTH, CurriculumStage
from gravityocr.model.training.text_sources import sample_paragraph


def _fit_width(font: ImageFont.FreeTypeFont, text: str, max_px: int, min_chars: int) -> str:
    while len(text) > min_chars and font.getlength(text) > max_px:
        text = text[:-1].rstrip()
    return text


def render_text_mask(rng: random.Random, stage: CurriculumStage) -> tuple[Image.Image, str]:
    stem = rng.choice(stage.fonts)
    info = font_info(stem)
    allowed = CHARSETS[stage.charset] & info.charset
    font = sized_font(stem)
    margin = rng.randint(2, 8)
    lines = [_fit_width(font, line, MAX_WIDTH - 2 * margin - 4, 1) for line in sample_paragraph(rng, stage, allowed)]
    leading = rng.randint(0, 6) if len(lines) > 1 else 0
    pitch = info.line_height + leading
    width = int(max(font.getlength(line) for line in lines)) + 2 * margin
    height = pitch * len(lines) - leading + 2 * margin
    mask = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(mask)
    for i, line in enumerate(lines):
        draw.text((margin, margin + i * pitch - info.line_top), line, font=font, fill=255)
    return mask, "\n".join(lines)
