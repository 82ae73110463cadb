"""Table items from Debian documentation: HTML tables rendered by chromium, LaTeX tabulars by pdflatex.

Every item's target is the recogniser's table form, `<table><tr><td>text</td>...</tr></table>`:
only table/tr/td tags, ` colspan="N"`/` rowspan="N"` where N > 1, cell text with whitespace
folded to single spaces and characters the tokenizer knows. The target round-trips through
`parse_table` cell for cell, so `teds(target, target) == 1` and a prediction is scored against
exactly the text shown.

Image and target agree by construction. HTML tables are rendered from the normalised `Table`
(not the source markup), so what the browser shows is the target's text and spans. LaTeX tabulars
are rendered from their own source, but only when every cell reduces to text through a small
allow-list of macros whose output is known (anything else drops the tabular).

Style (fonts, sizes, rules, padding, dpi) is drawn per table from `random.Random` seeded by
(seed, file, table index), so an item depends on the seed and its source only, not on limits,
file order or what else was rendered.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import math
import os
import random
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
import unicodedata
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator

import pypdfium2 as pdfium
from PIL import Image

from gravityocr.model.evaluation.scores import parse_table
from gravityocr.model.network.tokenizer import character_vocabulary

from gravityocr.corpus.debian import UnpackedPackage, check_not_reserved
from gravityocr.corpus.items import CorpusItem, Source

VOCABULARY = frozenset(character_vocabulary()) - {"\n"}
# As in the synthetic tables: '<', '>' and '&' would make a target's cell text ambiguous HTML.
FORBIDDEN = frozenset("<>&")
# Characters mapped before the vocabulary check: spaces to a space, invisible ones to nothing.
CHARACTER_MAP = {
    **{c: " " for c in "\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000"},
    **{c: "" for c in "\u00ad\u200b\u200c\u200d\u2060\ufeff"},
    "\u2010": "-", "\u2011": "-", "\u2212": "-",
}
_TRANSLATE = str.maketrans(CHARACTER_MAP)


# ---------------------------------------------------------------- the table form


@dataclass(frozen=True)
class Cell:
    text: str
    colspan: int = 1
    rowspan: int = 1


@dataclass(frozen=True)
class Table:
    rows: tuple[tuple[Cell, ...], ...]

    def html(self) -> str:
        """The target: table/tr/td only, spans written only where greater than 1."""
        return "<table>" + "".join("<tr>" + "".join(_td(c) + c.text + "</td>" for c in row) + "</tr>"
                                   for row in self.rows) + "</table>"

    @property
    def n_columns(self) -> int:
        return max(sum(c.colspan for c in row) for row in self.rows)


def _td(cell: Cell) -> str:
    spans = (f' colspan="{cell.colspan}"' if cell.colspan > 1 else "") + (
        f' rowspan="{cell.rowspan}"' if cell.rowspan > 1 else "")
    return f"<td{spans}>"


@dataclass(frozen=True)
class TableLimits:
    """What a kept table looks like: a data grid of modest size with short, known-character cells."""

    min_rows: int = 2
    max_rows: int = 40
    min_columns: int = 2
    max_columns: int = 12
    max_span: int = 12
    max_cell_chars: int = 200
    max_table_chars: int = 3000
    min_filled_cells: int = 3


def clean_text(text: str) -> str | None:
    """Cell text with mapped characters and folded whitespace, or None if a character is not in
    the tokenizer's vocabulary or is one the target form forbids."""
    text = " ".join(text.translate(_TRANSLATE).split())
    text = unicodedata.normalize("NFC", text)
    if any(c not in VOCABULARY or c in FORBIDDEN for c in text):
        return None
    return text


def accept(rows: list[list[Cell]], limits: TableLimits = TableLimits()) -> Table | None:
    """The table, empty rows dropped, if it passes `limits` and its target round-trips; else None."""
    rows = [row for row in rows if row]
    if not (limits.min_rows <= len(rows) <= limits.max_rows):
        return None
    table = Table(tuple(tuple(row) for row in rows))
    cells = [c for row in rows for c in row]
    if not (limits.min_columns <= table.n_columns <= limits.max_columns):
        return None
    if max(len(row) for row in rows) < 2:
        return None  # one cell per row: a list or a box, not a grid
    if any(c.colspan > limits.max_span or c.rowspan > limits.max_span for c in cells):
        return None
    if any(len(c.text) > limits.max_cell_chars for c in cells):
        return None
    if sum(len(c.text) for c in cells) > limits.max_table_chars:
        return None
    if sum(1 for c in cells if c.text) < limits.min_filled_cells:
        return None
    return table if _round_trips(table) else None


def _round_trips(table: Table) -> bool:
    root = parse_table(table.html())
    if root is None or len(root.children) != len(table.rows):
        return False
    for node_row, row in zip(root.children, table.rows):
        if node_row.tag != "tr" or len(node_row.children) != len(row):
            return False
        for node, cell in zip(node_row.children, row):
            if (node.content, node.colspan, node.rowspan) != (cell.text, cell.colspan, cell.rowspan):
                return False
    return True


# ---------------------------------------------------------------- HTML tables

# Cell content that makes a table layout rather than data (or that text cannot stand for).
BLOCK_TAGS = frozenset({
    "ul", "ol", "dl", "pre", "img", "table", "blockquote", "hr", "form", "input", "select", "textarea",
    "button", "iframe", "object", "embed", "svg", "math", "video", "audio", "canvas", "h1", "h2", "h3",
    "h4", "h5", "h6", "figure",
})
# Tags whose boundaries separate words.
BREAK_TAGS = frozenset({"br", "p", "div", "li", "dt", "dd", "tr", "td", "th", "caption"})
# Words in a table's class, summary, role or id that mark navigation, layout or admonition boxes.
LAYOUT_HINTS = re.compile(r"\b(?:nav\w*|navigation|simplelist|callout\w*|layout|menu\w*|toc|breadcrumbs?|"
                          r"admonition|note|tip|warning|caution|important|presentation)\b")


@dataclass
class _RawTable:
    attrs: dict
    serial: int  # order of the <table> start tag in the page
    rows: list[list[list]] = field(default_factory=list)  # [text parts, colspan, rowspan]
    cell: list | None = None
    nested: bool = False
    block: bool = False

    def start_row(self) -> None:
        self.cell = None
        self.rows.append([])

    def start_cell(self, colspan: int, rowspan: int) -> None:
        if not self.rows:
            self.rows.append([])
        self.cell = [[], colspan, rowspan]
        self.rows[-1].append(self.cell)


def _span(value: str | None) -> int:
    try:
        return max(1, int((value or "1").strip()))
    except ValueError:
        return 1


class _TableExtractor(HTMLParser):
    """Every <table> of a page with its cells' raw text and whether it is nested or holds blocks.
    Unclosed cells and rows close implicitly, as browsers close them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[_RawTable] = []
        self.done: list[_RawTable] = []
        self.skip_depth = 0  # inside <script>/<style>
        self.serial = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip_depth += 1
            return
        table = self.open[-1] if self.open else None
        if tag == "table":
            for outer in self.open:
                outer.nested = True
            self.open.append(_RawTable({k: v or "" for k, v in attrs}, self.serial, nested=bool(self.open)))
            self.serial += 1
            return
        if table is None:
            return
        values = dict(attrs)
        if tag == "tr":
            table.start_row()
        elif tag in ("td", "th"):
            table.start_cell(_span(values.get("colspan")), _span(values.get("rowspan")))
        elif table.cell is not None:
            if tag in BLOCK_TAGS:
                table.block = True
            elif tag in BREAK_TAGS:
                table.cell[0].append(" ")

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag in ("script", "style"):
            self.skip_depth -= 1

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip_depth = max(0, self.skip_depth - 1)
        elif self.open and tag == "table":
            self.done.append(self.open.pop())
        elif self.open and tag in ("td", "th"):
            self.open[-1].cell = None
        elif self.open and self.open[-1].cell is not None and tag in BREAK_TAGS:
            self.open[-1].cell[0].append(" ")

    def handle_data(self, data):
        if self.open and not self.skip_depth and self.open[-1].cell is not None:
            self.open[-1].cell[0].append(data)

    def tables(self) -> list[_RawTable]:
        """Closed and unclosed tables in document order of their start."""
        return sorted(self.done + self.open, key=lambda t: t.serial)


def _is_layout(raw: _RawTable) -> bool:
    hints = " ".join(raw.attrs.get(k, "") for k in ("class", "summary", "role", "id")).lower()
    return raw.nested or raw.block or raw.attrs.get("role", "") == "none" or bool(LAYOUT_HINTS.search(hints))


def html_tables(document: str, limits: TableLimits = TableLimits()) -> list[Table | None]:
    """One entry per <table> of `document` in order of appearance: the normalised table, or None
    where it is layout, navigation, nested, holds block content or fails `limits`."""
    parser = _TableExtractor()
    parser.feed(document)
    parser.close()
    return [None if _is_layout(raw) else _normalise(raw, limits) for raw in parser.tables()]


def _normalise(raw: _RawTable, limits: TableLimits) -> Table | None:
    rows = []
    for raw_row in raw.rows:
        row = []
        for parts, colspan, rowspan in raw_row:
            text = clean_text("".join(parts))
            if text is None:
                return None
            row.append(Cell(text, colspan, rowspan))
        rows.append(row)
    return accept(rows, limits)


def normalize_html_table(fragment: str, limits: TableLimits = TableLimits()) -> str | None:
    """The target form of the first table in `fragment`, or None if it is not a kept data table."""
    tables = html_tables(fragment, limits)
    return tables[0].html() if tables and tables[0] is not None else None


_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


def decode_html(data: bytes) -> str:
    """The page's text by its declared charset (UTF-8 when none is declared or it is unknown);
    undecodable bytes become U+FFFD, which no kept cell can hold."""
    match = _CHARSET.search(data[:4096])
    encoding = match.group(1).decode("ascii") if match else "utf-8"
    try:
        return data.decode(encoding, errors="replace")
    except LookupError:
        return data.decode("utf-8", errors="replace")


# ---------------------------------------------------------------- chromium


CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-default-apps", "--no-default-browser-check", "--hide-scrollbars",
    "--mute-audio", "--disable-dev-shm-usage", "--force-color-profile=srgb", "--remote-debugging-pipe",
)


class ChromiumError(RuntimeError):
    """Chromium exited, timed out, or answered a DevTools command with an error."""


class Chromium:
    """One headless chromium process, driven over the DevTools pipe (fds 3 and 4; no port, no
    network, no extra dependency), with one page that every screenshot reuses.

    Use it as a context manager: leaving the block closes the browser, kills its process group
    if it does not exit, and removes its fresh profile directory.
    """

    def __init__(self, executable: str = "/usr/bin/chromium", viewport: tuple[int, int] = (1600, 1200),
                 timeout_s: float = 60.0) -> None:
        self.executable = executable
        self.viewport = viewport
        self.timeout_s = timeout_s
        self.pid: int | None = None
        self._profile: str | None = None
        self._fds: tuple[int, ...] = ()
        self._next_id = 0
        self._buffer = b""

    def __enter__(self) -> "Chromium":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="gravityocr-chromium-")
        to_child, self._write_fd = os.pipe()
        self._read_fd, from_child = os.pipe()
        self._fds = (self._write_fd, self._read_fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            argv = [self.executable, *CHROMIUM_FLAGS, f"--user-data-dir={self._profile}", "about:blank"]
            self.pid = os.posix_spawn(self.executable, argv, os.environ, setsid=True, file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1),
                (os.POSIX_SPAWN_DUP2, devnull, 2), (os.POSIX_SPAWN_DUP2, to_child, 3),
                (os.POSIX_SPAWN_DUP2, from_child, 4)])
        except BaseException:
            self.close()
            raise
        finally:
            for fd in (to_child, from_child, devnull):
                os.close(fd)
        try:
            target = self._call("Target.createTarget", url="about:blank")["targetId"]
            self._session = self._call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            width, height = self.viewport
            self._call("Emulation.setDeviceMetricsOverride", session=self._session, width=width, height=height,
                       deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            if self.pid is not None:
                try:
                    self._send("Browser.close")
                except OSError:
                    pass
                if not self._exited_within(10.0):
                    os.killpg(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                self._reap_group()
        finally:
            self.pid = None
            for fd in self._fds:
                os.close(fd)
            self._fds = ()
            if self._profile is not None:
                shutil.rmtree(self._profile, ignore_errors=True)
                self._profile = None

    def _exited_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _reap_group(self) -> None:
        """Kill what is left of the browser's own process group (renderer, utility processes) and
        wait, briefly, until none is left."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.02)

    def _send(self, method: str, session: str | None = None, **params) -> int:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._write_fd, data):]
        return self._next_id

    def _call(self, method: str, session: str | None = None, **params) -> dict:
        """Send one command and wait for its answer; events that arrive meanwhile are dropped."""
        if self.pid is None:
            raise ChromiumError("chromium is not running")
        wanted = self._send(method, session, **params)
        deadline = time.monotonic() + self.timeout_s
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if message.get("id") == wanted:
                    if "error" in message:
                        raise ChromiumError(f"{method}: {message['error']}")
                    return message["result"]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read_fd], [], [], left)[0]:
                raise ChromiumError(f"{method}: no answer in {self.timeout_s} s")
            chunk = os.read(self._read_fd, 1 << 20)
            if not chunk:
                raise ChromiumError(f"{method}: chromium closed the DevTools pipe")
            self._buffer += chunk

    def screenshot(self, css: str, body: str, element_id: str, margin: int = 8) -> Image.Image:
        """An RGB screenshot of the element `element_id` of a page with stylesheet `css` and `body`,
        `margin` px of page around it. The page's head and body are replaced in place: no
        navigation, no network, nothing left from the previous screenshot."""
        script = (
            f"document.head.innerHTML = {json.dumps('<style>' + css + '</style>')};"
            f"document.body.innerHTML = {json.dumps(body)};"
            f"(() => {{ const r = document.getElementById({json.dumps(element_id)}).getBoundingClientRect();"
            f" return [r.left + window.scrollX, r.top + window.scrollY, r.right + window.scrollX,"
            f" r.bottom + window.scrollY]; }})()"
        )
        answer = self._call("Runtime.evaluate", session=self._session, expression=script, returnByValue=True)
        if "exceptionDetails" in answer:
            raise ChromiumError(f"page script failed: {answer['exceptionDetails'].get('text')}")
        left, top, right, bottom = answer["result"]["value"]
        x0, y0 = max(0, math.floor(left) - margin), max(0, math.floor(top) - margin)
        x1, y1 = math.ceil(right) + margin, math.ceil(bottom) + margin
        shot = self._call("Page.captureScreenshot", session=self._session, format="png",
                          captureBeyondViewport=True,
                          clip={"x": x0, "y": y0, "width": x1 - x0, "height": y1 - y0, "scale": 1})
        return Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")


# ---------------------------------------------------------------- HTML styles and items

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
    rows = "".join("<tr>" + "".join(_td(c) + html.escape(c.text, quote=False) + "</td>" for c in row) + "</tr>"
                   for row in table.rows)
    return f'<table id="t">{rows}</table>'


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


# ---------------------------------------------------------------- LaTeX tabulars

# Commands whose braced argument is shown as text (font changes only).
_TEXT_ARG = frozenset({"textbf", "textit", "textsl", "textsf", "textrm", "textup", "textmd", "textnormal",
                       "emph", "mbox", "underline", "textsc", "texttt"})
# Declarations that change only the font, size or alignment of what follows.
_DECLARATIONS = frozenset({
    "bfseries", "itshape", "slshape", "upshape", "mdseries", "rmfamily", "sffamily", "normalfont", "em",
    "bf", "it", "sl", "rm", "sf", "tiny", "scriptsize", "footnotesize", "small", "normalsize", "large",
    "Large", "centering", "raggedright", "raggedleft", "hfill", "strut", "relax", "null", "scshape", "sc",
})
_TT_DECLARATIONS = frozenset({"ttfamily", "tt"})
# Commands that print known text (logos as their letters, \ldots as the dots it shows).
_WORDS = {"LaTeX": "LaTeX", "TeX": "TeX", "ldots": "...", "dots": "...", "textellipsis": "...", "ss": "ß",
          "ae": "æ", "o": "ø", "aa": "å", "textendash": "–", "textemdash": "—", "textquoteleft": "‘",
          "textquoteright": "’", "textquotedblleft": "“", "textquotedblright": "”", "newline": " ",
          "space": " ", "S": "§", "copyright": "©", "textbullet": "•", "textbackslash": "\\"}
_SYMBOLS = {"&": "&", "%": "%", "$": "$", "#": "#", "_": "_", "{": "{", "}": "}", " ": " "}
_ACCENTS = {'"': "\u0308", "'": "\u0301", "`": "\u0300", "^": "\u0302", "~": "\u0303", "c": "\u0327"}
# OT1 Computer Modern shows these differently outside typewriter type (¡ ¿ — ”): not transcribable.
_OT1_ODD = frozenset("<>|")


class _Unsupported(Exception):
    pass


class _LatexText:
    """Plain text of a cell's LaTeX, exactly as Computer Modern (OT1) shows it, or _Unsupported."""

    def __init__(self, source: str) -> None:
        self.s = source
        self.i = 0

    def convert(self) -> str:
        return self._group(tt=False, until=None)

    def _group(self, tt: bool, until: str | None) -> str:
        out: list[str] = []
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if until is not None and c == until:
                self.i += 1
                return "".join(out)
            self.i += 1
            if c == "\\":
                text, tt = self._command(tt)
                out.append(text)
            elif c == "{":
                out.append(self._group(tt, "}"))
            elif c == "}":
                raise _Unsupported("unbalanced }")
            elif c in "$^_#&%":
                raise _Unsupported(f"{c} in text")
            elif c == "~":
                out.append(" ")
            elif not tt and c in "-`'!?\"":
                out.append(self._ligature(c))
            elif not tt and c in _OT1_ODD:
                raise _Unsupported(f"{c} in OT1 text")
            else:
                out.append(c)
        if until is not None:
            raise _Unsupported("unclosed {")
        return "".join(out)

    def _ligature(self, c: str) -> str:
        s, i = self.s, self.i
        if c == "-":
            if s.startswith("--", i):
                self.i += 2
                return "—"
            if s.startswith("-", i):
                self.i += 1
                return "–"
            return "-"
        if c in "`'" and s.startswith(c, i):
            self.i += 1
            return "“" if c == "`" else "”"
        if c in "!?" and s.startswith("`", i):
            raise _Unsupported("Spanish ligature")
        return {"`": "‘", "'": "’", '"': "”"}.get(c, c)

    def _argument(self, tt: bool) -> str:
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1
        if self.i >= len(self.s):
            raise _Unsupported("missing argument")
        c = self.s[self.i]
        self.i += 1
        if c == "{":
            return self._group(tt, "}")
        if c in "\\{}$%&#^_~":
            raise _Unsupported("unbraced command argument")
        return c

    def _command(self, tt: bool) -> tuple[str, bool]:
        s = self.s
        match = re.match(r"[A-Za-z]+", s[self.i:])
        if match is None:  # a control symbol
            if self.i >= len(s):
                raise _Unsupported("trailing backslash")
            c = s[self.i]
            self.i += 1
            if c in _SYMBOLS:
                return _SYMBOLS[c], tt
            if c == "/":
                return "", tt
            if c in _ACCENTS:
                return self._accent(c, tt), tt
            raise _Unsupported(f"\\{c}")
        name = match.group(0)
        self.i += len(name)
        if name in _WORDS or name in _DECLARATIONS or name in _TT_DECLARATIONS:
            self._eat_space()
        if name == "verb":
            return self._verb(), tt
        if name in _TEXT_ARG:
            return self._argument(tt or name == "texttt"), tt
        if name in _DECLARATIONS:
            return "", tt
        if name in _TT_DECLARATIONS:
            return "", True
        if name in _WORDS:
            return _WORDS[name], tt
        if name in _ACCENTS:  # \c{c}
            return self._accent(name, tt), tt
        raise _Unsupported(f"\\{name}")

    def _eat_space(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \n\t":
            self.i += 1
        if self.s.startswith("{}", self.i):
            self.i += 2

    def _accent(self, accent: str, tt: bool) -> str:
        base = self._argument(tt)
        composed = unicodedata.normalize("NFC", base + _ACCENTS[accent])
        if len(composed) != 1:
            raise _Unsupported("accent on more than one letter")
        return composed

    def _verb(self) -> str:
        if self.i >= len(self.s) or self.s[self.i].isalpha() or self.s[self.i] in " *":
            raise _Unsupported("\\verb form")
        delimiter = self.s[self.i]
        end = self.s.find(delimiter, self.i + 1)
        if end < 0:
            raise _Unsupported("unclosed \\verb")
        text = self.s[self.i + 1:end]
        self.i = end + 1
        return text


def latex_cell_text(source: str) -> str | None:
    """The text a tabular cell shows, whitespace folded, or None when the cell uses math or a macro
    whose output is not known text."""
    try:
        text = _LatexText(source).convert()
    except _Unsupported:
        return None
    return clean_text(text)


@dataclass(frozen=True)
class Tabular:
    """One simple tabular: its source (rendered as written) and the table it shows."""

    source: str  # \\begin{tabular}{spec}...\\end{tabular}, comments removed
    table: Table
    line: int  # 1-based line of \\begin{tabular} in its file


_COLUMN = re.compile(r"\s*(?:([lcr|])|p\{\s*(?:\d*\.?\d+\s*(?:pt|mm|cm|in|em|ex)|\d*\.?\d*\s*\\(?:linewidth|textwidth|columnwidth))\s*\}|(@\{\}))")
_RULES = re.compile(r"\s*(?:\\hline|\\toprule|\\midrule|\\bottomrule|\\cline\{\d+-\d+\}|\\cmidrule(?:\([lr]+\))?\{\d+-\d+\})")
_BEGIN = re.compile(r"\\begin\{tabular\}")
_ROW_END = re.compile(r"^\s*\*?\s*(?:\[\s*-?\d*\.?\d+\s*(?:pt|mm|cm|in|em|ex)\s*\])?")
_MULTICOLUMN = re.compile(r"\s*\\multicolumn\{(\d+)\}\{([lcr|\s]*)\}\{")


def column_count(spec: str) -> int | None:
    """Columns of a spec made of l, c, r, |, p{width}, empty @{} and *{n}{...} of those; None for
    anything else."""
    spec = re.sub(r"\*\s*\{?(\d+)\}?\s*\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", lambda m: m.group(2) * int(m.group(1)), spec)
    spec = re.sub(r"\*\s*(\d)\s*([lcr])", lambda m: m.group(2) * int(m.group(1)), spec)
    count, i = 0, 0
    while i < len(spec):
        match = _COLUMN.match(spec, i)
        if match is None:
            return None if spec[i:].strip() else count
        count += 1 if match.group(0).strip() not in ("|", "@{}") else 0
        i = match.end()
    return count


_COMMENT = re.compile(r"(?<!\\)(?:\\\\)*%")


def strip_comments(source: str) -> str:
    """LaTeX without its % comments (an escaped \\% stays); a comment also joins its line to the next."""
    return re.sub(r"(?<!\\)((?:\\\\)*)%[^\n]*\n?[ \t]*", r"\1", source)


def _split(body: str, separator: str) -> list[str]:
    """`body` split at `separator` outside braces and \\verb, escaped characters kept whole."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            verb = re.match(r"\\verb(.)", body[i:])
            if verb and not verb.group(1).isalpha():
                end = body.find(verb.group(1), i + 6)
                i = len(body) if end < 0 else end + 1
                continue
            if depth == 0 and separator == "\\\\" and body.startswith("\\\\", i):
                parts.append(body[start:i])
                i += 2
                start = i
                continue
            i += 2
            continue
        if depth == 0 and c == separator:
            parts.append(body[start:i])
            start = i + 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        i += 1
    parts.append(body[start:])
    return parts


def _row_cells(row: str) -> list[Cell] | None:
    cells = []
    for raw in _split(row, "&"):
        colspan = 1
        multi = _MULTICOLUMN.match(raw)
        if multi:
            colspan = int(multi.group(1))
            inner = _split(raw[multi.end():], "}")
            if len(inner) < 2 or inner[1].strip():
                return None  # text after \multicolumn{..}{..}{..}
            raw = inner[0]
        text = latex_cell_text(raw)
        if text is None:
            return None
        cells.append(Cell(text, colspan))
    return cells


def parse_tabular(spec: str, body: str, limits: TableLimits = TableLimits()) -> Table | None:
    """The table a simple tabular shows, or None if any part of it is outside the simple subset."""
    columns = column_count(spec)
    if columns is None or "\\begin" in body or "\\end" in body:
        return None
    rows = []
    for raw in _split(body, "\\\\"):
        raw = _ROW_END.sub("", raw)  # what follows \\: * and [2pt]
        while match := _RULES.match(raw):
            raw = raw[match.end():]
        raw = raw.strip()
        if not raw:
            continue
        cells = _row_cells(raw)
        if cells is None or sum(c.colspan for c in cells) > columns:
            return None
        if any(c.text for c in cells):
            rows.append(cells)
    return accept(rows, limits)


def latex_tabulars(document: str, limits: TableLimits = TableLimits()) -> list[Tabular | None]:
    """One entry per `\\begin{tabular}` of `document` outside comments, in order: the simple
    tabular, or None."""
    found: list[Tabular | None] = []
    line, counted = 1, 0
    for begin in _BEGIN.finditer(document):
        line += document.count("\n", counted, begin.start())
        counted = begin.start()
        if _COMMENT.search(document, document.rfind("\n", 0, begin.start()) + 1, begin.start()):
            continue
        end = document.find("\\end{tabular}", begin.end())
        chunk = strip_comments(document[begin.end():end + len("\\end{tabular}")]) if end >= 0 else ""
        found.append(_tabular_at(chunk, 0, line, limits))
    return found


def _braced(text: str, i: int) -> int:
    """The index just past the group that opens at text[i] == "{", or -1 if it never closes."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        depth += (c == "{") - (c == "}")
        i += 1
        if depth == 0:
            return i
    return -1


def _tabular_at(text: str, i: int, line: int, limits: TableLimits) -> Tabular | None:
    option = re.match(r"\s*\[[tbc]\]", text[i:i + 16])
    if option:
        i += option.end()
    if not text.startswith("{", i) or (spec_end := _braced(text, i)) < 0:
        return None
    spec = text[i + 1:spec_end - 1]
    end = text.find("\\end{tabular}", spec_end)
    if end < 0 or "\\begin{tabular}" in text[spec_end:end]:
        return None
    body = text[spec_end:end]
    table = parse_tabular(spec, body, limits)
    if table is None:
        return None
    return Tabular("\\begin{tabular}{" + spec + "}" + body + "\\end{tabular}", table, line)


# ---------------------------------------------------------------- pdflatex rendering and items

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


def decode_tex(data: bytes) -> str:
    """UTF-8, else Latin-1 (which decodes any bytes; a wrong guess gives characters no kept cell
    can hold, and the image is set from the same decoded text as the target)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


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
