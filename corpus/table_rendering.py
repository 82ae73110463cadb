"""Table images: HTML tables drawn by chromium in a drawn style, LaTeX tabulars set by pdflatex.

Image and target agree by construction. HTML tables are rendered from the normalised `Table`
(not the source markup), so what the browser shows is the target's text and spans. LaTeX
tabulars are rendered from their own source, which shows its table's text.
"""

from __future__ import annotations

import html
import os
import random
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pypdfium2 as pdfium
from PIL import Image

from gravityocr.corpus.table_form import Table, td


# ---------------------------------------------------------------- HTML styles

# Families tried in this order of preference; only those fontconfig knows are used.
HTML_FONTS = (
    "DejaVu Sans", "DejaVu Serif", "DejaVu Sans Mono", "DejaVu Sans Condensed", "Nimbus Sans",
    "Nimbus Roman", "Nimbus Mono PS", "P052", "C059", "URW Bookman", "URW Gothic",
    "Latin Modern Roman", "Latin Modern Sans", "Latin Modern Mono", "Liberation Sans", "Liberation Serif",
    "Liberation Mono", "Noto Sans", "Noto Serif", "FreeSans", "FreeSerif", "FreeMono",
)


def available_fonts(candidates: tuple[str, ...] = HTML_FONTS) -> tuple[str, ...]:
    """The candidates fontconfig lists on this machine, in the candidates' order (so a seed picks the
    same font wherever the same fonts are installed); DejaVu Sans if fc-list is missing."""
    try:
        listed = subprocess.run(["fc-list", ":", "family"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ("DejaVu Sans",)
    families = {name.strip() for line in listed.splitlines() for name in line.split(",")}
    return tuple(f for f in candidates if f in families) or ("DejaVu Sans",)


@dataclass(frozen=True)
class HtmlStyle:
    """How one HTML table is drawn."""

    font: str
    font_size: int  # px, 11-20
    borders: str  # "none" | "all" | "rows" (horizontal rules only)
    padding: tuple[int, int]  # vertical, horizontal px
    zebra: bool
    header_bold: bool
    header_shade: bool
    align: str  # left | center | right
    line_height: float
    max_width: int  # px; cells wrap beyond it
    ink: str
    rule: str
    margin: int  # px of page kept around the table

    @staticmethod
    def draw(rng: random.Random, fonts: tuple[str, ...]) -> "HtmlStyle":
        return HtmlStyle(
            font=rng.choice(fonts), font_size=rng.randint(11, 20),
            borders=rng.choices(("none", "all", "rows"), weights=(2, 4, 3))[0],
            padding=(rng.randint(1, 8), rng.randint(3, 14)), zebra=rng.random() < 0.3,
            header_bold=rng.random() < 0.6, header_shade=rng.random() < 0.25,
            align=rng.choices(("left", "center", "right"), weights=(6, 2, 1))[0],
            line_height=round(rng.uniform(1.1, 1.5), 2), max_width=rng.choice((500, 700, 900, 1200, 1500)),
            ink=rng.choice(("#000", "#111", "#222", "#333")), rule=rng.choice(("#000", "#444", "#888", "#bbb")),
            margin=rng.randint(4, 16),
        )

    def css(self) -> str:
        v, h = self.padding
        rules = {
            "none": "",
            "all": f"#t td {{ border: 1px solid {self.rule}; }}",
            "rows": f"#t {{ border-top: 2px solid {self.rule}; border-bottom: 2px solid {self.rule}; }}"
                    f" #t tr + tr td {{ border-top: 1px solid {self.rule}; }}",
        }[self.borders]
        return (
            "html, body { margin: 0; background: #fff; } body { padding: 24px; }"
            f" #t {{ border-collapse: collapse; font-family: '{self.font}'; font-size: {self.font_size}px;"
            f" line-height: {self.line_height}; color: {self.ink}; max-width: {self.max_width}px; }}"
            f" #t td {{ padding: {v}px {h}px; text-align: {self.align}; }} {rules}"
            + (" #t tr:nth-child(even) td { background: #eef0f2; }" if self.zebra else "")
            + (" #t tr:first-child td { font-weight: bold; }" if self.header_bold else "")
            + (" #t tr:first-child td { background: #dde3ea; }" if self.header_shade else "")
        )


def html_body(table: Table) -> str:
    """The table as the page shows it: the target's cells and spans, text escaped for the browser."""
    rows = "".join("<tr>" + "".join(td(c) + html.escape(c.text, quote=False) + "</td>" for c in row) + "</tr>"
                   for row in table.rows)
    return f'<table id="t">{rows}</table>'


# ---------------------------------------------------------------- pdflatex

# Beyond ASCII, only what OT1 Computer Modern draws itself (no TS1 companion fonts are installed).
LATEX_CHARACTERS = frozenset(chr(c) for c in range(32, 127)) | frozenset("éèêëàâäçîïôöùûüñÉÀÇÖÜßæøå–—‘’“”•§©")

LATEX_PREAMBLE = r"""\documentclass{article}
\usepackage{booktabs}
\pagestyle{empty}
\newsavebox\tablebox
\pdfhorigin=4pt
\pdfvorigin=4pt
\newcommand\emittable{%
  \pdfpagewidth=\dimexpr\wd\tablebox+8pt\relax
  \pdfpageheight=\dimexpr\ht\tablebox+\dp\tablebox+8pt\relax
  \shipout\hbox{\usebox\tablebox}}
\begin{document}
"""


@dataclass(frozen=True)
class LatexStyle:
    """How one tabular is set and rasterised."""

    family: str  # "rm" | "sf"
    size: float  # pt
    arraystretch: float
    tabcolsep: float  # pt
    dpi: int  # 100-300

    @staticmethod
    def draw(rng: random.Random) -> "LatexStyle":
        return LatexStyle(family=rng.choices(("rm", "sf"), weights=(3, 1))[0],
                          size=rng.choice((9, 10, 10.95, 12, 14.4)),
                          arraystretch=round(rng.uniform(1.0, 1.6), 2), tabcolsep=rng.choice((3, 4, 6, 8, 10)),
                          dpi=rng.randint(100, 300))

    def latex(self, tabular: str) -> str:
        return (f"\\begingroup\\fontsize{{{self.size}}}{{{round(self.size * 1.2, 2)}}}\\selectfont"
                f"\\{self.family}family\\renewcommand\\arraystretch{{{self.arraystretch}}}"
                f"\\setlength\\tabcolsep{{{self.tabcolsep}pt}}%\n"
                f"\\begin{{lrbox}}{{\\tablebox}}{tabular}\\end{{lrbox}}\\emittable\\endgroup\n")


def render_tabulars(jobs: list[tuple[str, LatexStyle]], timeout_s: float = 120.0) -> list[Image.Image | None]:
    """One RGB image per (tabular source, style), each cropped to the tabular plus 4 pt, or None
    where pdflatex fails on it. All jobs share one pdflatex run (one page each); a failed run is
    split in halves until the failing tabulars are isolated."""
    if not jobs:
        return []
    pages = _compile(jobs, timeout_s)
    if pages is None:
        if len(jobs) == 1:
            return [None]
        half = len(jobs) // 2
        return render_tabulars(jobs[:half], timeout_s) + render_tabulars(jobs[half:], timeout_s)
    return pages


def _compile(jobs: list[tuple[str, LatexStyle]], timeout_s: float) -> list[Image.Image] | None:
    document = LATEX_PREAMBLE + "".join(style.latex(source) for source, style in jobs) + "\\end{document}\n"
    # No font generation: a glyph that needs a missing font fails the run instead of running metafont.
    env = {**os.environ, "MKTEXTFM": "0", "MKTEXPK": "0", "MKTEXMF": "0"}
    with tempfile.TemporaryDirectory(prefix="gravityocr-latex-") as work:
        Path(work, "t.tex").write_text(document, encoding="utf-8")
        try:
            result = subprocess.run(
                ["pdflatex", "-interaction=batchmode", "-halt-on-error", "-no-shell-escape", "t.tex"],
                cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        pdf_path = Path(work, "t.pdf")
        if result.returncode != 0 or not pdf_path.exists():
            return None
        pdf = pdfium.PdfDocument(pdf_path.read_bytes())
        try:
            if len(pdf) != len(jobs):
                return None
            return [pdf[i].render(scale=style.dpi / 72).to_pil().convert("RGB") for i, (_, style) in enumerate(jobs)]
        finally:
            pdf.close()
