"""Formula images: a formula typeset by pdflatex in one of the math font styles of `MATH_STYLES`,
or drawn by matplotlib's mathtext in a font set, each cropped to its ink plus a white margin.

pdflatex sets many formulas one page each per LaTeX run, as the document wrote them (`\\left`,
`\\frac12` and all); a formula that does not compile cleanly gives no image.
`available_math_styles` tells which styles this machine's TeX installation has.
"""

from __future__ import annotations

import io
import re
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pypdfium2 as pdfium
from PIL import Image, ImageOps

from gravityocr.corpus.formula_extraction import FormulaConfig


# pdflatex math font styles: name -> preamble. "cm" is LaTeX's own
# Computer Modern, what the evaluation sets are rendered with; newtxmath brings amssymb's symbols
# itself and refuses to load after it.
_AMS = r"\usepackage{amsmath,amssymb}"
MATH_STYLES = {
    "cm": _AMS,
    "lmodern": _AMS + r"\usepackage{lmodern}",
    "times": r"\usepackage{amsmath}\usepackage{newtxtext,newtxmath}",
    "palatino": _AMS + r"\usepackage{mathpazo}",
    "libertine": r"\usepackage{amsmath}\usepackage{libertine}\usepackage[libertine]{newtxmath}",
    "euler": _AMS + r"\usepackage{eulervm}",
    "fourier": _AMS + r"\usepackage{fourier}",
    "kpfonts": _AMS + r"\usepackage{kpfonts}",
    "cmbright": _AMS + r"\usepackage{cmbright}",
    "mathptmx": _AMS + r"\usepackage{mathptmx}",
}

_PAGE_MARK = "GRAVITYFORMULA"


def available_math_styles() -> tuple[str, ...]:
    """The MATH_STYLES this machine's TeX installation typesets: a formula compiles in them (a
    style's package may need others that are missing, which only a run tells)."""
    return tuple(name for name in MATH_STYLES
                 if _compile([(r"\frac{a}{b}+\mathbb{R}", True)], FormulaConfig(), name)[0] is not None)


def render_pdflatex(formulas: Sequence[str], dpis: Sequence[int],
                    config: FormulaConfig = FormulaConfig(), styles: Sequence[str] | None = None,
                    displays: Sequence[bool] | None = None) -> list[Image.Image | None]:
    """Each formula typeset by pdflatex (article, amsmath, amssymb, its math style of MATH_STYLES;
    display style, or text style where `displays` says False) and cropped to its ink plus the
    margin; None where it does not compile cleanly. All formulas of a style go through as few
    LaTeX runs as possible: one run for the batch, a second without the formulas the log blames,
    and halves of the batch only when a run still fails."""
    styles = list(styles) if styles is not None else ["cm"] * len(formulas)
    displays = list(displays) if displays is not None else [True] * len(formulas)
    pages: list = [None] * len(formulas)
    for style in dict.fromkeys(styles):
        indices = [i for i, s in enumerate(styles) if s == style]
        compiled = _compile_all([(formulas[i], displays[i]) for i in indices], config, style)
        for i, page in zip(indices, compiled):
            pages[i] = page
    return [None if page is None else _crop(page(dpi), dpi, config) for page, dpi in zip(pages, dpis)]


def _compile_all(formulas: list[tuple[str, bool]], config: FormulaConfig, style: str) -> list:
    """Per (formula, display?), a function dpi -> rendered PIL page region, or None where it does
    not compile."""
    if not formulas:
        return []
    pages, blamed = _compile(formulas, config, style)
    if pages is not None:
        return pages
    if len(formulas) == 1:
        return [None]
    if blamed and len(blamed) < len(formulas):
        kept = [i for i in range(len(formulas)) if i not in blamed]
        retry, _ = _compile([formulas[i] for i in kept], config, style)
        if retry is not None:
            out = [None] * len(formulas)
            for i, page in zip(kept, retry):
                out[i] = page
            return out
    middle = len(formulas) // 2
    return _compile_all(formulas[:middle], config, style) + _compile_all(formulas[middle:], config, style)


def _compile(formulas: list[tuple[str, bool]], config: FormulaConfig, style: str) -> tuple[list | None, set[int]]:
    """(page renderers, blamed) for one LaTeX run: page renderers only when the run was clean and gave
    one page per formula, else None and the indices of the formulas the log reports errors in."""
    body = "".join(f"\\typeout{{{_PAGE_MARK}{i}}}\n" + (f"\\[ {formula} \\]" if display else f"${formula}$")
                   + "\n\\clearpage\n" for i, (formula, display) in enumerate(formulas))
    document = (f"\\documentclass[{config.latex_points}pt]{{article}}\n{MATH_STYLES[style]}\n"
                "\\usepackage[paperwidth=100cm,paperheight=40cm,margin=2cm]{geometry}\n"
                "\\pagestyle{empty}\\setlength{\\parindent}{0pt}\\tracinglostchars=3\n"
                f"\\begin{{document}}\n{body}\\end{{document}}\n")
    with tempfile.TemporaryDirectory(prefix="formulas-") as tmp:
        tex = Path(tmp) / "f.tex"
        tex.write_text(document, encoding="utf-8")
        try:
            subprocess.run(["pdflatex", "-interaction=nonstopmode", "-no-shell-escape", tex.name],
                           cwd=tmp, capture_output=True, timeout=config.latex_timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return None, set()
        log = (Path(tmp) / "f.log").read_text(encoding="latin-1") if (Path(tmp) / "f.log").exists() else ""
        blamed, current = set(), None
        for line in log.splitlines():
            if line.startswith(_PAGE_MARK):
                current = int(line[len(_PAGE_MARK):].strip() or -1)
            elif line.startswith("!") and current is not None:
                blamed.add(current)
        pdf_path = Path(tmp) / "f.pdf"
        if blamed or "Emergency stop" in log or not pdf_path.exists():
            return None, blamed
        pdf = pdfium.PdfDocument(pdf_path.read_bytes())
        if len(pdf) != len(formulas):
            return None, blamed
        return [_page_renderer(pdf, i) for i in range(len(pdf))], set()


def _page_renderer(pdf, index: int):
    """dpi -> the page region holding all its objects, or None when the page is blank or its ink
    touches the paper's edge (a formula too large for the page)."""
    page = pdf[index]
    width, height = page.get_size()
    # get_bounds in pypdfium2 5, get_pos in 4
    boxes = [(obj.get_bounds if hasattr(obj, "get_bounds") else obj.get_pos)() for obj in page.get_objects()]
    if not boxes:
        return lambda dpi: None
    left = min(b[0] for b in boxes) - 2
    bottom = min(b[1] for b in boxes) - 2
    right = max(b[2] for b in boxes) + 2
    top = max(b[3] for b in boxes) + 2
    if left <= 0 or bottom <= 0 or right >= width or top >= height:
        return lambda dpi: None
    crop = (left, bottom, width - right, height - top)
    return lambda dpi: page.render(scale=dpi / 72, crop=crop).to_pil().convert("RGB")


def render_mathtext(formula: str, fontset: str, points: int, dpi: int,
                    config: FormulaConfig = FormulaConfig()) -> Image.Image | None:
    """The formula drawn by matplotlib's mathtext in `fontset`, cropped to its ink plus the margin;
    None where mathtext cannot parse it. The style commands mathtext lacks (\\displaystyle,
    \\textstyle, \\limits) are left out of the drawing: they change sizes and the placement of
    limits, not which symbols the formula shows."""
    from matplotlib import mathtext
    from matplotlib.font_manager import FontProperties

    drawn = re.sub(r"\\(?:displaystyle|textstyle|limits)(?![a-zA-Z])", " ", formula)
    buffer = io.BytesIO()
    try:
        mathtext.math_to_image(f"${drawn}$", buffer, dpi=dpi, format="png",
                               prop=FontProperties(size=points, math_fontfamily=fontset))
    except (ValueError, RuntimeError, KeyError, IndexError):
        return None
    image = Image.open(buffer)
    image.load()
    white = Image.new("RGBA", image.size, (255, 255, 255, 255))
    return _crop(Image.alpha_composite(white, image.convert("RGBA")).convert("RGB"), dpi, config)


def _crop(image: Image.Image | None, dpi: int, config: FormulaConfig) -> Image.Image | None:
    """The image cut to its ink (pixels visibly darker than white) with a white margin of
    `config.margin_points` at `dpi`; None when there is no ink."""
    if image is None:
        return None
    ink = ImageOps.invert(image.convert("L")).point(lambda v: 255 if v > 24 else 0).getbbox()
    if ink is None:
        return None
    margin = max(2, round(config.margin_points * dpi / 72))
    cut = image.crop(ink)
    out = Image.new("RGB", (cut.width + 2 * margin, cut.height + 2 * margin), "white")
    out.paste(cut, (margin, margin))
    return out
