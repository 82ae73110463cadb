"""Table items: the HTML normaliser, LaTeX tabular conversion, and real rendering with headless
chromium and pdflatex (no mocks)."""

from __future__ import annotations

import gzip
import io
import os
import shutil

import numpy as np
import pytest

from gravityocr.corpus.chromium import Chromium
from gravityocr.corpus.debian import ReservedPackage, UnpackedPackage
from gravityocr.corpus.html_tables import html_tables, normalize_html_table
from gravityocr.corpus.latex_tables import latex_cell_text, latex_tabulars
from gravityocr.corpus.tables import html_table_items, latex_table_items
from gravityocr.model.evaluation.scores import parse_table, teds

needs_chromium = pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="chromium is not installed")
needs_pdflatex = pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")

SOURCE_TABLE = """
<table class="table" summary="Numeric Types" border="1">
  <caption>Table 8.2. Numeric Types</caption>
  <colgroup><col class="col1"><col class="col2"></colgroup>
  <thead><tr><th>Name</th><th colspan="2">Storage&nbsp;Size &mdash; bytes</th></tr></thead>
  <tbody>
    <tr><td rowspan="2"><code class="type">smallint</code></td><td>2</td><td>small-range
        integer&hellip;</td></tr>
    <tr><td>&#52;</td><td>typical <a href="x.html"><em>choice</em></a> for &quot;integer&quot;</td></tr>
  </tbody>
  <tfoot><tr><td>caf&eacute;</td><td>8</td><td>large<br>range</td></tr></tfoot>
</table>"""

EXPECTED_TABLE = (
    '<table><tr><td>Name</td><td colspan="2">Storage Size — bytes</td></tr>'
    '<tr><td rowspan="2">smallint</td><td>2</td><td>small-range integer…</td></tr>'
    '<tr><td>4</td><td>typical choice for "integer"</td></tr>'
    '<tr><td>café</td><td>8</td><td>large range</td></tr></table>'
)

NAVIGATION = """<table width="100%" summary="Navigation header"><tr><th colspan="3">Chapter 8</th></tr>
<tr><td><a href="a.html">Prev</a></td><td>Up</td><td><a href="b.html">Next</a></td></tr></table>"""

SMALL_PAGE = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>t</title></head><body>
{NAVIGATION}
<p>Text before the table.</p>
<table border="1"><tr><th>Option</th><th>Meaning</th></tr>
<tr><td><code>-v</code></td><td>verbose output</td></tr>
<tr><td><code>-q</code></td><td>quiet</td></tr></table>
</body></html>"""
SMALL_TARGET = "<table><tr><td>Option</td><td>Meaning</td></tr><tr><td>-v</td><td>verbose output</td></tr><tr><td>-q</td><td>quiet</td></tr></table>"

TABULAR = r"""\documentclass{article}
\begin{document}
% \begin{tabular}{ll} a commented-out tabular & is not one \end{tabular}
\begin{tabular}{|l|c|r|}
\hline
\multicolumn{2}{|c|}{\textbf{Kind of font}} & Size\\ \hline
Roman & \verb|cmr| & 10--12 pt \\
Sans serif & \texttt{cmss} & 8~pt\\[2pt]
\hline
\end{tabular}
\begin{tabular}{ll} $x$ & math \\ y & z \end{tabular}
\end{document}
"""
TABULAR_TARGET = ('<table><tr><td colspan="2">Kind of font</td><td>Size</td></tr>'
                  '<tr><td>Roman</td><td>cmr</td><td>10–12 pt</td></tr>'
                  '<tr><td>Sans serif</td><td>cmss</td><td>8 pt</td></tr></table>')


def _package(tmp_path, files: dict[str, str], name: str = "tables-test-doc") -> UnpackedPackage:
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if relative.endswith(".gz"):
            path.write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text, encoding="utf-8")
    return UnpackedPackage(name, tmp_path, "GPL-2+")


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _ink(image) -> float:
    """Share of pixels clearly darker than the background."""
    return float((np.asarray(image.convert("L")) < 128).mean())


def test_normaliser_gives_the_target_form():
    target = normalize_html_table(SOURCE_TABLE)
    assert target == EXPECTED_TABLE
    assert teds(target, target) == 1.0
    rows = parse_table(target).children
    assert [[(c.content, c.colspan, c.rowspan) for c in row.children] for row in rows][:2] == [
        [("Name", 1, 1), ("Storage Size — bytes", 2, 1)],
        [("smallint", 1, 2), ("2", 1, 1), ("small-range integer…", 1, 1)],
    ]


def test_layout_and_unusable_tables_are_skipped():
    assert normalize_html_table(NAVIGATION) is None
    nested = "<table><tr><td><table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table></td><td>x</td></tr><tr><td>1</td><td>2</td></tr></table>"
    assert html_tables(nested) == [None, None]  # both the layout table and the one inside it
    listing = "<table><tr><td>a</td><td><ul><li>one</li></ul></td></tr><tr><td>b</td><td>c</td></tr></table>"
    assert normalize_html_table(listing) is None
    assert normalize_html_table("<table><tr><td>one row</td><td>only</td></tr></table>") is None
    assert normalize_html_table("<table><tr><td>a</td></tr><tr><td>b</td></tr><tr><td>c</td></tr></table>") is None
    # outside the tokenizer's vocabulary, or ambiguous inside a target
    assert normalize_html_table("<table><tr><td>f(x) → y</td><td>a</td></tr><tr><td>b</td><td>c</td></tr></table>") is None
    assert normalize_html_table("<table><tr><td>a &lt; b</td><td>a</td></tr><tr><td>b</td><td>c</td></tr></table>") is None
    # a page's tables keep their positions, so an item's locator names the source table
    assert [t is not None for t in html_tables(SMALL_PAGE)] == [False, True]


def test_latex_cells_reduce_to_text_or_are_refused():
    assert latex_cell_text(r"\textbf{Na\"{\i}ve}") is None  # \i is not on the allow-list
    assert latex_cell_text(r"AT\&T") is None  # '&' is ambiguous inside a target
    assert latex_cell_text(r"\emph{don't} ``quote'' --- \LaTeX{} and co.") == "don’t “quote” — LaTeX and co."
    assert latex_cell_text(r"\texttt{--verbose} \'etait") == "--verbose était"
    for refused in (r"$x^2$", r"\ref{fig}", r"\rule{1pt}{2pt}", r"a_b", r"x < y"):
        assert latex_cell_text(refused) is None, refused
    found = latex_tabulars(TABULAR)
    assert len(found) == 2 and found[1] is None  # math
    assert found[0].table.html() == TABULAR_TARGET and found[0].line == 4
    assert teds(TABULAR_TARGET, TABULAR_TARGET) == 1.0


@needs_chromium
def test_chromium_renders_the_normalised_table_deterministically(tmp_path):
    package = _package(tmp_path, {"usr/share/doc/t/b.html": SMALL_PAGE, "usr/share/doc/t/a.html.gz": "<p>none</p>"})
    with Chromium() as browser:
        first = list(html_table_items(package, seed=7, browser=browser))
        again = list(html_table_items(package, seed=7, browser=browser))
        other = list(html_table_items(package, seed=8, browser=browser))
        pid = browser.pid
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: the browser is gone
    assert len(first) == 1
    item = first[0]
    assert item.type == "table" and item.text == SMALL_TARGET
    assert item.source.file == "usr/share/doc/t/b.html" and item.source.locator == "table1"
    assert item.source.renderer == "chromium" and item.source.licence == "GPL-2+"
    assert item.image.mode == "RGB"
    width, height = item.image.size
    assert 60 <= width <= 1600 and 40 <= height <= 600, item.image.size
    assert 0.005 < _ink(item.image) < 0.5
    assert [(i.text, _png(i.image)) for i in again] == [(item.text, _png(item.image))]
    assert other[0].text == item.text and other[0].extra != item.extra
    with pytest.raises(ReservedPackage):
        next(html_table_items(UnpackedPackage("python3.11-doc", tmp_path, "PSF"), seed=0))


@needs_pdflatex
def test_pdflatex_renders_tabulars_deterministically(tmp_path):
    package = _package(tmp_path, {"usr/share/doc/t/fonts.tex.gz": TABULAR})
    first = list(latex_table_items(package, seed=3))
    again = list(latex_table_items(package, seed=3))
    assert len(first) == 1
    item = first[0]
    assert item.text == TABULAR_TARGET
    assert item.source.file == "usr/share/doc/t/fonts.tex.gz" and item.source.locator == "table0"
    assert item.source.renderer == "pdflatex"
    assert item.image.mode == "RGB"
    width, height = item.image.size
    assert 100 <= width <= 2000 and 40 <= height <= 1000, item.image.size
    assert 0.005 < _ink(item.image) < 0.5
    assert [(i.text, _png(i.image)) for i in again] == [(item.text, _png(item.image))]
