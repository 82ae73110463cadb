"""Display formulas from LaTeX sources: extraction filters, canonical targets, and real rendering
with pdflatex and matplotlib's mathtext (no mocks)."""

from __future__ import annotations

import gzip
import shutil

import pytest

from gravityocr.corpus.debian import ReservedPackage, UnpackedPackage
from gravityocr.corpus.formula_extraction import (
    FormulaConfig,
    extract_display_math,
    find_display_formulas,
    usable_target,
)
from gravityocr.corpus.formula_rendering import render_pdflatex
from gravityocr.corpus.formulas import formula_items, package_formulas
from gravityocr.model.evaluation.scores import canonicalize_latex

needs_pdflatex = pytest.mark.skipif(shutil.which("pdflatex") is None,
                                    reason="pdflatex is not installed (Debian: texlive-latex-base)")

SOURCE = r"""\documentclass{article}
\usepackage{amsmath}
\newcommand{\R}{\mathbb{R}}
\begin{document}
Inline math $a+b$ and $$ stays out. % a comment: \[ c + d \]
\[ x^2 + y^2 = z^2 \label{eq:pythagoras} \]
$$\frac12 + \alpha$$
\begin{equation}
  f \colon \R \to \R
\end{equation}
\verb|\[ v + w \]|
\begin{align}
  a &= b + c \\
  d &\le e \nonumber \\[2pt]
  \begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix} &= M \tag{3} &
  n &= m
\end{align}
\begin{gather*} u = v \\ \mysterymacro{w} \end{gather*}
\begin{displaymath} \int_0^1 \mathrm{d}x \end{displaymath}
\[ x^{2}+y^{2}=z^{2} \]
\[ """ + " + ".join(f"x_{{{i}}}" for i in range(40)) + r""" \]
\end{document}
"""


def test_extraction_finds_exactly_the_usable_display_formulas():
    assert extract_display_math(SOURCE) == [
        "x^2 + y^2 = z^2",
        r"\frac12 + \alpha",
        "a = b + c",
        r"d \le e",
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix} = M",  # nested & and \\ are kept
        "n = m",  # the second equation of the row, split at the even &
        "u = v",
        r"\int_0^1 \mathrm{d}x",
    ]
    # Not kept: inline math, comments, \verb, \R (defined by the document), \mysterymacro (not
    # standard), the repeated x^{2}+y^{2}=z^{2} (same target), the 40-term sum (too long).


def test_formulas_carry_the_line_they_start_on():
    lines = {formula.latex: formula.line for formula in find_display_formulas(SOURCE)}
    assert lines["x^2 + y^2 = z^2"] == 6
    assert lines["a = b + c"] == 13
    assert lines["n = m"] == 16
    assert lines["u = v"] == 18


def test_target_is_the_evaluators_canonical_latex():
    [formula] = find_display_formulas(r"\[ \left( \frac12 \right)^2 \le \sqrt x \]")
    assert formula.target == r"(\frac{1}{2})^{2}\leq\sqrt{x}"
    assert formula.target == canonicalize_latex(formula.latex)
    for formula in find_display_formulas(SOURCE):
        assert canonicalize_latex(formula.target) == formula.target


def test_filters_vocabulary_length_and_commands():
    assert usable_target(r"x \in \mathbb{R}") == r"x\in\mathbb{R}"
    assert usable_target("x = \u03b1") is None  # a character outside the recogniser's vocabulary
    assert usable_target(r"\vec{x}", defined={"vec"}) is None  # redefined by the document
    assert usable_target(r"\begin{tabular}{c} x \end{tabular}") is None  # not a math environment
    assert usable_target(r"\frac{a}{b") is None  # unbalanced
    assert usable_target("a+" * 80 + "a") is None
    assert usable_target("a+" * 80 + "a", config=FormulaConfig(max_chars=200)) is not None


TINY = r"""\documentclass{article}
\begin{document}
\[ E = mc^2 \]
\begin{align*}
  \sum_{k=1}^{n} k &= \frac{n(n+1)}{2} \\
  x^1^2 &= y
\end{align*}
\end{document}
"""


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-doc")
    docs = root / "usr/share/doc/tiny-doc"
    docs.mkdir(parents=True)
    (docs / "a.tex").write_text(TINY)
    (docs / "b.tex.gz").write_bytes(gzip.compress(rb"\[ \int_0^1 x\,dx = \tfrac{1}{2} \] \[ E = mc^2 \]"))
    return UnpackedPackage("tiny-doc", root, "MIT")


@needs_pdflatex
def test_rendering_gives_plausible_images_with_both_renderers(tiny_package):
    items = list(formula_items(tiny_package, seed=7))
    targets = [item.text for item in items]
    # x^1^2 (a double superscript) does not compile, so it is dropped for mathtext too; the
    # second E = mc^2 (in b.tex.gz) is a duplicate.
    assert sorted(set(targets)) == sorted([
        "E=mc^{2}", r"\sum_{k=1}^{n}k=\frac{n(n+1)}{2}", r"\int_{0}^{1}x\,dx=\frac{1}{2}"])
    renderers = {item.source.renderer for item in items}
    assert "pdflatex" in renderers and any(r.startswith("mathtext-") for r in renderers)
    assert targets.count("E=mc^{2}") == 2  # one image per renderer
    for item in items:
        assert item.type == "formula" and item.image.mode == "RGB"
        dpi = item.extra["dpi"]
        assert 100 <= dpi <= 300
        width, height = item.image.size
        # at 100-300 dpi a short 10-14 pt formula is a few tens to a few hundred pixels wide
        assert 0.1 * dpi < width < 3.0 * dpi and 0.05 * dpi < height < 1.0 * dpi, (item.text, item.image.size)
        assert width > height
        assert item.image.getextrema()[0][0] < 64  # there is ink
        assert item.source.package == "tiny-doc" and item.source.licence == "MIT"
    first = items[0]
    assert first.source.file == "usr/share/doc/tiny-doc/a.tex" and first.source.locator == "line3"
    assert items[-1].source.file == "usr/share/doc/tiny-doc/b.tex.gz"


@needs_pdflatex
def test_same_seed_gives_identical_items(tiny_package):
    def snapshot(seed):
        return [(item.text, item.source, item.extra, item.image.size, item.image.tobytes())
                for item in formula_items(tiny_package, seed=seed)]

    first = snapshot(3)
    assert snapshot(3) == first
    assert snapshot(4) != first


@needs_pdflatex
def test_limit_and_renderer_choice(tiny_package):
    assert len(list(formula_items(tiny_package, seed=1, limit=2))) == 2
    only_latex = list(formula_items(tiny_package, seed=1, renderers=("pdflatex",)))
    assert [item.source.renderer for item in only_latex] == ["pdflatex"] * 3
    with pytest.raises(ValueError):
        list(formula_items(tiny_package, seed=1, renderers=("mathjax",)))


@needs_pdflatex
def test_a_formula_that_fails_to_compile_does_not_spoil_its_batch():
    images = render_pdflatex(["a+b", r"x^1^2", r"\frac{a}{b}", r"\left( x", "c=d"], [150] * 5)
    assert [image is not None for image in images] == [True, False, True, False, True]


def test_reserved_packages_are_refused(tmp_path):
    with pytest.raises(ReservedPackage):
        package_formulas(UnpackedPackage("texlive-science-doc", tmp_path, "GPL"))


def test_inline_math_is_found_only_when_asked_and_after_the_displays():
    source = r"Let $x_1 + y$ be \(a \le b\) and $x^2 + y^2 = z^2$; cost \$5 and \$6." + "\n\\[ x^2 + y^2 = z^2 \\]\n"
    assert [f.target for f in find_display_formulas(source)] == ["x^{2}+y^{2}=z^{2}"]
    found = find_display_formulas(source, FormulaConfig(inline=True))
    # the inline repeat of the display formula is not kept twice; escaped dollars are no math
    assert [(f.target, f.display) for f in found] == [
        ("x^{2}+y^{2}=z^{2}", True), ("x_{1}+y", False), (r"a\leq b", False)]


@needs_pdflatex
def test_every_available_math_style_typesets_display_and_inline_math():
    from gravityocr.corpus.formula_rendering import MATH_STYLES, available_math_styles

    styles = available_math_styles()
    assert "cm" in styles and set(styles) <= set(MATH_STYLES)
    for style in styles:
        display, inline = render_pdflatex([r"\sum_{i=1}^{n} \frac{a_i}{b}"] * 2, [200, 200], styles=[style] * 2,
                                          displays=[True, False])
        assert display is not None and inline is not None, style
        # display style sets the limits above and below and a full-size fraction: a taller image
        assert display.height > inline.height * 1.2, style


def test_inline_dollars_around_what_is_not_math_are_left_out():
    source = (r"Set $TEXMFLOCAL/tex$ and \draw $(node.north)+(1,0)$; so $\mathrm{arg\,min}_x f$ and $x_{ij}$." "\n")
    found = find_display_formulas(source, FormulaConfig(inline=True))
    assert [f.target for f in found] == [r"\mathrm{arg\,min}_{x}f", "x_{ij}"]
