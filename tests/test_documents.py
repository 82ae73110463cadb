"""Documents to pages: formats read from bytes, page numbering, DPI, and a clear
per-document error for every kind of bad input."""

from __future__ import annotations

import io
import time

import pypdfium2 as pdfium
import pytest
from PIL import Image

from document_fixtures import bad_documents, bomb_png, png_bytes, three_page_pdf, multi_page_tiff  # noqa: F401
from gravityocr.pipelines.documents import (
    DocumentError,
    DocumentLimits,
    load_pages,
    open_document,
    read_file,
    sniff_format,
)
from gravityocr.corpus.synthetic_pages import PAGE_HEIGHT, PAGE_WIDTH, single_column_page


def test_three_page_pdf_renders_every_page_at_the_dpi(three_page_pdf):
    data, truth = three_page_pdf
    pages = load_pages("report.pdf", data, dpi=75)
    assert [(p.document_id, p.page_number) for p in pages] == [("report.pdf", 1), ("report.pdf", 2), ("report.pdf", 3)]
    for page in pages:  # the PDF was written at 150 DPI: at 75 DPI every side halves
        assert page.image.mode == "RGB"
        assert (page.width, page.height) == page.image.size
        assert abs(page.width - PAGE_WIDTH / 2) <= 1 and abs(page.height - PAGE_HEIGHT / 2) <= 1
        assert page.dpi == 75 and page.source_format == "pdf"


def test_multi_page_tiff_gives_every_frame(multi_page_tiff):
    data, truth = multi_page_tiff
    pages = load_pages("scan.tiff", data)
    assert [p.page_number for p in pages] == [1, 2]
    assert all(p.image.size == (PAGE_WIDTH, PAGE_HEIGHT) and p.source_format == "tiff" for p in pages)
    assert pages[0].dpi == pytest.approx(150)
    assert pages[1].image.tobytes() == truth[1].image.convert("RGB").tobytes()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_single_image_formats(fmt):
    image = single_column_page(seed=3).image.resize((620, 877))
    out = io.BytesIO()
    image.save(out, fmt)
    (page,) = load_pages(f"page.{fmt.lower()}", out.getvalue())
    assert page.page_number == 1 and page.image.size == (620, 877) and page.image.mode == "RGB"


def test_format_comes_from_the_bytes_not_the_name():
    image = Image.new("RGB", (40, 30), "white")
    out = io.BytesIO()
    image.save(out, "JPEG")
    (page,) = load_pages("misnamed.png", out.getvalue())
    assert page.source_format == "jpeg"
    assert sniff_format(b"junk before the header %PDF-1.7\n") == "pdf"
    assert sniff_format(b"GIF89a....") is None


def test_transparent_png_reads_as_black_on_white():
    image = Image.new("RGBA", (20, 10), (0, 0, 0, 0))
    image.putpixel((5, 5), (0, 0, 0, 255))
    (page,) = load_pages("alpha.png", png_bytes(image))
    assert page.image.getpixel((0, 0)) == (255, 255, 255) and page.image.getpixel((5, 5)) == (0, 0, 0)


@pytest.mark.parametrize("name", ["truncated.pdf", "encrypted.pdf", "zero-pages.pdf", "empty.png", "bomb.png",
                                  "notes.png"])
def test_bad_input_is_a_clear_document_error(bad_documents, name):
    data, reason = bad_documents[name]
    start = time.perf_counter()
    with pytest.raises(DocumentError) as caught:
        load_pages(name, data)
    assert caught.value.reason == reason
    assert caught.value.document_id == name
    assert name in str(caught.value) and len(caught.value.message) > 10
    assert time.perf_counter() - start < 5  # refused from the header, never decoded


def test_bomb_is_refused_before_any_pixel_is_decoded():
    data = bomb_png()
    assert len(data) < 1_000_000
    with pytest.raises(DocumentError) as caught:
        open_document("bomb.png", data)
    assert caught.value.reason == "too_large"
    # PIL's own guard fired on the header; said as ours is, naming our (lower) limit
    assert caught.value.message == ("the image is 900000000 pixels; the limit is 100000000 pixels "
                                    "(DocumentLimits.max_page_pixels)")


def test_our_pixel_limit_applies_under_pil_own():
    data = png_bytes(Image.new("L", (400, 300), 255))
    with pytest.raises(DocumentError) as caught:
        load_pages("big.png", data, limits=DocumentLimits(max_page_pixels=100_000))
    assert caught.value.reason == "too_large"
    assert caught.value.message == ("page 1 (400x300) is 120000 pixels; the limit is 100000 pixels "
                                    "(DocumentLimits.max_page_pixels)")


def test_page_count_limit(three_page_pdf):
    with pytest.raises(DocumentError) as caught:
        open_document("long.pdf", three_page_pdf[0], limits=DocumentLimits(max_pages=2))
    assert caught.value.reason == "too_large"
    assert caught.value.message == "the document is 3 pages; the limit is 2 pages (DocumentLimits.max_pages)"


def test_poster_pdf_page_is_rendered_smaller_not_refused():
    pdf = pdfium.PdfDocument.new()
    pdf.new_page(72 * 100, 72 * 100)  # 100 x 100 inches: 15000 x 15000 px at 150 DPI
    out = io.BytesIO()
    pdf.save(out)
    (page,) = load_pages("poster.pdf", out.getvalue(), limits=DocumentLimits(max_page_pixels=4_000_000))
    assert page.width * page.height <= 4_000_000 and page.dpi < 150
    assert page.width == pytest.approx(2000, abs=2)


def test_truncated_image_is_corrupt():
    data = png_bytes(single_column_page(seed=5).image)
    with pytest.raises(DocumentError) as caught:
        load_pages("cut.png", data[: len(data) // 3])
    assert caught.value.reason == "corrupt"


def test_read_file_errors(tmp_path):
    with pytest.raises(DocumentError) as caught:
        read_file(tmp_path / "missing.pdf")
    assert caught.value.reason == "unreadable"
    path = tmp_path / "a.png"
    path.write_bytes(b"12345")
    assert read_file(path) == (str(path), b"12345")
    with pytest.raises(DocumentError) as caught:
        read_file(path, limits=DocumentLimits(max_bytes=4))
    assert caught.value.reason == "too_large"
    assert caught.value.message == "the file is 5 bytes; the limit is 4 bytes (DocumentLimits.max_bytes)"
    with pytest.raises(DocumentError) as caught:
        open_document("a.png", b"12345", limits=DocumentLimits(max_bytes=1))
    assert caught.value.message == "the file is 5 bytes; the limit is 1 byte (DocumentLimits.max_bytes)"


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")
def test_damaged_tiff_is_corrupt_not_a_crash(multi_page_tiff):
    data, _ = multi_page_tiff
    for cut in (len(data) // 2, 100):
        with pytest.raises(DocumentError) as caught:
            load_pages("scan.tiff", data[:cut])
        assert caught.value.reason == "corrupt"
