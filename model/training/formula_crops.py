"""Formula crops: a random formula in canonical LaTeX, its constructs bounded by the stage's
complexity, rendered with matplotlib's mathtext as an ink mask within the crop limits; the
target is the LaTeX.
"""

from __future__ import annotations

import random
import re

import numpy as np
from matplotlib.font_manager import FontProperties
from matplotlib.mathtext import MathTextParser
from PIL import Image

from gravityocr.model.evaluation.scores import canonicalize_latex
from gravityocr.model.training.curriculum import MAX_HEIGHT, MAX_WIDTH, CurriculumStage

_VARIABLES = list("xyzabcnkmtpqrs")
_INDICES = list("ijkn") + ["0", "1", "2"]
_GREEK = [r"\alpha", r"\beta", r"\gamma", r"\delta", r"\theta", r"\lambda", r"\mu", r"\pi", r"\sigma",
          r"\omega", r"\phi", r"\epsilon", r"\Delta", r"\Omega", r"\Sigma"]
_RELATIONS = ["=", "=", "=", r"\leq", r"\geq", r"\neq", r"\approx", "<", ">"]
_UPPER_LIMITS = ["1", "n", "N", "T", r"\infty"]
_FUNCTIONS = ["f", "g", "h", r"\sin", r"\cos", r"\log", r"\exp"]
_OPERATORS = ["+", "-", "+", "-", r"\cdot", r"\times", r"\pm"]


def _symbol(rng: random.Random, complexity: int) -> str:
    if complexity >= 1 and rng.random() < 0.3:
        return rng.choice(_GREEK)
    return rng.choice(_VARIABLES)


def _term(rng: random.Random, complexity: int, depth: int = 0) -> str:
    """One summand; `complexity` bounds which constructs may appear, `depth` bounds nesting."""
    choices = ["symbol", "power", "subscript", "coefficient"]
    if complexity >= 1:
        choices += ["frac", "subsup", "function"]
    if complexity >= 2 and depth < 1:
        choices += ["sqrt", "sum", "integral", "paren"]
    if complexity >= 3 and depth < 2:
        choices += ["nested_frac", "root_n", "limit", "prod"]
    kind = rng.choice(choices)
    s = _symbol(rng, complexity)
    if kind == "symbol":
        return s
    if kind == "power":
        return f"{s}^{{{rng.choice(['2', '3', 'n', '-1', 'k'])}}}"
    if kind == "subscript":
        return f"{s}_{{{rng.choice(_INDICES)}}}"
    if kind == "coefficient":
        return f"{rng.randint(2, 99)}{s}"
    if kind == "frac":
        return rf"\frac{{{_small(rng, complexity)}}}{{{_small(rng, complexity)}}}"
    if kind == "subsup":
        return f"{s}_{{{rng.choice(_INDICES)}}}^{{{rng.choice(['2', '3', 'n'])}}}"
    if kind == "function":
        return f"{rng.choice(_FUNCTIONS)}({s})"
    inner = _expression(rng, complexity, depth + 1, max_terms=2)
    if kind == "sqrt":
        return rf"\sqrt{{{inner}}}"
    if kind == "sum":
        i = rng.choice("ijk")
        upper = rng.choice(_UPPER_LIMITS)
        return rf"\sum_{{{i}={rng.randint(0, 1)}}}^{{{upper}}}{_symbol(rng, 0)}_{{{i}}}"
    if kind == "integral":
        t = rng.choice("xt")
        upper = rng.choice(_UPPER_LIMITS)
        return rf"\int_{{{rng.randint(0, 1)}}}^{{{upper}}}f({t})d{t}"
    if kind == "paren":
        return f"({inner})^{{{rng.choice(['2', 'n'])}}}"
    if kind == "nested_frac":
        return rf"\frac{{{inner}}}{{{_term(rng, complexity, depth + 1)}}}"
    if kind == "root_n":
        return rf"\sqrt[{rng.choice(['3', 'n'])}]{{{inner}}}"
    if kind == "limit":
        return rf"\lim_{{n\to\infty}}{_term(rng, 1, depth + 1)}"
    return rf"\prod_{{k=1}}^{{n}}{_symbol(rng, 0)}_{{k}}"


def _small(rng: random.Random, complexity: int) -> str:
    return rng.choice([str(rng.randint(1, 9)), _symbol(rng, complexity), f"{_symbol(rng, 0)}+{rng.randint(1, 9)}"])


def _concat(*parts: str) -> str:
    """Join LaTeX pieces, with a space where a command name would otherwise run into a letter."""
    out = ""
    for part in parts:
        out += " " + part if re.search(r"\\[a-zA-Z]+$", out) and part[:1].isalpha() else part
    return out


def _expression(rng: random.Random, complexity: int, depth: int = 0, max_terms: int = 3) -> str:
    terms = [_term(rng, complexity, depth) for _ in range(rng.randint(1, max_terms))]
    out = terms[0]
    for term in terms[1:]:
        out = _concat(out, rng.choice(_OPERATORS), term)
    return out


def sample_formula(rng: random.Random, complexity: int) -> str:
    """A random formula in canonical LaTeX (canonicalize_latex leaves it unchanged)."""
    body = _expression(rng, complexity)
    if rng.random() < 0.6:
        body = _concat(_expression(rng, complexity, max_terms=2), rng.choice(_RELATIONS), body)
    return canonicalize_latex(body)


_MATH_PARSER = MathTextParser("agg")


def render_formula_mask(rng: random.Random, stage: CurriculumStage) -> tuple[Image.Image, str]:
    size = rng.randint(44, 56)
    fontset = rng.choice(stage.formula_fonts)
    margin = rng.randint(3, 10)
    for attempt in range(20):
        latex = sample_formula(rng, max(0, stage.formula_complexity - attempt // 10))
        parsed = _MATH_PARSER.parse(f"${latex}$", dpi=72, prop=FontProperties(size=size, math_fontfamily=fontset))
        ink = np.asarray(parsed.image, dtype=np.uint8)
        if ink.shape[1] + 2 * margin <= MAX_WIDTH and ink.shape[0] + 2 * margin <= MAX_HEIGHT:
            break
    mask = Image.new("L", (ink.shape[1] + 2 * margin, ink.shape[0] + 2 * margin), 0)
    mask.paste(Image.fromarray(ink), (margin, margin))
    return mask, latex
