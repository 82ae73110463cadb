"""Table items from Debian documentation: HTML tables rendered by chromium, LaTeX tabulars by pdflatex.

Every item's target is the table form (`table_form`), and its image shows exactly that target.
Style (fonts, sizes, rules, padding, dpi) is drawn per table from `random.Random` seeded by
(seed, file, table index), so an item depends on the seed and its source only, not on limits,
file order or what else was rendered.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Iterator

from gravityocr.corpus.chromium import Chromium
from gravityocr.corpus.debian import UnpackedPackage, check_not_reserved
from gravityocr.corpus.html_tables import decode_html, html_tables
from gravityocr.corpus.items import CorpusItem, Source
from gravityocr.corpus.latex_tables import Tabular, decode_tex, latex_tabulars
from gravityocr.corpus.table_form import TableLimits
from gravityocr.corpus.table_rendering import (LATEX_CHARACTERS, HtmlStyle, LatexStyle, available_fonts, html_body,
                                               render_tabulars)


def _shuffled(paths: list[Path], seed: int) -> list[Path]:
    paths = sorted(paths)
    random.Random(seed).shuffle(paths)
    return paths


def html_table_items(package: UnpackedPackage, seed: int, limit: int | None = None,
                     browser: Chromium | None = None, limits: TableLimits = TableLimits(),
                     dedupe: bool = True) -> Iterator[CorpusItem]:
    """Table items from the package's HTML files, rendered by chromium.

    Files are visited in an order shuffled by `seed`; each kept table is drawn in a style seeded by
    (seed, file, index). With `dedupe`, a target already yielded from this package is skipped.
    Without `browser`, one is started here and closed when the iterator ends or is closed.
    """
    check_not_reserved(package.name)
    if limit is not None and limit <= 0:
        return
    own = browser is None
    if own:
        browser = Chromium()
        browser.start()
    try:
        fonts = available_fonts()
        seen: set[str] = set()
        count = 0
        for path in _shuffled(package.files(".html", ".htm"), seed):
            relative = package.relative(path)
            for index, table in enumerate(html_tables(decode_html(package.read_bytes(path)), limits)):
                if table is None or (dedupe and table.html() in seen):
                    continue
                seen.add(table.html())
                style = HtmlStyle.draw(random.Random(f"{seed}:{relative}:{index}"), fonts)
                image = browser.screenshot(style.css(), html_body(table), "t", margin=style.margin)
                yield CorpusItem(
                    type="table", image=image, text=table.html(),
                    source=Source(package.name, relative, package.licence, locator=f"table{index}",
                                  renderer="chromium"),
                    extra={"style": repr(style)},
                )
                count += 1
                if limit is not None and count >= limit:
                    return
    finally:
        if own:
            browser.close()


def latex_table_items(package: UnpackedPackage, seed: int, limit: int | None = None,
                      limits: TableLimits = TableLimits(), dedupe: bool = True,
                      batch: int = 32) -> Iterator[CorpusItem]:
    """Table items from the simple tabulars of the package's .tex files, set by pdflatex.

    Files are visited in an order shuffled by `seed`; each tabular is set in a style seeded by
    (seed, file, index); up to `batch` tabulars share one pdflatex run. With `dedupe`, a target
    already taken from this package is skipped.
    """
    check_not_reserved(package.name)
    candidates = _latex_candidates(package, seed, limits, dedupe)
    count = 0
    while limit is None or count < limit:
        chunk = list(itertools.islice(candidates, batch if limit is None else min(batch, limit - count)))
        if not chunk:
            return
        images = render_tabulars([(tabular.source, style) for tabular, style, _ in chunk])
        for (tabular, style, source), image in zip(chunk, images):
            if image is not None:
                count += 1
                yield CorpusItem(type="table", image=image, text=tabular.table.html(), source=source,
                                 extra={"style": repr(style), "line": tabular.line})


def _latex_candidates(package: UnpackedPackage, seed: int, limits: TableLimits,
                      dedupe: bool) -> Iterator[tuple[Tabular, LatexStyle, Source]]:
    seen: set[str] = set()
    for path in _shuffled(package.files(".tex"), seed):
        relative = package.relative(path)
        for index, tabular in enumerate(latex_tabulars(decode_tex(package.read_bytes(path)), limits)):
            if tabular is None or (dedupe and tabular.table.html() in seen):
                continue
            if any(c not in LATEX_CHARACTERS for row in tabular.table.rows for cell in row for c in cell.text):
                continue
            seen.add(tabular.table.html())
            style = LatexStyle.draw(random.Random(f"{seed}:{relative}:{index}"))
            yield tabular, style, Source(package.name, relative, package.licence, locator=f"table{index}",
                                         renderer="pdflatex")
