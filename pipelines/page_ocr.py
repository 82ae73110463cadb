"""Whole documents through the recogniser, in-process: documents -> pages -> layout ->
crops with a task by region type -> one recogniser call for all regions of a batch of
pages (of any documents) -> page results -> document results.

Errors stay with their document: a file that cannot be read, decoded or rendered is a
`DocumentResult` with `error` set, and the documents around it are processed as usual.
Pages are rendered lazily and batched across documents, so a 500-page PDF never sits in
memory whole and fifty one-page PNGs still make one engine batch.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from gravityocr.pipelines.assembly import LineResult, PageResult, RegionResult, document_json, document_markdown, join_lines, sum_stats
from gravityocr.pipelines.deskew import straighten
from gravityocr.pipelines.documents import DocumentError, DocumentLimits, Page, open_document, read_file
from gravityocr.pipelines.illumination import normalise
from gravityocr.pipelines.inverted import light_on_dark
from gravityocr.pipelines.layout import LAYOUT_BACKENDS, LINE_SPLITTERS, layout_page, make_layout, make_line_splitter
from gravityocr.pipelines.line_splitters import NoLines
from gravityocr.pipelines.regions import TEXT_TYPES, Box, LayoutBackend, LineSplitter, PageStats, Region, ink_mask, \
    marks_only, paper_colour
from gravityocr.pipelines.tables import TableGrid, table_grid, table_html

if TYPE_CHECKING:  # torch loads with the recogniser, not with the settings (the CLIs' defaults are read here)
    from gravityocr.pipelines.recognizer import CropRecognizer, CropResult, Submit

log = logging.getLogger(__name__)

# What each region type is read as; a figure is a picture, whose words alone are read (with the
# text prompt, line by line: its alt text; pipelines/figures.py). Text regions are read line by line
# with the text prompt; a table's cells too, line by line (its HTML is assembled from its grid,
# pipelines/tables.py), unless the line splitter is "none": then it is read whole with the
# table prompt, as a formula is with the formula prompt.
TASK_BY_TYPE = {**{kind: "text" for kind in TEXT_TYPES}, "table": "table", "formula": "formula"}

DocumentSource = str | Path | tuple[str, bytes]

# A page holding at least SOME_TEXT glyphs of ink (`ink_glyphs`) whose reading gives fewer
# than NEARLY_NOTHING characters a glyph says so (`PageResult.warnings`): a photo or scan the
# layout could not part, a page in the dark, ink the recogniser cannot make out. A page read
# well gives about one character a glyph (an i's dot and two letters that touch about cancel
# out), lit evenly or not: the glyphs are counted under a threshold that follows the paper.
NEARLY_NOTHING = 0.25
SOME_TEXT = 50


@dataclass(frozen=True)
class PageOcrConfig:
    """The one page-settings object, nested in the batch job's config and serve's settings:
    `gravityocr ocr`, `gravityocr batch` and serve read pages with it (its flags:
    `add_page_arguments`; a config's `page:` mapping: `from_mapping`). A value that cannot
    work is a ValueError when it is made."""

    dpi: float = 150
    layout: str = "projection"  # see layout.LAYOUT_BACKENDS
    lines: str = "projection"  # see layout.LINE_SPLITTERS
    # Page pixels of margin around every crop. Crops keep the page's scale: the recogniser's
    # processor brings every crop to the scale it reads (one normalisation for every entry
    # point, so a line reads the same from a page, from `eval` and from serve).
    padding: int = 4
    batch_pages: int = 8  # pages whose regions form one recogniser call
    limits: DocumentLimits = field(default_factory=DocumentLimits)

    def __post_init__(self):
        if self.layout not in LAYOUT_BACKENDS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUT_BACKENDS)}, got {self.layout!r}")
        if self.lines not in LINE_SPLITTERS:
            raise ValueError(f"lines must be one of {', '.join(LINE_SPLITTERS)}, got {self.lines!r}")
        if not self.dpi > 0 or self.batch_pages < 1:
            raise ValueError(f"dpi must be positive and batch_pages at least 1, got {self.dpi}, {self.batch_pages}")

    @classmethod
    def from_mapping(cls, values: dict | None) -> "PageOcrConfig":
        """A config file's `page:` mapping (unset keys: the defaults); unknown keys are refused."""
        values = dict(values or {})
        known = {"dpi", "layout", "lines", "padding", "batch_pages"}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown page settings {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)

    @classmethod
    def from_args(cls, args, **values) -> "PageOcrConfig":
        """The settings a command's `add_page_arguments` flags (and `values`) give."""
        return cls(**values).overridden(**{name: getattr(args, name, None) for name in ("dpi", "layout", "lines")})

    def overridden(self, **flags) -> "PageOcrConfig":
        """These settings with each flag that was given (not None) in its place."""
        return dataclasses.replace(self, **{name: value for name, value in flags.items() if value is not None})


@dataclass
class DocumentResult:
    document_id: str
    pages: list[PageResult] = field(default_factory=list)
    error: DocumentError | None = None
    format: str | None = None
    page_count: int = 0  # pages the document has (pages may be fewer if it failed part-way)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict:
        return document_json(self.document_id, self.pages, self.error.to_dict() if self.error else None, self.format)

    def to_markdown(self, figure_prefix: str | None = None) -> str:
        """`figure_prefix`: None (no output folder) leaves figures out; else their relative
        folder, as `assembly.figure_prefix_for` gives it."""
        return document_markdown(self.pages, figure_prefix, error=self.error.to_dict() if self.error else None)


@dataclass
class _Pending:
    result: DocumentResult
    in_flight: int = 0  # pages in the current batch, not yet read
    loaded: bool = False  # every page has been handed to a batch (or the document failed)


@dataclass
class Crop:
    """One crop of a laid-out page to read: a whole region, or one line of a text region or
    of a table's cell."""

    region: int  # index in the page's regions
    line: Box | None  # the line's box, None for a whole-region crop
    image: Image.Image
    task: str
    cell: int | None = None  # a table cell's line: the cell's index in its region's grid


@dataclass
class PagePlan:
    """A laid-out page before it is read: its result with every region still unread
    (figures already cut), and its crops in reading order. `PagePlanner.plan` makes it,
    `PagePlanner.fill` turns it and the crops' results into the page's result; the batch job
    runs the two in different stages."""

    result: PageResult
    crops: list[Crop]
    tables: dict[int, TableGrid] = field(default_factory=dict)  # by region index: the grids read by cell
    glyphs: int = 0  # about how many characters of ink the page holds outside its pictures (`ink_glyphs`)


def add_page_arguments(parser, *, dpi: bool = True, defaults_from: str | None = None) -> None:
    """`--dpi`, `--layout` and `--lines`, the page settings (`PageOcrConfig`), as every command
    that reads pages takes them. `defaults_from`: where an unset flag's value comes from
    instead of `PageOcrConfig` (serve: its config), the flags then default to None."""
    def default(value) -> str:
        return f"default: {defaults_from}" if defaults_from else f"default: {value}"

    if dpi:
        parser.add_argument("--dpi", type=float, default=None if defaults_from else PageOcrConfig.dpi,
                            help=f"PDF render resolution ({default(f'{PageOcrConfig.dpi:g}')})")
    parser.add_argument("--layout", choices=LAYOUT_BACKENDS, default=None if defaults_from else PageOcrConfig.layout,
                        help=f"layout backend ({default(PageOcrConfig.layout)}; rapid: the bundled layout model)")
    parser.add_argument("--lines", choices=LINE_SPLITTERS, default=None if defaults_from else PageOcrConfig.lines,
                        help=f"how text regions are split into lines ({default(PageOcrConfig.lines)})")


class PagePlanner:
    """The model-free half of reading a page: its layout and crops (`plan`), and its result
    from what its crops read (`fill`). The batch job runs it in CPU tasks of its own; the
    engine actors only read crops."""

    def __init__(self, config: PageOcrConfig | None = None, layout: LayoutBackend | None = None,
                 lines: LineSplitter | None = None):
        self.config = config or PageOcrConfig()
        self.layout = layout or make_layout(self.config.layout)
        self.lines = lines or make_line_splitter(self.config.lines)

    def plan(self, page: Page, regions: list[Region] | None = None) -> PagePlan:
        """The page laid out and cut into crops; a layout failure is the page's error. Before
        layout its image is prepared, here alone for every entry point: uneven light evened
        out (pipelines/illumination.py), skew straightened (deskew.py), light text on a dark
        ground turned dark on light (inverted.py). `regions`: the page's regions when the
        caller knows them (an image of one table): layout is skipped, and straightening too
        unless every region is the whole image."""
        start = time.perf_counter()
        error, image, rotation = None, page.image, 0.0
        try:
            # uneven light or faint ink evened out first (an evenly lit, dark-inked page is
            # left as it is): the ink mask below, and all that is found from it, needs it
            image = normalise(image)
            mask = ink_mask(image)
            whole = (0, 0, image.width, image.height)
            if regions is None or all(region.bbox == whole for region in regions):
                # a page, or an image that is one region (a table's): straightened if it was
                # scanned askew (a table's rules then run along rows), its size kept
                image, rotation = straighten(image, mask)
                mask = ink_mask(image) if rotation else mask
            # light text on a dark ground is read from an image where it is dark on light;
            # figures are cut from the page as it is
            as_is, image = image, light_on_dark(image, mask)
            mask = mask if image is as_is else ink_mask(image)
            if regions is None:  # a page is laid out
                regions = layout_page(image, self.layout, self.lines, mask)
            tables = self._table_grids(image, mask, regions)
            line_height = PageStats.of(mask).line_height
        except Exception as failure:  # noqa: BLE001 - the page is reported, the others go on
            regions, tables, error = [], {}, f"layout failed: {type(failure).__name__}: {failure}"
        # a line or a region of marks alone is not read (layout.marks_only): a run of dots
        # says less than nothing. A table's cells are all read: the page's line height says
        # nothing of a table's own text, and a lone "." in a cell is the cell's content.
        readable = lambda line: not marks_only(mask, line, line_height)
        result = PageResult(page.document_id, page.page_number, page.width, page.height, page.dpi,
                            self.layout.name, seconds={"layout": time.perf_counter() - start}, error=error,
                            rotation=rotation)
        reads_lines = not isinstance(self.lines, NoLines)
        crops = []
        for index, region in enumerate(regions):
            task = TASK_BY_TYPE.get(region.type)
            result.regions.append(RegionResult(region.order, region.type, region.bbox, region.score, task))
            if region.type == "figure":  # a picture; the words in it (its lines) are its text
                result.regions[-1].image = as_is.crop(region.bbox)
                lines = [line for line in region.lines if readable(line)] if reads_lines else []
                if lines:
                    result.regions[-1].task = "text"
                    crops += [Crop(index, line, self._crop(image, line), "text") for line in lines]
            elif region.type in TEXT_TYPES and reads_lines:
                crops += [Crop(index, line, self._crop(image, line), task) for line in region.lines if readable(line)]
            elif index in tables:
                grid, clean = tables[index]
                crops += [Crop(index, line, self._crop(clean, line, region.bbox), "text", cell)
                          for cell, table_cell in enumerate(grid.cells) for line in table_cell.lines]
            elif task is not None and readable(region.bbox):
                crops.append(Crop(index, None, self._crop(image, region.bbox), task))
        # a picture's ink is not counted as text (but a page that is one picture may be a
        # photo of text that could not be parted)
        page_area = image.width * image.height
        pictures = [r.bbox for r in regions
                    if r.type == "figure" and (r.bbox[2] - r.bbox[0]) * (r.bbox[3] - r.bbox[1]) < 0.5 * page_area]
        glyphs = ink_glyphs(image, pictures) if error is None else 0
        return PagePlan(result, crops, {index: grid for index, (grid, _) in tables.items()}, glyphs)

    def _table_grids(self, image: Image.Image, mask: np.ndarray,
                     regions: list[Region]) -> dict[int, tuple[TableGrid, Image.Image]]:
        """The grid of every table region (unless lines are not split), with the page's image
        where the table's rules are painted over with paper, for cutting its cells' lines
        (`mask`: the page's ink)."""
        if isinstance(self.lines, NoLines) or not any(region.type == "table" for region in regions):
            return {}
        pixels = np.asarray(image.convert("RGB")).copy()
        tables = {}
        for index, region in enumerate(regions):
            if region.type == "table":
                grid, rules = table_grid(mask, region.bbox)
                x0, y0, x1, y1 = region.bbox
                area = pixels[y0:y1, x0:x1]
                area[rules] = paper_colour(area, mask[y0:y1, x0:x1])
                tables[index] = grid
        clean = Image.fromarray(pixels)
        return {index: (grid, clean) for index, grid in tables.items()}

    @staticmethod
    def fill(plan: PagePlan, read: list[CropResult], recognition_seconds: float) -> PageResult:
        """The page's result: each region's text from its crops' results (`read`, in the
        order of `plan.crops`), lines joined into paragraphs, a table's cells' lines into
        its cells' text and its grid into HTML."""
        result = plan.result
        by_region: dict[int, list[tuple[Crop, CropResult]]] = {}
        for crop, cr in zip(plan.crops, read):
            by_region.setdefault(crop.region, []).append((crop, cr))
        for index, region in enumerate(result.regions):
            mine = by_region.get(index, [])
            if region.type == "figure" and not mine:
                continue  # a picture without words: not read
            if index in plan.tables or (mine and mine[0][0].line is not None):
                region.lines = [LineResult(crop.line, cr.text.strip(), cr.stats_dict(), cr.error) for crop, cr in mine]
                good = [line for line in region.lines if line.error is None]
                if index in plan.tables:
                    grid = plan.tables[index]
                    cells: list[list[str]] = [[] for _ in grid.cells]
                    for (crop, _), line in zip(mine, region.lines):
                        if line.error is None:
                            cells[crop.cell].append(line.text)
                    region.text = table_html(grid, [join_lines(texts) for texts in cells])
                else:
                    region.text = join_lines([line.text for line in good])
                region.stats = sum_stats([line.stats for line in good])
                if mine and not good:
                    region.error = f"no line could be read: {region.lines[0].error}"
            elif mine:
                cr = mine[0][1]
                text = cr.text.strip()
                region.text = join_lines(text.splitlines()) if region.type in TEXT_TYPES else text
                region.stats, region.error = cr.stats_dict(), cr.error
            else:
                region.text = ""  # a text region without ink lines: nothing to read
        result.seconds["recognition"] = recognition_seconds
        result.seconds["total"] = result.seconds["layout"] + recognition_seconds
        characters = sum(len("".join(cr.text.split())) for cr in read)
        if plan.glyphs >= SOME_TEXT and characters < NEARLY_NOTHING * plan.glyphs:
            result.warnings.append(f"almost nothing read: {characters} characters for about {plan.glyphs} glyphs "
                                   f"of ink; the page may be too dim, blurred or unevenly lit to read")
        return result

    def _crop(self, image: Image.Image, box: Box, within: Box | None = None) -> Image.Image:
        """`box` with the configured margin, kept inside `within` (default: the image)."""
        pad = self.config.padding
        x0, y0, x1, y1 = box
        left, top, right, bottom = within or (0, 0, image.width, image.height)
        return image.crop((max(left, x0 - pad), max(top, y0 - pad), min(right, x1 + pad), min(bottom, y1 + pad)))


class PageOcr:
    """Documents and pages through layout (`PagePlanner`) and one recogniser."""

    def __init__(self, recognizer: CropRecognizer, config: PageOcrConfig | None = None,
                 layout: LayoutBackend | None = None, lines: LineSplitter | None = None):
        self.recognizer = recognizer
        self.config = config or PageOcrConfig()
        self.planner = PagePlanner(self.config, layout, lines)

    # --- documents ---------------------------------------------------------------------

    def run(self, sources: Iterable[DocumentSource],
            on_open: Callable[[DocumentResult], None] | None = None,
            on_page: Callable[[PageResult], None] | None = None) -> Iterator[DocumentResult]:
        """Document results in the order of `sources`, each as soon as all its pages are read.
        `on_open` sees each document once its page count is known; `on_page` each page read."""
        pending: deque[_Pending] = deque()
        batch: list[tuple[Page, _Pending]] = []

        def flush() -> None:
            if not batch:
                return
            results = self.read_pages([page for page, _ in batch], on_page=on_page)
            for (_, state), page_result in zip(batch, results):
                state.result.pages.append(page_result)
                state.in_flight -= 1
            batch.clear()

        def completed() -> Iterator[DocumentResult]:
            while pending and pending[0].loaded and pending[0].in_flight == 0:
                yield pending.popleft().result

        for source in sources:
            state = _Pending(DocumentResult(_source_id(source)))
            pending.append(state)
            try:
                document_id, data = source if isinstance(source, tuple) else read_file(source, limits=self.config.limits)
                opened = open_document(document_id, data, self.config.dpi, self.config.limits)
                state.result.format, state.result.page_count = opened.format, opened.page_count
                if on_open:
                    on_open(state.result)
                for page in opened.pages():
                    batch.append((page, state))
                    state.in_flight += 1
                    if len(batch) >= self.config.batch_pages:
                        flush()
                        yield from completed()
            except Exception as error:  # noqa: BLE001 - one bad document must not end the run
                if not isinstance(error, DocumentError):
                    error = DocumentError(state.result.document_id, "corrupt",
                                          f"unexpected {type(error).__name__} while reading it: {error}")
                state.result.error = error
                if on_open and state.result.page_count == 0:
                    on_open(state.result)
            state.loaded = True
            yield from completed()
        flush()
        yield from completed()

    # --- pages -------------------------------------------------------------------------

    def read_pages(self, pages: list[Page], submit: Submit | None = None,
                   regions: list[list[Region]] | None = None,
                   on_page: Callable[[PageResult], None] | None = None) -> list[PageResult]:
        """Layout of each page, its crops handed to the recogniser as soon as it is laid out,
        so the engine reads one page while the next is laid out. `submit`: where the crops'
        engine requests go (default: the recogniser's own loop); `regions`: each page's
        regions, when the caller knows them (`PagePlanner.plan`); `on_page` sees each page,
        in order, as soon as its own crops are read (the others' may still be decoding)."""
        plans, futures, start = [], [], None
        for n, page in enumerate(pages):
            plans.append(self.planner.plan(page, regions[n] if regions else None))
            start = start or time.perf_counter()
            futures.append(self._submit(plans[-1].crops, submit))
        results, read = [], 0
        for plan, mine in zip(plans, futures):
            crops = [future.result() for future in mine]
            read += len(crops)
            # the pages' time so far, shared by the crops read so far
            share = (time.perf_counter() - start) * len(crops) / max(1, read)
            results.append(self.planner.fill(plan, crops, share))
            if on_page:
                on_page(results[-1])
        return results

    def _submit(self, crops: list, submit: Submit | None) -> list:
        """The crops' futures; a recogniser that fails them all at once fails only them."""
        try:
            return self.recognizer.submit([(crop.image, crop.task) for crop in crops], submit)
        except Exception as error:  # noqa: BLE001 - one broken batch must not end the run
            from concurrent.futures import Future

            from gravityocr.pipelines.recognizer import CropResult

            log.exception("recogniser failed")
            futures = [Future() for _ in crops]
            for future in futures:
                future.set_result(CropResult("", error=f"recogniser failed: {type(error).__name__}: {error}"))
            return futures


def ink_glyphs(image: Image.Image, pictures: list[Box]) -> int:
    """About how many characters of ink a page holds outside its `pictures`: the components
    of its ink under a threshold that follows the paper's own brightness (a mean over 31 px,
    so uneven light does not hide them), glyph-sized (4 px high or more, under a twentieth of
    the page, 8 px of ink or more). About one a character on a page read well."""
    import cv2

    gray = np.asarray(image.convert("L"))
    ink = cv2.adaptiveThreshold(gray, 255, cv2.ADAPTIVE_THRESH_MEAN_C, cv2.THRESH_BINARY_INV, 31, 12)
    _, _, stats, centres = cv2.connectedComponentsWithStats(ink, connectivity=8)
    height, area = stats[1:, cv2.CC_STAT_HEIGHT], stats[1:, cv2.CC_STAT_AREA]
    glyph = (height >= 4) & (height <= gray.shape[0] / 20) & (area >= 8)
    x, y = centres[1:, 0], centres[1:, 1]
    for x0, y0, x1, y1 in pictures:
        glyph &= ~((x >= x0) & (x < x1) & (y >= y0) & (y < y1))
    return int(glyph.sum())


def _source_id(source: DocumentSource) -> str:
    return source[0] if isinstance(source, tuple) else str(source)
