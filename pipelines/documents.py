"""Documents in, page images out: PDF (rendered with pypdfium2), PNG, JPEG, TIFF (every
frame), WebP.

The format is read from the bytes, never from the file name: a text file called `.png`
is refused as what it is. Every size is checked before anything is decoded (PIL's
`Image.open` and pdfium's page size read only headers), so a decompression bomb or a
poster-sized PDF page costs nothing but an error. Whatever goes wrong with a document
is a `DocumentError` that names the document and a reason code, so a caller processing
many documents can report it and carry on with the others.

PDFs are rendered with pypdfium2 (Apache/BSD), not PyMuPDF, whose AGPL licence would
bind everyone who ships this code.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageOps, ImageSequence, UnidentifiedImageError

# Why a document could not be read; stable strings, part of the JSON/CLI output.
REASONS = ("empty_file", "unsupported_format", "corrupt", "encrypted", "too_large", "no_pages", "unreadable")

FORMATS = ("pdf", "png", "jpeg", "tiff", "webp")


class DocumentError(Exception):
    """One document could not be turned into pages."""

    def __init__(self, document_id: str, reason: str, message: str):
        if reason not in REASONS:
            raise ValueError(f"unknown reason {reason!r}")
        super().__init__(f"{document_id}: {message}")
        self.document_id = document_id
        self.reason = reason
        self.message = message

    def to_dict(self) -> dict:
        return {"reason": self.reason, "message": self.message}


def png_bytes(image: Image.Image) -> bytes:
    """PNG, grayscale when the image has no colour (synthetic crops and most pages never do):
    a fraction of the size."""
    rgb = image.convert("RGB")
    r, g, b = rgb.split()
    gray = r if r.tobytes() == g.tobytes() == b.tobytes() else None
    buffer = io.BytesIO()
    (gray if gray is not None else rgb).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def limit_message(what: str, amount: int | str, limit: int, unit: str, setting: str) -> str:
    """The one wording of every size-limit error, here and in the HTTP API:
    "<what> is <amount> <unit>; the limit is <limit> <unit> (<setting>)", `setting` naming what
    raises the limit. `unit` is singular ("byte", "page", "pixel"); a count other than 1 gets an s."""
    def counted(number) -> str:
        return f"{number} {unit}" if number == 1 else f"{number} {unit}s"

    return f"{what} is {counted(amount)}; the limit is {counted(limit)} ({setting})"


@dataclass(frozen=True)
class DocumentLimits:
    """What one document may ask of us. The pixel limit applies to every page, whether an
    image frame (refused when larger) or a rendered PDF page (rendered at a lower DPI to fit)."""

    max_page_pixels: int = 100_000_000  # 100 MP: an A0 poster at 150 DPI is 35 MP
    max_pages: int = 2000
    max_bytes: int = 1 << 30


@dataclass
class Page:
    """One page image of one document; `page_number` counts from 1."""

    document_id: str
    page_number: int
    image: Image.Image  # RGB
    width: int
    height: int
    dpi: float | None = None  # render DPI for PDF pages; the file's DPI (if any) for images
    source_format: str = ""


def sniff_format(data: bytes) -> str | None:
    """The real format of `data` from its magic bytes, or None."""
    head = data[:16]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "tiff"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    # The PDF header may follow some junk; readers accept it within the first KiB.
    if b"%PDF-" in data[:1024]:
        return "pdf"
    return None


def _describe_unknown(data: bytes) -> str:
    sample = data[:512]
    try:
        sample.decode("utf-8")
        return "content is plain text, not a PDF or image"
    except UnicodeDecodeError:
        return f"unrecognised content (starts with {data[:8].hex()})"


class OpenedDocument:
    """A document whose header has been read and checked: its page count is known and its
    pages render one at a time (a 500-page PDF never sits in memory as 500 images)."""

    def __init__(self, document_id: str, data: bytes, dpi: float = 150, limits: DocumentLimits = DocumentLimits()):
        self.document_id = document_id
        self.dpi = dpi
        self.limits = limits
        if dpi <= 0:
            raise ValueError(f"dpi must be positive, got {dpi}")
        if len(data) == 0:
            raise DocumentError(document_id, "empty_file", "the file is empty (0 bytes)")
        if len(data) > limits.max_bytes:
            raise DocumentError(document_id, "too_large", limit_message("the file", len(data), limits.max_bytes, "byte",
                                                                        "DocumentLimits.max_bytes"))
        self.format = sniff_format(data)
        if self.format is None:
            raise DocumentError(document_id, "unsupported_format",
                                f"{_describe_unknown(data)}; expected one of {', '.join(FORMATS)}")
        self._data = data
        if self.format == "pdf":
            self._pdf = _open_pdf(document_id, data)
            self.page_count = len(self._pdf)
        else:
            self._image = _open_image(document_id, data, self.format, limits)
            try:
                self.page_count = getattr(self._image, "n_frames", 1)  # TIFF: walks the frame chain
            except Exception as error:  # noqa: BLE001 - PIL raises many kinds on damaged files
                raise DocumentError(document_id, "corrupt", f"the {self.format.upper()} frames cannot be "
                                                            f"counted: {error}") from error
        if self.page_count == 0:
            raise DocumentError(document_id, "no_pages", "the document has no pages")
        if self.page_count > limits.max_pages:
            raise DocumentError(document_id, "too_large", limit_message("the document", self.page_count,
                                                                        limits.max_pages, "page",
                                                                        "DocumentLimits.max_pages"))

    def pages(self) -> Iterator[Page]:
        if self.format == "pdf":
            for index in range(self.page_count):
                yield self._render_pdf_page(index)
        else:
            yield from self._image_frames()

    def _render_pdf_page(self, index: int) -> Page:
        import pypdfium2 as pdfium

        try:
            page = self._pdf[index]
            width_pt, height_pt = page.get_size()
            if width_pt <= 0 or height_pt <= 0:
                raise DocumentError(self.document_id, "corrupt", f"page {index + 1} has no area")
            dpi = self.dpi
            pixels = (width_pt / 72 * dpi) * (height_pt / 72 * dpi)
            if pixels > self.limits.max_page_pixels:  # a poster: render it smaller, do not refuse it
                dpi = dpi * (self.limits.max_page_pixels / pixels) ** 0.5
            bitmap = page.render(scale=dpi / 72, fill_color=(255, 255, 255, 255))
            image = bitmap.to_pil().convert("RGB")
            bitmap.close()
            page.close()
        except pdfium.PdfiumError as error:
            raise DocumentError(self.document_id, "corrupt", f"page {index + 1} cannot be rendered: {error}") from error
        return Page(self.document_id, index + 1, image, image.width, image.height, dpi, "pdf")

    def _image_frames(self) -> Iterator[Page]:
        image = self._image
        file_dpi = image.info.get("dpi", (None,))[0]
        frames = ImageSequence.Iterator(image)
        for index in range(self.page_count):
            try:
                frame = frames[index]
            except Exception as error:  # noqa: BLE001 - PIL raises many kinds on damaged files
                raise DocumentError(self.document_id, "corrupt", f"page {index + 1} cannot be read: {error}") from error
            width, height = frame.size
            if width * height > self.limits.max_page_pixels:
                raise DocumentError(self.document_id, "too_large",
                                    limit_message(f"page {index + 1} ({width}x{height})", width * height,
                                                  self.limits.max_page_pixels, "pixel",
                                                  "DocumentLimits.max_page_pixels"))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                    rgb = _to_rgb(frame)
            except Exception as error:  # noqa: BLE001 - truncated or damaged pixel data, in many guises
                raise DocumentError(self.document_id, "corrupt",
                                    f"page {index + 1} cannot be decoded: {error}") from error
            yield Page(self.document_id, index + 1, rgb, rgb.width, rgb.height,
                       float(file_dpi) if file_dpi else None, self.format)


def _to_rgb(frame: Image.Image) -> Image.Image:
    frame.load()
    frame = ImageOps.exif_transpose(frame)  # phone photos of pages carry their rotation in EXIF
    if frame.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # 16-bit and float scans: stretch to 8 bit
        low, high = frame.getextrema()
        scale = 255.0 / (high - low) if high > low else 1.0
        frame = frame.convert("F").point(lambda value: (value - low) * scale).convert("L")
    if frame.mode in ("RGBA", "LA", "PA") or (frame.mode == "P" and "transparency" in frame.info):
        rgba = frame.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))  # transparent ink-less areas read as paper
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return frame.convert("RGB")


def _open_image(document_id: str, data: bytes, fmt: str, limits: DocumentLimits) -> Image.Image:
    """Read the header only; every frame's size is checked before its pixels are decoded.
    PIL's own bomb guard (an error over twice `Image.MAX_IMAGE_PIXELS`) stays in place."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit decides
            image = Image.open(io.BytesIO(data), formats=[fmt.upper()])
    except Image.DecompressionBombError as error:
        raise DocumentError(document_id, "too_large", _bomb_message(error, limits)) from error
    except UnidentifiedImageError as error:
        raise DocumentError(document_id, "corrupt", f"starts like a {fmt.upper()} file but is not a valid one") from error
    except Exception as error:  # noqa: BLE001 - PIL raises many kinds on damaged headers
        raise DocumentError(document_id, "corrupt", f"the {fmt.upper()} header cannot be read: {error}") from error
    width, height = image.size
    if width == 0 or height == 0:
        raise DocumentError(document_id, "corrupt", f"the image is {width}x{height}")
    return image


def _bomb_message(error: Image.DecompressionBombError, limits: DocumentLimits) -> str:
    """PIL refused the header: said as our own limit is, in pixels, naming whichever limit is lower."""
    pil_limit = 2 * (Image.MAX_IMAGE_PIXELS or 0)
    limit, setting = ((limits.max_page_pixels, "DocumentLimits.max_page_pixels")
                      if not pil_limit or limits.max_page_pixels <= pil_limit
                      else (pil_limit, "twice PIL.Image.MAX_IMAGE_PIXELS"))
    found = re.search(r"\((\d+) pixels\)", str(error))
    return limit_message("the image", int(found.group(1)) if found else f"over {pil_limit}", limit, "pixel", setting)


# What a failed open means is read from the file itself: pdfium reports its *last* error,
# which a load that fails without setting one (an empty page tree) leaves stale.
_ENCRYPT_ENTRY = re.compile(rb"/Encrypt\b")
_EMPTY_PAGE_TREE = re.compile(rb"/Count\s+0\b")
_ANY_PAGE = re.compile(rb"/Type\s*/Page(?!s)")


def _open_pdf(document_id: str, data: bytes):
    import pypdfium2 as pdfium

    try:
        return pdfium.PdfDocument(data)
    except pdfium.PdfiumError as error:
        if _ENCRYPT_ENTRY.search(data):
            raise DocumentError(document_id, "encrypted",
                                "the PDF is encrypted (password-protected); decrypt it first") from error
        if _EMPTY_PAGE_TREE.search(data) and not _ANY_PAGE.search(data):
            raise DocumentError(document_id, "no_pages", "the PDF has no pages") from error
        raise DocumentError(document_id, "corrupt",
                            "the PDF is damaged or truncated and cannot be opened") from error


def open_document(document_id: str, data: bytes, dpi: float = 150,
                  limits: DocumentLimits = DocumentLimits()) -> OpenedDocument:
    """Check a document's header; raises DocumentError. Render its pages with `.pages()`."""
    return OpenedDocument(document_id, data, dpi, limits)


def load_pages(document_id: str, data: bytes, dpi: float = 150,
               limits: DocumentLimits = DocumentLimits()) -> list[Page]:
    """All pages of one document at once (small documents, tests)."""
    return list(open_document(document_id, data, dpi, limits).pages())


def read_file(path: str | Path, document_id: str | None = None,
              limits: DocumentLimits = DocumentLimits()) -> tuple[str, bytes]:
    """(document id, bytes) of a local file; an unreadable or oversized file is a DocumentError."""
    path = Path(path)
    document_id = document_id or str(path)
    try:
        size = path.stat().st_size
        if size > limits.max_bytes:
            raise DocumentError(document_id, "too_large", limit_message("the file", size, limits.max_bytes, "byte",
                                                                        "DocumentLimits.max_bytes"))
        return document_id, path.read_bytes()
    except OSError as error:
        raise DocumentError(document_id, "unreadable", f"cannot read the file: {error.strerror or error}") from error
