"""Documents for the document/layout/page tests: generated good documents with known
regions, and the bad inputs a service meets (each built honestly: the truncated PDF is
a real PDF cut short, the encrypted one really is encrypted, the bomb is a valid PNG).

Imported by the test modules (fixtures are not in conftest.py, which others edit).
"""

from __future__ import annotations

import io
import struct
import zlib

import pytest
import torch

from gravityocr.model.network.configs import TINY, build_config
from gravityocr.model.network.loading import Recognizer, save_recognizer
from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration
from gravityocr.model.network.processor import OcrProcessor, make_image_processor
from gravityocr.model.network.tokenizer import build_char_tokenizer
from gravityocr.corpus.synthetic_pages import (
    pdf_bytes,
    single_column_page,
    table_formula_page,
    tiff_bytes,
    two_column_page,
)


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """A valid 1-bit greyscale PNG of width x height white pixels, about 100 KB: decoding
    it would take ~1 GB (PIL keeps one byte per pixel). Streamed, never held in memory."""
    row = b"\x00" + b"\xff" * ((width + 7) // 8)  # filter byte 0, then the packed pixels
    compressor = zlib.compressobj(9)
    chunks = [compressor.compress(row * 1000) for _ in range(height // 1000)]
    chunks.append(compressor.compress(row * (height % 1000)))
    chunks.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", b"".join(chunks))
            + png_chunk(b"IEND", b""))


def handmade_pdf(objects: list[str]) -> bytes:
    """A syntactically complete PDF (header, objects, xref table, trailer) from object bodies."""
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def zero_page_pdf() -> bytes:
    return handmade_pdf(["<< /Type /Catalog /Pages 2 0 R >>", "<< /Type /Pages /Kids [] /Count 0 >>"])


def encrypted_pdf(source: bytes) -> bytes:
    pypdf = pytest.importorskip("pypdf")
    writer = pypdf.PdfWriter(clone_from=io.BytesIO(source))
    writer.encrypt(user_password="open sesame", owner_password="owner", algorithm="AES-256")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def three_page_pages():
    return [single_column_page(seed=11, page_number=1), two_column_page(seed=12, page_number=2),
            table_formula_page(seed=13, page_number=3)]


def tiff_pages():
    return [single_column_page(seed=21, page_number=1), table_formula_page(seed=22, page_number=2)]


@pytest.fixture(scope="session")
def three_page_pdf():
    pages = three_page_pages()
    return pdf_bytes(pages), pages


@pytest.fixture(scope="session")
def multi_page_tiff():
    pages = tiff_pages()
    return tiff_bytes(pages), pages


def png_bytes(image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="session")
def bad_documents(three_page_pdf):
    """name -> (bytes, expected reason)."""
    pdf, _ = three_page_pdf
    return {
        "truncated.pdf": (pdf[: len(pdf) // 2], "corrupt"),
        "encrypted.pdf": (encrypted_pdf(pdf), "encrypted"),
        "zero-pages.pdf": (zero_page_pdf(), "no_pages"),
        "empty.png": (b"", "empty_file"),
        "bomb.png": (bomb_png(), "too_large"),
        "notes.png": (b"These are my notes, not an image.\nSecond line.\n", "unsupported_format"),
    }


def tiny_recognizer(seed: int = 0) -> Recognizer:
    """A random tiny recogniser in float32 with a processor capped at 64 visual tokens:
    it reads nothing, but every code path from crop to token runs."""
    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    model = GravityOcrForConditionalGeneration(build_config(tokenizer, TINY)).eval()
    return Recognizer(model, OcrProcessor(tokenizer, make_image_processor(max_pixels=28 * 28 * 64)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-recognizer")
    save_recognizer(tiny_recognizer(), directory)
    return directory
