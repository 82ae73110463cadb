"""`gravityocr data lexicon`: the words of the training side's documents and how often each
occurs, the lexicon the recogniser's glyph fixes consult (pipelines/glyph_fixes.py).

Words come from the text layers of the PDFs of every training package (corpus/sources.py
TRAINING, any type; never an evaluation, development or reserved package), at most
`pages_per_pdf` pages of `pdfs_per_package` PDFs a package, the PDFs taken evenly over each
package's sorted list so that one long manual does not speak for the package. A word is what
the fixes take for one: a run of letters and digits holding at least one letter; words with
digits are kept (`0pt`, `file1`), so that a digit the documents write is never "fixed".
Written one `word<TAB>count` a line, most frequent first, words seen fewer than `min_count`
times left out.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from gravityocr.corpus.debian import DEFAULT_CACHE, fetch_package
from gravityocr.corpus.sources import TRAINING, check_sources
from gravityocr.model.network.glyph_fixes import MIXED_WORD, Lexicon


def words_of(text: str) -> list[str]:
    return [word for word in MIXED_WORD.findall(text) if any(c.isalpha() for c in word)]


def count_words(packages: list[str], cache: Path, pdfs_per_package: int, pages_per_pdf: int) -> collections.Counter:
    import pypdfium2 as pdfium

    counts: collections.Counter = collections.Counter()
    for name in packages:
        pdfs = fetch_package(name, cache).files(".pdf")
        step = max(1, len(pdfs) // pdfs_per_package)
        for path in pdfs[::step][:pdfs_per_package]:
            try:
                document = pdfium.PdfDocument(str(path))
            except pdfium.PdfiumError:
                continue  # encrypted or broken: nothing to read
            for index in range(min(len(document), pages_per_pdf)):
                counts.update(words_of(document[index].get_textpage().get_text_range()))
            document.close()
        print(f"lexicon: {name}: {len(pdfs)} PDFs, {len(counts)} distinct words so far", file=sys.stderr)
    return counts


def write_lexicon(counts: collections.Counter, path: Path, min_count: int) -> int:
    kept = {word: count for word, count in counts.items() if count >= min_count}
    Lexicon(kept).write(path)
    return len(kept)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", type=Path, help="the lexicon file to write (model/default/lexicon.txt ships one)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help="where packages are downloaded and unpacked")
    parser.add_argument("--pdfs-per-package", type=int, default=40, help="PDFs read from each package (default: 40)")
    parser.add_argument("--pages-per-pdf", type=int, default=60, help="pages read from each PDF (default: 60)")
    parser.add_argument("--min-count", type=int, default=2, help="leave out words seen fewer times (default: 2)")


def run(args) -> int:
    check_sources()
    packages = sorted({name for names in TRAINING.values() for name in names})
    counts = count_words(packages, args.cache, args.pdfs_per_package, args.pages_per_pdf)
    kept = write_lexicon(counts, args.output, args.min_count)
    print(f"lexicon: {kept} words from {len(packages)} training packages -> {args.output}")
    return 0
