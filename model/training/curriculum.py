"""What a synthetic crop may be: its kinds, its size limits and scale, the character sets, and
the curriculum's named stages of difficulty (`stage_by_name`).

Scale is chosen for the model, not for looks: one visual token covers 28x28 px, and the
small model learns to read along a line only when one character's advance is about one
token column (see docs/training-the-small-model.md). So text is rendered with an
average advance of ~28 px and a line about two token rows (56 px) tall.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gravityocr.model.network.tokenizer import character_vocabulary

KINDS = ("text", "table", "formula")

TOKEN_PX = 28  # one visual token: 14-px patches merged 2x2
MAX_WIDTH = 1200
MAX_HEIGHT = 400

VOCABULARY = frozenset(character_vocabulary()) | {"\n"}
ASCII_PRINTABLE = frozenset(chr(c) for c in range(32, 127))
ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ")
CHARSETS = {"alnum": ALNUM, "ascii": ASCII_PRINTABLE, "full": VOCABULARY - {"\n"}}


@dataclass(frozen=True)
class CurriculumStage:
    """How hard the crops of one training stage are. Fonts are file stems of matplotlib's fonts."""

    name: str
    min_chars: int = 2
    max_chars: int = 5
    max_lines: int = 1  # 1: single lines; >1: short paragraphs joined by "\n"
    fonts: tuple[str, ...] = ("DejaVuSansMono",)
    charset: str = "alnum"  # "alnum" | "ascii" | "full" (the whole vocabulary)
    noise: float = 0.0  # 0..1: scanner-like degradation
    table_max_rows: int = 4
    table_max_cols: int = 4
    merged_cells: bool = False
    formula_complexity: int = 0  # 0..3
    formula_fonts: tuple[str, ...] = ("dejavusans", "cm", "stix", "dejavuserif", "stixsans")
    type_weights: dict[str, float] = field(default_factory=lambda: {"text": 1.0})


_MONO = ("DejaVuSansMono",)
_REGULAR = ("DejaVuSansMono", "DejaVuSans", "DejaVuSerif", "cmtt10")
_ALL_FONTS = (
    "DejaVuSansMono", "DejaVuSansMono-Bold", "DejaVuSans", "DejaVuSans-Bold", "DejaVuSans-Oblique",
    "DejaVuSerif", "DejaVuSerif-Bold", "DejaVuSerif-Italic", "STIXGeneral", "STIXGeneralItalic",
    "STIXGeneralBol", "cmr10", "cmtt10", "cmss10",
)

CURRICULUM: list[CurriculumStage] = [
    CurriculumStage("mono-2-5", 2, 5),
    CurriculumStage("mono-3-11", 3, 11),
    CurriculumStage("mono-3-11-punct", 3, 11, charset="ascii"),
    CurriculumStage("fonts-3-11", 3, 11, fonts=_REGULAR, charset="ascii", noise=0.05),
    CurriculumStage("fonts-8-20", 8, 20, fonts=_REGULAR, charset="ascii", noise=0.1),
    CurriculumStage("fonts-20-40", 20, 40, fonts=_ALL_FONTS, charset="full", noise=0.2),
    CurriculumStage("paragraphs", 20, 40, max_lines=3, fonts=_ALL_FONTS, charset="full", noise=0.25),
    CurriculumStage(
        "tables-formulas-intro", 20, 40, max_lines=3, fonts=_ALL_FONTS, charset="full", noise=0.25,
        table_max_rows=2, table_max_cols=3, formula_complexity=1,
        type_weights={"text": 0.6, "table": 0.2, "formula": 0.2},
    ),
    CurriculumStage(
        "tables-formulas", 20, 40, max_lines=4, fonts=_ALL_FONTS, charset="full", noise=0.35,
        table_max_rows=3, table_max_cols=4, formula_complexity=2,
        type_weights={"text": 0.5, "table": 0.25, "formula": 0.25},
    ),
    CurriculumStage(
        "hard", 20, 40, max_lines=4, fonts=_ALL_FONTS, charset="full", noise=0.5,
        table_max_rows=4, table_max_cols=4, merged_cells=True, formula_complexity=3,
        type_weights={"text": 0.5, "table": 0.25, "formula": 0.25},
    ),
]


def stage_by_name(name: str) -> CurriculumStage:
    for stage in CURRICULUM:
        if stage.name == name:
            return stage
    raise KeyError(f"no curriculum stage {name!r}; stages: {[s.name for s in CURRICULUM]}")
