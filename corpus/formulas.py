"""Formula items: formulas found in a package's LaTeX sources, rendered two ways.

`formula_items` renders each formula with pdflatex in a math font style drawn from
`FormulaConfig.math_styles` (Computer Modern alone by default; training builds draw among every
style whose LaTeX packages this machine has, `available_math_styles`), and with matplotlib's
mathtext in a font set drawn from the seed; the item's text is the target. When pdflatex is
among the renderers, a formula it cannot compile is dropped for every renderer, so each target
is LaTeX that compiles. Every random choice for a formula comes from
`random.Random(f"{seed}/{target}")`, so an item depends only on the seed and its formula, not
on the limit or on which other formulas a package holds.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import replace

from gravityocr.corpus.debian import UnpackedPackage, check_not_reserved
from gravityocr.corpus.formula_extraction import DisplayFormula, FormulaConfig, find_display_formulas
from gravityocr.corpus.formula_rendering import render_mathtext, render_pdflatex
from gravityocr.corpus.items import CorpusItem, Source


MATHTEXT_FONTSETS = ("cm", "stix", "stixsans", "dejavusans", "dejavuserif")


def package_formulas(package: UnpackedPackage, config: FormulaConfig = FormulaConfig(),
                     exclude: frozenset[str] = frozenset()) -> list[tuple[str, DisplayFormula]]:
    """(file inside the package, formula) for each target of the package's .tex sources, first
    occurrence in sorted file order, less the targets in `exclude`."""
    check_not_reserved(package.name)
    found, seen = [], set(exclude)
    for path in package.files(".tex"):
        data = package.read_bytes(path)
        try:
            source = data.decode("utf-8")
        except UnicodeDecodeError:
            source = data.decode("latin-1")
        for formula in find_display_formulas(source, config):
            if formula.target not in seen:
                seen.add(formula.target)
                found.append((package.relative(path), formula))
    return found


def formula_items(package: UnpackedPackage, seed: int, limit: int | None = None,
                  renderers: Sequence[str] = ("pdflatex", "mathtext"),
                  config: FormulaConfig = FormulaConfig(), exclude: frozenset[str] = frozenset()) -> Iterator[CorpusItem]:
    """Up to `limit` formula items of the package: per formula, its pdflatex rendering and then its
    mathtext rendering (where mathtext parses it), formulas in `package_formulas` order, none
    whose target is in `exclude`. The same package, seed, renderers and config give the same
    items, image bytes included."""
    unknown = set(renderers) - {"pdflatex", "mathtext"}
    if unknown:
        raise ValueError(f"unknown renderers {sorted(unknown)}: pdflatex and mathtext are known")
    formulas = package_formulas(package, config, exclude)
    yielded = 0
    for start in range(0, len(formulas), config.batch):
        batch = formulas[start:start + config.batch]
        choices = [_choices(seed, formula.target, config) for _, formula in batch]
        if "pdflatex" in renderers:
            latex_images = render_pdflatex([f.latex for _, f in batch], [c["latex_dpi"] for c in choices],
                                           config, [c["style"] for c in choices], [f.display for _, f in batch])
        else:
            latex_images = [None] * len(batch)
        for (file, formula), chosen, latex_image in zip(batch, choices, latex_images):
            source = Source(package.name, file, package.licence, locator=f"line{formula.line}")
            made = []
            if "pdflatex" in renderers:
                if latex_image is None:
                    continue  # not LaTeX that compiles: no target for any renderer
                style = "" if chosen["style"] == "cm" else f"-{chosen['style']}"
                made.append((latex_image, f"pdflatex{style}", chosen["latex_dpi"]))
            if "mathtext" in renderers:
                image = render_mathtext(formula.latex, chosen["fontset"], chosen["mathtext_points"],
                                        chosen["mathtext_dpi"], config)
                if image is not None:
                    made.append((image, f"mathtext-{chosen['fontset']}", chosen["mathtext_dpi"]))
            for image, renderer, dpi in made:
                yield CorpusItem("formula", image, formula.target, replace(source, renderer=renderer),
                                 extra={"dpi": dpi})
                yielded += 1
                if limit is not None and yielded >= limit:
                    return


def _choices(seed: int, target: str, config: FormulaConfig) -> dict:
    """Every random choice for one formula, drawn in a fixed order from a generator of its own."""
    rng = random.Random(f"{seed}/{target}")
    return {"latex_dpi": rng.randint(*config.dpi), "fontset": rng.choice(MATHTEXT_FONTSETS),
            "mathtext_points": rng.randint(*config.mathtext_points), "mathtext_dpi": rng.randint(*config.dpi),
            "style": rng.choice(config.math_styles)}
