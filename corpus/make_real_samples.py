"""Regenerates the real-document samples and their true texts (run from the repository root):

    python corpus/make_real_samples.py [--cache /work/cache/debian]

Each sample is one or more pages of a PDF that a Debian documentation package installs,
rendered with pdfium and labelled with the page's own text layer, read by the corpus
builder's code (corpus/pdf_text.py: the text layer's lines in its order, one per line;
ligatures unfolded; a hyphen at a line end kept as drawn). Where a text layer names other
glyphs than the page draws (math-font angle brackets come out as "h...i", a double prime
as "00"), the sample lists its corrections below, each checked by eye against the image.
The scan-like sample is a clean render degraded by the corpus builder's `scan_like`.

Packages are fetched and unpacked into the cache once (corpus/debian.py); packages
reserved for independent evaluation and those of our evaluation set (corpus/sources.py
EVALUATION) are refused. data/samples/README.md names each sample's package, file, page and
licence.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

import pypdfium2 as pdfium
from PIL import Image

from gravityocr.corpus.augment import scan_like
from gravityocr.corpus.debian import UnpackedPackage, check_not_reserved, fetch_package
from gravityocr.corpus.pdf_text import page_segments, render_page
from gravityocr.corpus.sources import EVALUATION

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = REPO / "samples"
TRUE_TEXTS = REPO / "data" / "samples"
DEFAULT_CACHE = Path("/work/cache/debian")
TEXLIVE_DOC = "usr/share/doc/texlive-doc/latex"


@dataclass(frozen=True)
class RealSample:
    name: str  # file name in samples/ (its true text: data/samples/<stem>.md)
    package: str
    file: str  # inside the unpacked package
    pages: tuple[int, ...]  # 1-based
    dpi: int
    # (page, wrong, right): the text layer's words where they differ from the drawn glyphs
    corrections: tuple[tuple[int, str, str], ...] = ()
    scan_seed: int | None = None  # degrade with corpus.augment.scan_like(Random(seed), steps=3)


SAMPLES = (
    # A born-digital manual page (Texinfo): a section heading, prose, monospace examples.
    RealSample("manual.png", "gnu-standards", "usr/share/doc/gnu-standards/standards.pdf.gz", (13,), 150),
    # A two-column journal page (TUGboat 32:2, LaTeX): running head, prose, code, bullets.
    RealSample("two-column.png", "texlive-latex-extra-doc", f"{TEXLIVE_DOC}/cals/tb101parashchenko.pdf", (8,), 200),
    # A ruled table and an inline formula (unit conversion) in a LaTeX package manual.
    RealSample("table-formula.png", "texlive-latex-extra-doc", f"{TEXLIVE_DOC}/numprint/numprint.pdf", (8,), 200,
               corrections=(
                   (8, "hunitnamei", "⟨unitname⟩"),  # CMSY angle brackets
                   (8, "huniti", "⟨unit⟩"),
                   (8, "hscalei", "⟨scale⟩"),
                   (8, "to print 00 as unit", "to print ″ as unit"),  # a double prime
                   (8, "4.913,1 in, 4.913,1\n00”.", "4.913,1 in, 4.913,1″”."),
               )),
    # A page as a scanner returns it: faded on tinted paper, blurred, skewed, a JPEG.
    RealSample("scanned.jpg", "gnu-standards", "usr/share/doc/gnu-standards/maintain.pdf.gz", (10,), 150, scan_seed=6),
    # Three consecutive pages in one multi-page TIFF, as a document scanner files them.
    RealSample("manual-pages.tif", "lilypond-doc-pdf",
               "usr/share/doc/lilypond/html/Documentation/usage.pdf", (10, 11, 12), 150),
)


def check_package(package: str) -> None:
    check_not_reserved(package)
    if any(package in packages for packages in EVALUATION.values()):
        raise ValueError(f"{package} feeds our evaluation set data/real (corpus/sources.py EVALUATION)")


# Old-style figures that fonts put in the private use area (U+F730-U+F739, Adobe's
# convention): the digits they draw.
OLD_STYLE_DIGITS = str.maketrans({chr(0xF730 + digit): str(digit) for digit in range(10)})


def page_text(page: pdfium.PdfPage) -> str:
    return "\n".join(segment.text for segment in page_segments(page)).translate(OLD_STYLE_DIGITS)


def corrected(sample: RealSample, number: int, text: str) -> str:
    for page, wrong, right in sample.corrections:
        if page == number:
            if wrong not in text:
                raise ValueError(f"{sample.name}: page {number} no longer reads {wrong!r}")
            text = text.replace(wrong, right)
    return text


def build(sample: RealSample, cache: Path) -> tuple[list[Image.Image], str]:
    check_package(sample.package)
    package = fetch_package(sample.package, cache)
    document = pdfium.PdfDocument(UnpackedPackage.read_bytes(package.root / sample.file))
    images, texts = [], []
    try:
        for number in sample.pages:
            page = document[number - 1]
            texts.append(corrected(sample, number, page_text(page)))
            images.append(render_page(page, sample.dpi))
    finally:
        document.close()
    return images, "\n\n".join(texts) + "\n"


def save(sample: RealSample, images: list[Image.Image]) -> Path:
    path = DOCUMENTS / sample.name
    if sample.scan_seed is not None:
        image, steps = scan_like(images[0], random.Random(sample.scan_seed), steps=3)
        print(f"  scan_like: {steps}")
        image.save(path, quality=85)
    elif path.suffix == ".tif":
        pages = [image.convert("L") for image in images]
        pages[0].save(path, save_all=True, append_images=pages[1:], compression="tiff_adobe_deflate",
                      dpi=(sample.dpi, sample.dpi))
    else:
        images[0].convert("L").save(path, optimize=True)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="Debian package cache (corpus/debian.py)")
    parser.add_argument("--only", action="append", help="only this sample (file name)")
    args = parser.parse_args(argv)
    for sample in SAMPLES:
        if args.only and sample.name not in args.only:
            continue
        print(f"{sample.name}: {sample.package} {sample.file} pages {sample.pages} at {sample.dpi} dpi")
        images, text = build(sample, args.cache)
        path = save(sample, images)
        (TRUE_TEXTS / f"{path.stem}.md").write_text(text, encoding="utf-8")
        print(f"  {path.stat().st_size / 1024:.0f} KiB, {len(text)} characters of true text")


if __name__ == "__main__":
    main()
