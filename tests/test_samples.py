"""The bundled samples: every one with a true text opens and has text, data/samples/README.md
names each sample's source and licence (never a package set aside for evaluation), and
`gravityocr bench samples` reads one sample and prints its page score."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pypdfium2
import pytest
from PIL import Image

from gravityocr.bench.samples import DOCUMENT_SUFFIXES, SAMPLES, TRUE_TEXTS, find_samples
from gravityocr.cli import main as cli_main
from gravityocr.corpus.debian import is_reserved
from gravityocr.corpus.sources import EVALUATION
from gravityocr.pipelines.ocr_cli import default_model_path, has_weights

README = TRUE_TEXTS / "README.md"
WITH_TRUTH = find_samples()


def _pages(path: Path) -> int:
    if path.suffix.lower() == ".pdf":
        document = pypdfium2.PdfDocument(str(path))
        try:
            return len(document)
        finally:
            document.close()
    with Image.open(path) as image:
        frames = getattr(image, "n_frames", 1)
        for frame in range(frames):
            image.seek(frame)
            image.load()  # decodes the pixels, not just the header
            assert image.width >= 500 and image.height >= 500, (path.name, frame, image.size)
        return frames


def _readme_rows() -> dict[str, list[str]]:
    """README table rows by the file name in their first cell."""
    rows = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows[re.match(r"`([^`]+)`", cells[0]).group(1)] = cells
    return rows


def test_there_are_real_samples_with_true_texts():
    names = {sample.name for sample in WITH_TRUTH}
    assert {"manual.png", "two-column.png", "table-formula.png", "scanned.jpg", "manual-pages.tif"} <= names


@pytest.mark.parametrize("sample", WITH_TRUTH, ids=[sample.name for sample in WITH_TRUTH])
def test_every_sample_with_a_true_text_opens_and_has_text(sample):
    pages = _pages(sample.path)
    assert pages >= 1
    assert sample.truth.strip(), f"{sample.path.stem}.md is empty"
    # a multi-page document's true text holds its pages, a blank line between them
    assert len([part for part in sample.truth.split("\n\n") if part.strip()]) == pages


def test_the_multi_page_tiff_has_several_pages():
    (tiff,) = [sample for sample in WITH_TRUTH if sample.name == "manual-pages.tif"]
    assert 2 <= _pages(tiff.path) <= 3


def test_the_readme_names_source_and_licence_of_every_sample():
    rows = _readme_rows()
    documents = [path.name for path in sorted(SAMPLES.iterdir()) if path.suffix.lower() in DOCUMENT_SUFFIXES]
    assert {"columns.jpg", "notice.png", "report.pdf"} <= set(documents)  # the generated ones stay listed
    for name in documents:
        assert name in rows, f"data/samples/README.md does not list {name}"
        _, what, source, licence = rows[name]
        assert what and source and licence, f"{name}: an empty cell in data/samples/README.md"
    evaluation = {package for packages in EVALUATION.values() for package in packages}
    for sample in WITH_TRUTH:
        source = rows[sample.name][2]
        if source.startswith("generated"):
            continue
        package = re.match(r"`([^`]+)`", source).group(1)  # the Debian package comes first
        assert not is_reserved(package), f"{sample.name}: {package} is reserved for independent evaluation"
        assert package not in evaluation, f"{sample.name}: {package} feeds our evaluation set data/real"
        assert re.search(r"page", source) and re.search(r"(GFDL|LPPL|GPL|Apache|BSD|MIT|public domain)",
                                                         rows[sample.name][3]), sample.name


def test_bench_refuses_an_unknown_sample(capsys):
    assert cli_main(["bench", "samples", "--only", "no-such-sample"]) == 2
    assert "no sample with a true text named no-such-sample" in capsys.readouterr().err


@pytest.mark.skipif(not has_weights(default_model_path()), reason="no default model in model/default")
@pytest.mark.timeout(180)
def test_bench_reads_one_sample_and_prints_its_score(capsys, tmp_path):
    figures_file = tmp_path / "figures.json"
    assert cli_main(["bench", "samples", "--only", "notice.png", "--json", str(figures_file)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("notice.png"))
    name, pages, score, seconds = row.split()[:4]
    assert pages == "1" and 0.0 <= float(score) <= 1.0 and float(seconds) > 0
    assert re.search(r"^mean\s+1\s+[01]\.\d{4}", out, re.MULTILINE)
    figures = json.loads(figures_file.read_text())
    assert [s["sample"] for s in figures["samples"]] == ["notice.png"]
    assert 0.0 <= figures["summary"]["mean_score"] <= 1.0
