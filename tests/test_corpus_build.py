"""The corpus builder: reserved packages refused, exact labels from one small PDF, one HTML
file and one LaTeX source, one seed one build, and an interrupted build resumed without
duplicates. Real PDFs (matplotlib's PDF backend with embedded fonts), real Chromium,
real pdflatex."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gravityocr.cli import main
from gravityocr.corpus.build import BuildConfig, build, build_eval_set
from gravityocr.corpus.debian import (RESERVED_PACKAGES, ReservedPackage, UnpackedPackage, check_not_reserved,
                                      fetch_package, is_reserved)
from gravityocr.corpus.pdf_text import line_items, page_items, paragraph_items
from gravityocr.corpus.sources import DEVELOPMENT, EVALUATION, TRAINING, check_sources
from gravityocr.model.evaluation.scores import canonicalize_latex

LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs: 42 of them!",
    "Sphinx of black quartz, judge my vow (2026-12-05).",
    "How vexingly quick daft zebras jump; [x] = {y}.",
    "Bright vixens jump, dozy fowl quack.",
    "Waltz, bad nymph, for quick jigs vex.",
    "Glib jocks quiz nymph to vex dwarf.",
    "Jackdaws love my big sphinx of quartz.",
]
TABLE_HTML = """<html><body><p>Options:</p>
<table border="1"><thead><tr><th>Name</th><th>Default</th></tr></thead>
<tbody><tr><td><code>width</code></td><td>80&nbsp;px</td></tr>
<tr><td colspan="2">Both are optional.</td></tr></tbody></table></body></html>"""
TABLE_TARGET = ('<table><tr><td>Name</td><td>Default</td></tr><tr><td>width</td><td>80 px</td></tr>'
                '<tr><td colspan="2">Both are optional.</td></tr></table>')
FORMULA = r"E = m c^2 + \frac{a}{b}"
TEX_SOURCE = "\\documentclass{article}\n\\begin{document}\nText.\n\\[ " + FORMULA + " \\]\n\\end{document}\n"


def _write_pdf(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"pdf.fonttype": 42}):
        figure = plt.figure(figsize=(8.5, 11))
        for number, line in enumerate(LINES):
            figure.text(0.1, 0.9 - 0.05 * number, line, fontsize=12, family="DejaVu Serif")
        figure.savefig(path, format="pdf")
        plt.close(figure)


@pytest.fixture(scope="module")
def fixture_package(tmp_path_factory) -> UnpackedPackage:
    root = tmp_path_factory.mktemp("fixture-doc")
    docs = root / "usr/share/doc/fixture-doc"
    docs.mkdir(parents=True)
    _write_pdf(docs / "guide.pdf")
    (docs / "options.html").write_text(TABLE_HTML)
    (docs / "math.tex").write_text(TEX_SOURCE)
    (docs / "copyright").write_text("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
                                    "Files: *\nLicense: MIT\n")
    return UnpackedPackage("fixture-doc", root, "MIT")


@pytest.mark.parametrize("name", ["r-doc-pdf", "octave-doc", "gnuplot-doc", "python3-doc", "python3.11-doc",
                                  "python3.13-doc", "texlive-publishers-doc", "texlive-science-doc",
                                  "texlive-metapost-doc", "texlive-latex-base-doc", "texlive-latex-recommended-doc",
                                  "texlive-humanities-doc", "texlive-fonts-recommended-doc"])
def test_every_reserved_package_is_refused_before_anything_is_fetched(name, tmp_path):
    assert is_reserved(name)
    with pytest.raises(ReservedPackage, match="reserved for independent evaluation"):
        fetch_package(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_command_refuses_a_reserved_package(tmp_path, capsys):
    assert main(["data", "build", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"),
                 "--types", "text", "--packages", "octave-doc"]) == 2
    assert "reserved for independent evaluation" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_sources_are_disjoint_and_never_reserved(monkeypatch):
    check_sources()
    assert len(RESERVED_PACKAGES) == 11
    for side in (TRAINING, EVALUATION, DEVELOPMENT):
        for packages in side.values():
            for name in packages:
                assert check_not_reserved(name) == name
    training = {p for ps in TRAINING.values() for p in ps}
    evaluation = {p for ps in EVALUATION.values() for p in ps}
    development = {p for ps in DEVELOPMENT.values() for p in ps}
    assert not training & evaluation and not training & development and not evaluation & development
    monkeypatch.setitem(DEVELOPMENT, "text", ["bash-doc"])  # an evaluation package
    with pytest.raises(ValueError, match="evaluation and the development side"):
        check_sources()


def test_lines_and_page_of_a_small_pdf_have_their_exact_text(fixture_package):
    lines = list(line_items(fixture_package, seed=3))
    assert sorted(item.text for item in lines) == sorted(LINES)
    for item in lines:
        assert item.type == "text" and item.source.page == 1 and item.source.licence == "MIT"
        assert item.source.file == "usr/share/doc/fixture-doc/guide.pdf"
        assert 8 <= item.image.height < item.image.width
    (page,) = page_items(fixture_package, seed=3)
    assert page.text == "\n".join(LINES)


def _fixture_build(tmp_path: Path, fixture_package: UnpackedPackage, output: str, seed: int = 7):
    training = {"text": ["fixture-doc"], "page": ["fixture-doc"], "table": ["fixture-doc"],
                "formula": ["fixture-doc"]}
    config = BuildConfig(tmp_path / output, tmp_path / "cache", seed=seed, augment_share=0.5)
    return build(config, log=lambda line: None, training=training, fetch=lambda name, cache: fixture_package,
                 held_out=())


def _rows(output: Path) -> list[dict]:
    return [row for shard in sorted(output.glob("shards/**/*.parquet")) for row in pq.read_table(shard).to_pylist()]


def test_a_tiny_build_gives_the_expected_items_and_one_seed_gives_one_build(tmp_path, fixture_package):
    written = _fixture_build(tmp_path, fixture_package, "first")
    assert written["text"] == len(LINES) and written["page"] == 1
    rows = _rows(tmp_path / "first")
    by_type = {}
    for row in rows:
        by_type.setdefault(row["type"], []).append(row)
    assert sorted(r["text"] for r in by_type["text"]) == sorted(LINES)
    assert {r["text"] for r in by_type["table"]} == {TABLE_TARGET}
    assert {r["text"] for r in by_type["formula"]} == {canonicalize_latex(FORMULA)}
    assert any(r["augment"] for r in rows) and any(not r["augment"] for r in rows)
    manifest = [json.loads(line) for line in (tmp_path / "first/manifest.jsonl").read_text().splitlines()]
    assert [m["id"] for m in manifest] == [r["id"] for r in rows]
    assert all(m["package"] == "fixture-doc" and m["licence"] == "MIT" and m["file"] for m in manifest)

    _fixture_build(tmp_path, fixture_package, "second")
    assert _rows(tmp_path / "second") == rows  # ids, labels, sources and image bytes
    _fixture_build(tmp_path, fixture_package, "other-seed", seed=8)
    assert [r["image"] for r in _rows(tmp_path / "other-seed")] != [r["image"] for r in rows]


def test_an_interrupted_build_resumes_without_duplicates(tmp_path, fixture_package):
    _fixture_build(tmp_path, fixture_package, "whole")
    whole = (tmp_path / "whole/manifest.jsonl").read_text()
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    # What a kill leaves: some shards written, one half-written under its temporary name,
    # the rest missing, and a manifest of the earlier run.
    shards = sorted((tmp_path / "cut").glob("shards/**/*.parquet"))
    victim = shards[len(shards) // 2]
    victim.unlink()
    victim.with_suffix(".partial").write_bytes(b"half a shard")
    (tmp_path / "cut/manifest.jsonl").write_text("")
    written = _fixture_build(tmp_path, fixture_package, "cut")
    assert sum(written.values()) > 0  # only the missing unit was built again
    assert (tmp_path / "cut/manifest.jsonl").read_text() == whole
    ids = [json.loads(line)["id"] for line in whole.splitlines()]
    assert len(ids) == len(set(ids))


def test_the_evaluation_set_names_its_sources(tmp_path, fixture_package):
    """The evaluation writer on the fixture package: manifest format unchanged plus `source`."""
    from gravityocr.model.evaluation.manifest import read_manifest

    build_eval_set(tmp_path / "real", tmp_path / "cache", counts={"text": 5}, log=lambda line: None,
                   evaluation={"text": ["fixture-doc"]}, fetch=lambda name, cache: fixture_package)
    items = read_manifest(tmp_path / "real")
    assert len(items) == 3 and all(item.text in LINES for item in items)  # at most 3 lines a page
    assert all(item.source.startswith("fixture-doc:usr/share/doc/fixture-doc/guide.pdf#p1") for item in items)
    assert all(item.image_path.is_file() for item in items)


PARAGRAPHS = [["The first paragraph runs over", "four lines set at the usual", "line step of a book page,",
               "then it ends."],
              ["A second one follows a gap", "and has three lines", "of its own."]]


def test_paragraphs_are_blocks_of_regularly_spaced_lines(tmp_path):
    """A heading, a four-line paragraph, a gap, a three-line paragraph: two multi-line items
    whose targets are their lines, one a line; the heading joins neither."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = tmp_path / "usr/share/doc/blocks"
    docs.mkdir(parents=True)
    with matplotlib.rc_context({"pdf.fonttype": 42}):
        figure = plt.figure(figsize=(8.5, 11))
        figure.text(0.1, 1 - 72 / 792, "A Heading", fontsize=18, family="DejaVu Serif")
        y = 110.0
        for block in PARAGRAPHS:
            for line in block:
                figure.text(0.1, 1 - y / 792, line, fontsize=12, family="DejaVu Serif")
                y += 14.4
            y += 20
        figure.savefig(docs / "blocks.pdf", format="pdf")
        plt.close(figure)
    package = UnpackedPackage("blocks-doc", tmp_path, "MIT")
    items = list(paragraph_items(package, seed=1))
    assert sorted(item.text for item in items) == sorted("\n".join(block) for block in PARAGRAPHS)
    for item in items:
        assert item.type == "text" and item.image.height > 2 * 12 * 100 / 72  # at least two lines at >= 100 dpi


def test_a_page_whose_size_is_inherited_from_the_page_tree_is_cropped_at_its_lines(tmp_path):
    """An A4 page whose MediaBox sits on the page tree (as some TeX drivers write it) gives
    the same crops as the same page with a box of its own: the crop follows the rendered area."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import NameObject

    own = tmp_path / "own/usr/share/doc/a4"
    inherited = tmp_path / "inherited/usr/share/doc/a4"
    own.mkdir(parents=True)
    inherited.mkdir(parents=True)
    with matplotlib.rc_context({"pdf.fonttype": 42}):
        figure = plt.figure(figsize=(595 / 72, 842 / 72))
        for number, line in enumerate(LINES):
            figure.text(0.1, 0.9 - 0.05 * number, line, fontsize=12, family="DejaVu Serif")
        figure.savefig(own / "guide.pdf", format="pdf")
        plt.close(figure)
    writer = PdfWriter(clone_from=PdfReader(own / "guide.pdf"))
    page = writer.pages[0]
    box = page[NameObject("/MediaBox")]
    del page[NameObject("/MediaBox")]
    writer._root_object["/Pages"][NameObject("/MediaBox")] = box
    writer.write(inherited / "guide.pdf")

    import pypdfium2 as pdfium

    document = pdfium.PdfDocument(inherited / "guide.pdf")
    assert document[0].get_cropbox() != document[0].get_bbox()  # the case this test is about
    document.close()
    crops = {}
    for name in ("own", "inherited"):
        items = list(line_items(UnpackedPackage("a4-doc", tmp_path / name, "MIT"), seed=5))
        crops[name] = {item.text: np.asarray(item.image) for item in items}
    assert sorted(crops["own"]) == sorted(crops["inherited"]) == sorted(LINES)
    for text, image in crops["own"].items():
        assert np.array_equal(image, crops["inherited"][text]), text


def _pdf_with_one_page(content: bytes) -> bytes:
    """A one-page PDF (Times-Roman as /F1) whose page draws `content`."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Times-Roman >>"]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_a_word_space_drawn_as_character_spacing_is_in_the_label(tmp_path):
    """Ghostscript's PDF of a groff manual (bash's) justifies a line by character spacing: the
    space after "they" is 2.5 pt of Tc on the "y", no space character, and pdfium infers none.
    The label has the space the image shows; letter spacing of a twentieth of an em inside a
    word adds none."""
    import pypdfium2 as pdfium

    docs = tmp_path / "usr/share/doc/groff-like"
    docs.mkdir(parents=True)
    # "values the" is 40.27 pt wide in Times-Roman at 10 pt; "y" and "h" are 5 pt each
    (docs / "manual.pdf").write_bytes(_pdf_with_one_page(
        b"BT /F1 10 Tf 100 700 Td (values the) Tj 2.5 Tc 40.27 0 Td (yh) Tj 0 Tc 12.5 0 Td (ad prior to it.) Tj ET "
        b"BT /F1 10 Tf 100 670 Td (all) Tj 0.5 Tc 15 0 Td (kerned) Tj 0 Tc ( words.) Tj ET"))
    document = pdfium.PdfDocument(docs / "manual.pdf")
    assert "theyhad" in document[0].get_textpage().get_text_range()  # the case this test is about
    document.close()
    items = list(line_items(UnpackedPackage("groff-like", tmp_path, "MIT"), seed=1))
    assert sorted(item.text for item in items) == ["all kerned words.", "values they had prior to it."]


def test_a_training_build_leaves_out_the_formulas_a_held_out_package_holds(tmp_path, fixture_package):
    held = tmp_path / "held-doc/usr/share/doc/held-doc"
    held.mkdir(parents=True)
    (held / "held.tex").write_text("Inline $E = m c^2 + \\frac{a}{b}$ math.\n")  # the fixture's formula, inline
    held_package = UnpackedPackage("held-doc", tmp_path / "held-doc", "MIT")
    packages = {"fixture-doc": fixture_package, "held-doc": held_package}
    config = BuildConfig(tmp_path / "out", tmp_path / "cache", seed=7, types=("formula",), augment_share=0.0)
    written = build(config, log=lambda line: None, training={"formula": ["fixture-doc"]},
                    fetch=lambda name, cache: packages[name], held_out=["held-doc"])
    assert written["formula"] == 0 and not _rows(tmp_path / "out")


def test_negatives_are_crops_without_ink_to_read_with_the_empty_target(tmp_path, fixture_package):
    config = BuildConfig(tmp_path / "out", tmp_path / "cache", seed=7, types=("formula",), augment_share=0.0,
                         negatives=10)
    build(config, log=lambda line: None, training={"formula": ["fixture-doc"]},
          fetch=lambda name, cache: fixture_package, held_out=())
    rows = [r for r in _rows(tmp_path / "out") if r["package"] == "generated-negatives"]
    assert len(rows) == 10 and len({r["id"] for r in rows}) == 10
    assert all(r["text"] == "" and r["type"] == "formula" for r in rows)
    assert {r["locator"].split("-")[0] for r in rows} == {"blank", "specks", "noise", "rule", "frame"}
    again = tmp_path / "again"
    build(BuildConfig(again, tmp_path / "cache", seed=7, types=("formula",), augment_share=0.0, negatives=10),
          log=lambda line: None, training={"formula": ["fixture-doc"]}, fetch=lambda name, cache: fixture_package,
          held_out=())
    assert [r["image"] for r in _rows(again) if r["package"] == "generated-negatives"] == [r["image"] for r in rows]
