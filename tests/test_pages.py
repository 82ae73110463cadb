"""Pages through the recogniser and back into documents: markdown and JSON with the
regions in reading order and the right types, JSON valid against the published schema,
per-document errors that never stop the other documents, and `gravityocr ocr`.

The recogniser is a tiny random model: it reads nothing, so these tests check structure
(types, order, boxes, tasks, stats, errors), never recognised text.
"""

from __future__ import annotations

import dataclasses

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import referencing
from PIL import Image

from document_fixtures import (  # noqa: F401
    bad_documents,
    multi_page_tiff,
    png_bytes,
    three_page_pdf,
    tiny_model_dir,
    tiny_recognizer,
)
from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.pipelines import ocr_cli
from gravityocr.pipelines.assembly import (
    LineResult,
    PageResult,
    RegionResult,
    document_markdown,
    figure_prefix_for,
    join_lines,
    page_markdown,
    page_markdowns,
)
from gravityocr.pipelines.page_ocr import TASK_BY_TYPE, PageOcr, PageOcrConfig
from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig
from gravityocr.corpus.synthetic_pages import table_formula_page, two_column_page
from gravityocr.model.evaluation.scores import parse_table, teds

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
MAX_NEW_TOKENS = 3  # the tiny model never says eos: keep every crop short


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


def _validator(name: str) -> jsonschema.Draft202012Validator:
    page, document = _schema("page.schema.json"), _schema("document.schema.json")
    registry = referencing.Registry().with_resources(
        [(s["$id"], referencing.Resource.from_contents(s)) for s in (page, document)])
    schema = page if name == "page" else document
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _recognizer(decoder: str = "engine", **decode) -> CropRecognizer:
    config = RecognizerConfig(DecodeSettings(**decode), decoder=decoder)
    return CropRecognizer(tiny_recognizer(), config.capped(MAX_NEW_TOKENS))


@pytest.fixture(scope="module")
def processed(three_page_pdf, multi_page_tiff, bad_documents):
    """One pipeline run over good and bad documents, interleaved."""
    pdf, pdf_truth = three_page_pdf
    tiff, tiff_truth = multi_page_tiff
    two_column, table_page = two_column_page(seed=31), table_formula_page(seed=32)
    sources = [("report.pdf", pdf), ("truncated.pdf", bad_documents["truncated.pdf"][0]),
               ("scan.tiff", tiff), ("encrypted.pdf", bad_documents["encrypted.pdf"][0]),
               ("zero-pages.pdf", bad_documents["zero-pages.pdf"][0]), ("empty.png", b""),
               ("columns.png", png_bytes(two_column.image)), ("bomb.png", bad_documents["bomb.png"][0]),
               ("notes.png", bad_documents["notes.png"][0]), ("table.png", png_bytes(table_page.image))]
    truths = {"report.pdf": pdf_truth, "scan.tiff": tiff_truth, "columns.png": [two_column],
              "table.png": [table_page]}
    pipeline = PageOcr(_recognizer(), PageOcrConfig(batch_pages=3))
    opened, pages = [], []
    results = list(pipeline.run(sources, on_open=lambda d: opened.append(d.document_id),
                                on_page=lambda p: pages.append((p.document_id, p.page_number))))
    return {r.document_id: r for r in results}, truths, [name for name, _ in sources], opened, pages


def test_documents_come_back_in_order_with_their_pages(processed):
    results, truths, names, opened, pages = processed
    assert list(results) == names
    assert opened == names
    for name, truth in truths.items():
        assert results[name].ok and results[name].page_count == len(truth)
        assert [p.page_number for p in results[name].pages] == list(range(1, len(truth) + 1))
        assert all(p.document_id == name for p in results[name].pages)
    assert len(pages) == sum(len(t) for t in truths.values())


def test_bad_documents_fail_alone_with_their_reason(processed, bad_documents):
    results, *_ = processed
    for name, (_, reason) in bad_documents.items():
        assert not results[name].ok and results[name].error.reason == reason, name
        assert results[name].pages == []
        document = results[name].to_json()
        assert document["error"]["reason"] == reason and document["pages"] == []
        _validator("document").validate(document)


def test_regions_have_the_truth_types_in_reading_order(processed):
    results, truths, *_ = processed
    for name, truth in truths.items():
        for page, page_truth in zip(results[name].pages, truth):
            assert [r.type for r in page.regions] == page_truth.types, (name, page.page_number)
            assert [r.order for r in page.regions] == list(range(len(page.regions)))


def test_each_region_is_read_with_the_task_of_its_type(processed):
    results, *_ = processed
    regions = [r for d in results.values() for p in d.pages for r in p.regions]
    assert {r.type for r in regions} >= {"title", "text", "table", "formula", "figure", "caption", "header", "footer"}
    for region in regions:
        if region.type == "figure":
            assert region.task is None and region.text is None and region.stats is None and region.image is not None
        else:
            assert region.task == TASK_BY_TYPE[region.type]
            assert region.error is None and region.stats is not None
            assert region.stats["committed_tokens"] >= 1
            assert region.stats["forward_passes"] >= 1
        if region.type in ("text", "title", "caption", "header", "footer", "table"):
            assert region.lines and all(line.stats["committed_tokens"] <= MAX_NEW_TOKENS for line in region.lines)
            assert region.stats["committed_tokens"] == sum(line.stats["committed_tokens"] for line in region.lines)
            assert region.stats["ar_rounds"] == sum(line.stats["ar_rounds"] for line in region.lines)
        else:
            assert region.lines == []


def test_a_table_is_read_cell_by_cell_into_its_grid(processed):
    """A table region's HTML has the table's true structure (found from its rules and
    whitespace), and each cell holds what its lines read."""
    results, truths, *_ = processed
    page, truth = results["table.png"].pages[0], truths["table.png"][0]
    (table,) = [r for r in page.regions if r.type == "table"]
    (true_html,) = [t for t in truth.text(include_furniture=True).split("\n") if t.startswith("<table>")]
    assert teds(table.text, true_html, structure_only=True) == 1.0
    cells = [cell.content for row in parse_table(table.text).children for cell in row.children]
    assert cells == [line.text for line in table.lines]  # one line a cell on this page


def test_json_validates_against_the_published_schema(processed):
    results, truths, *_ = processed
    page_validator, document_validator = _validator("page"), _validator("document")
    for name in truths:
        document = json.loads(json.dumps(results[name].to_json()))  # through real JSON
        document_validator.validate(document)
        assert document["page_count"] == len(document["pages"])
        for page, truth in zip(document["pages"], truths[name]):
            page_validator.validate(page)
            assert [r["type"] for r in page["regions"]] == truth.types
            assert [r["order"] for r in page["regions"]] == list(range(len(page["regions"])))
            assert abs(page["width"] - 1240) <= 1 and abs(page["height"] - 1754) <= 1
            for region in page["regions"]:
                x0, y0, x1, y1 = region["bbox"]
                assert 0 <= x0 < x1 <= page["width"] and 0 <= y0 < y1 <= page["height"]


def test_schema_rejects_what_it_should(processed):
    results, *_ = processed
    page = json.loads(json.dumps(results["table.png"].to_json()["pages"][0]))
    validator = _validator("page")
    broken = json.loads(json.dumps(page))
    broken["regions"][0]["type"] = "paragraph"
    assert not validator.is_valid(broken)
    broken = json.loads(json.dumps(page))
    del broken["width"]
    assert not validator.is_valid(broken)
    broken = json.loads(json.dumps(page))
    figure = next(r for r in broken["regions"] if r["type"] == "figure")
    figure["text"] = "a figure is never read"
    assert not validator.is_valid(broken)


def test_markdown_has_the_regions_in_reading_order(processed):
    results, *_ = processed
    markdown = results["table.png"].to_markdown(figure_prefix="table_figures/")
    blocks = markdown.strip().split("\n\n")
    page = results["table.png"].pages[0]
    body = [r for r in page.regions if r.type not in ("header", "footer")]
    # title, text, table, text, formula (3 lines: $$ / latex / $$ are one block), figure, caption
    assert blocks[0].startswith("# ")
    assert blocks[4].startswith("$$\n") and blocks[4].endswith("\n$$")
    assert blocks[5] == f"![figure](table_figures/p1-r{body[5].order}.png)"
    assert len(blocks) == len(body)
    pdf_markdown = results["report.pdf"].to_markdown()
    assert pdf_markdown.count("<!-- page ") == 3
    assert pdf_markdown.index("<!-- page 1 -->") < pdf_markdown.index("<!-- page 2 -->") < pdf_markdown.index("<!-- page 3 -->")
    headings = [line for line in pdf_markdown.splitlines() if line.startswith("#")]
    assert len(headings) == 3 and headings[0].startswith("# ") and all(h.startswith("## ") for h in headings[1:])


# --- assembly without a model ---------------------------------------------------------------

def test_join_lines_joins_hyphenated_words():
    assert join_lines(["Optical charac-", "ter recog-", "nition works."]) == "Optical character recognition works."
    assert join_lines(["Jean-", "Paul and state-of-the-", "art"]) == "Jean-Paul and state-of-the-art"
    assert join_lines(["minus -", "sign", "x\u00ad", "ray", "", " spaced "]) == "minus - sign xray spaced"
    assert join_lines(["2020-", "2021"]) == "2020- 2021"


def _region(order, kind, text, **kw):
    return RegionResult(order, kind, (0, 0, 10, 10), task=TASK_BY_TYPE.get(kind), text=text, **kw)


def test_markdown_per_region_type():
    page = PageResult("doc", 2, 100, 100, 150, "projection", [
        _region(0, "header", "Running head"),
        _region(1, "title", "A  Title"),
        _region(2, "text", "# not a heading"),
        _region(3, "table", "<table><tr><td>1</td></tr></table>"),
        _region(4, "formula", "E=mc^{2}"),
        RegionResult(5, "figure", (0, 0, 10, 10)),
        _region(6, "caption", "Figure 1: a chart"),
        _region(7, "text", "", error="image 3x2000 cannot be processed"),
        _region(8, "text", ""),
        _region(9, "title", "Second"),
        _region(10, "footer", "2"),
    ])
    assert page_markdown(page, figure_prefix="").split("\n\n") == [
        "# A Title", "\\# not a heading", "<table><tr><td>1</td></tr></table>", "$$\nE=mc^{2}\n$$",
        "![figure](p2-r5.png)", "Figure 1: a chart",
        "<!-- page 2 region 7 (text) not read: image 3x2000 cannot be processed -->", "## Second",
    ]
    # no output folder (the default): the figure is left out, no link to a file never written
    assert "![figure]" not in page_markdown(page)
    assert page_markdown(page).split("\n\n") == [b for b in page_markdown(page, figure_prefix="").split("\n\n")
                                                 if not b.startswith("![figure]")]
    assert page_markdown(page, title_seen=True).startswith("## A Title")
    assert "Running head" in page_markdown(page, include_furniture=True)
    assert document_markdown([page]) == page_markdown(page) + "\n"
    assert figure_prefix_for("my report.pdf") == "my%20report.pdf_figures/"


def _two_pages(first_error: str | None = None) -> list[PageResult]:
    return [
        PageResult("doc", 1, 100, 100, 150, "projection", [_region(0, "title", "First"), _region(1, "text", "one")],
                   error=first_error),
        PageResult("doc", 2, 100, 100, 150, "projection", [
            _region(0, "title", "Later"), RegionResult(1, "figure", (0, 0, 10, 10)), _region(2, "text", "two")]),
    ]


def test_document_markdown_is_the_join_of_its_pages_pieces():
    """One function for every entry point: the document's first title is `#` on whichever
    page, later ones `##` (also page 2's); its pages' pieces carry that, and the document is
    their join; figures are linked only under a prefix; errors stay as comments."""
    pages = _two_pages()
    pieces = page_markdowns(pages, figure_prefix="doc_figures/")
    assert pieces == ["# First\n\none", "## Later\n\n![figure](doc_figures/p2-r1.png)\n\ntwo"]
    assert page_markdown(pages[1]).startswith("# Later")  # a page read alone does not know the document
    markdown = document_markdown(pages, figure_prefix="doc_figures/")
    assert markdown == "".join(f"<!-- page {page.page_number} -->\n\n{piece}\n\n"
                               for page, piece in zip(pages, pieces)).strip() + "\n"
    assert document_markdown(pages) == markdown.replace("![figure](doc_figures/p2-r1.png)\n\n", "")
    assert page_markdowns(pages) == [piece.replace("![figure](doc_figures/p2-r1.png)\n\n", "") for piece in pieces]
    # an unread title is a comment and leaves the document's `#` to the next title
    unread = _two_pages()
    unread[0].regions[0] = _region(0, "title", "", error="refused")
    assert page_markdowns(unread)[0].startswith("<!-- page 1 region 0 (title) not read: refused -->")
    assert page_markdowns(unread)[1].startswith("# Later")
    # a page that could not be laid out, and a document that could not be read
    failed = document_markdown(_two_pages(first_error="layout failed: ValueError: x"))
    assert failed.startswith("<!-- page 1 -->\n\n<!-- page 1 not read: layout failed: ValueError: x -->\n\n# First")
    assert document_markdown([], error={"reason": "corrupt", "message": "cut short"}) == \
        "<!-- document not read (corrupt): cut short -->\n"


def test_results_round_trip_through_their_json(processed):
    results, *_ = processed
    pages = [page for name in ("report.pdf", "table.png") for page in results[name].pages]
    assert any(r.lines for page in pages for r in page.regions) and any(r.stats for page in pages for r in page.regions)
    for page in pages:
        data = json.loads(json.dumps(page.to_dict()))
        back = PageResult.from_dict(data)
        assert back.to_dict() == data
        assert all(isinstance(r.bbox, tuple) and r.image is None for r in back.regions)
        assert page_markdowns([back], "x/") == page_markdowns([page], "x/")
    line = LineResult((1, 2, 3, 4), "t", None, "failed")
    assert LineResult.from_dict(line.to_dict()) == line
    assert RegionResult.from_dict(_region(3, "text", "t").to_dict()) == _region(3, "text", "t")


def test_a_crop_the_processor_refuses_is_a_region_error_not_a_page_failure():
    recognizer = _recognizer()
    crops = [(Image.new("RGB", (3, 1200), "white"), "text"), (Image.new("RGB", (120, 56), "white"), "formula")]
    refused, read = recognizer.recognize(crops)
    assert refused.error and "aspect" in refused.error and refused.stats is None
    assert read.ok and read.stats.committed_tokens == MAX_NEW_TOKENS and read.finish_reason == "length"


def test_recognizer_settings_are_checked():
    with pytest.raises(ValueError, match="decoder must be"):
        RecognizerConfig(decoder="fast")
    decode = DecodeSettings(block_size=16, speculative_max_batch=2)
    capped = RecognizerConfig(decode).capped(100)
    assert capped.decode is decode and set(capped.max_new_tokens.values()) == {100}


def test_engine_and_reference_decoders_agree():
    page = table_formula_page(seed=40).image
    crops = [(page.crop((110, 150, 700, 200)), "text"), (page.crop((250, 300, 990, 500)), "table"),
             (page.crop((530, 630, 710, 720)), "formula")]
    # speculative_max_batch 0: the engine speculates however many crops decode together, as
    # the reference decoder (one crop at a time) does, so their passes agree too
    for settings in (dict(mode="spec"), dict(mode="ar")):
        engine = _recognizer(decoder="engine", speculative_max_batch=0, **settings).recognize(crops)
        reference = _recognizer(decoder="reference", **settings).recognize(crops)
        assert [r.text for r in engine] == [r.text for r in reference]
        assert [r.stats.forward_passes for r in engine] == [r.stats.forward_passes for r in reference]
    # AR rounds while more than one crop decodes: more passes, the same text
    speculating = _recognizer(decoder="engine", speculative_max_batch=0).recognize(crops)
    capped = _recognizer(decoder="engine", speculative_max_batch=1).recognize(crops)
    assert [r.text for r in capped] == [r.text for r in speculating]
    assert sum(r.stats.forward_passes for r in capped) > sum(r.stats.forward_passes for r in speculating)


def test_crops_of_concurrent_callers_share_the_engine_rounds():
    """One long-lived engine per recogniser: two page batches submitted by two calls (two
    callers, e.g. two HTTP requests or two of a batch actor's page batches) decode in the
    same rounds, and each crop reads what the reference decoder reads."""
    page = table_formula_page(seed=41).image
    batches = [[(page.crop((110, 150 + 60 * i, 700, 200 + 60 * i)), "text") for i in range(3)],
               [(page.crop((250, 300, 990, 500)), "table"), (page.crop((530, 630, 710, 720)), "formula")]]
    # 48 tokens a crop (the tiny model never says eos, its drafts are noise): the first
    # batch decodes for many rounds, long after the second has joined it
    config = RecognizerConfig(DecodeSettings(speculative_max_batch=0)).capped(48)
    with CropRecognizer(tiny_recognizer(), config) as recognizer:
        pending = [recognizer.submit(batch) for batch in batches]
        results = [[future.result(120) for future in futures] for futures in pending]
        peak = recognizer.loop.peak_batch_size
    reference = CropRecognizer(tiny_recognizer(), dataclasses.replace(config, decoder="reference"))
    for batch, read in zip(batches, results):
        assert [r.text for r in read] == [r.text for r in reference.recognize(batch)]
        assert all(r.ok and r.stats.committed_tokens == 48 for r in read)
    assert peak == 5  # the two callers' crops decoded in the same rounds


# --- the CLI ----------------------------------------------------------------------------------

def _cli(argv, capsys):
    code = ocr_cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_writes_markdown_and_figures_and_reports_failures(tmp_path, tiny_model_dir, three_page_pdf, capsys):
    good = tmp_path / "report.pdf"
    good.write_bytes(three_page_pdf[0])
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    out = tmp_path / "out"
    code, stdout, stderr = _cli([str(good), str(empty), str(text), "--model", str(tiny_model_dir), "--out", str(out),
                                 "--max-new-tokens", str(MAX_NEW_TOKENS)], capsys)
    assert code == 1
    assert f"{empty}: empty_file:" in stderr and f"{text}: unsupported_format:" in stderr
    # a line per page as it is read, then the total
    assert [line.split(" (")[0] for line in stderr.splitlines() if " pages (" in line] == \
        [f"gravityocr ocr: {n}/3 pages" for n in (1, 2, 3)]
    assert f"gravityocr ocr: 3/3 pages ({good} page 3, " in stderr and "gravityocr ocr: 3 pages read in " in stderr
    # named as `gravityocr batch` names it: the input's file name, extension kept
    assert sorted(p.name for p in out.iterdir()) == ["report.pdf.md", "report.pdf_figures"]
    markdown = (out / "report.pdf.md").read_text()
    assert markdown.count("<!-- page ") == 3
    (figure,) = list((out / "report.pdf_figures").iterdir())
    assert f"![figure](report.pdf_figures/{figure.name})" in markdown
    assert Image.open(figure).size[0] > 100


def test_cli_shows_a_one_page_input_as_it_is_read_and_gives_the_engine_one_thread(tmp_path, tiny_model_dir, capsys,
                                                                                    monkeypatch):
    """A one-page input gets its progress line too; the engine decodes on one torch thread,
    as the batch job's engine actors and serve's replicas do, whatever the process's count."""
    import torch

    from gravityocr.model.engine import threads

    page = tmp_path / "notice.png"
    page.write_bytes((Path(__file__).resolve().parents[1] / "samples" / "notice.png").read_bytes())
    monkeypatch.setattr(threads, "_reserved", None)  # as in a fresh process
    torch.set_num_threads(2)  # a process allowed two threads (reserve_for_engine sets it back to one)
    code, stdout, stderr = _cli([str(page), "--model", str(tiny_model_dir), "--max-new-tokens", str(MAX_NEW_TOKENS)],
                                capsys)
    assert code == 0 and stdout.strip()
    assert threads.engine_threads() == 1 and torch.get_num_threads() == 1
    assert re.search(rf"^gravityocr ocr: 1/1 pages \({re.escape(str(page))} page 1, [0-9.]+ s\)\n"
                     r"gravityocr ocr: 1 page read in [0-9.]+ s$", stderr, re.M), stderr


def test_cli_output_names_keep_the_extension_as_the_batch_job_does():
    assert ocr_cli._output_names(["a/x.pdf", "b/x.pdf", "c/x.png", "notes", "x.pdf"]) == {
        "a/x.pdf": "x.pdf", "b/x.pdf": "x-2.pdf", "c/x.png": "x.png", "notes": "notes", "x.pdf": "x-3.pdf"}


def test_cli_json_to_stdout(tmp_path, tiny_model_dir, multi_page_tiff, capsys):
    scan = tmp_path / "scan.tif"
    scan.write_bytes(multi_page_tiff[0])
    code, stdout, stderr = _cli([str(scan), "--model", str(tiny_model_dir), "--format", "json", "--mode", "ar",
                                 "--max-new-tokens", str(MAX_NEW_TOKENS), "--no-progress"], capsys)
    # three tokens a crop read almost nothing of a page: each page says so, nothing else is said
    assert code == 0 and all(": warning: almost nothing read: " in line for line in stderr.splitlines())
    (line,) = stdout.splitlines()
    document = json.loads(line)
    _validator("document").validate(document)
    assert document["format"] == "tiff" and document["page_count"] == 2
    assert [r["type"] for r in document["pages"][1]["regions"]] == multi_page_tiff[1][1].types
    stats = [r["stats"] for p in document["pages"] for r in p["regions"] if r["stats"]]
    assert all(s["forward_passes"] == s["committed_tokens"] for s in stats)  # AR: one token per pass


def test_cli_without_a_model_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ocr_cli, "default_model_path", lambda: tmp_path / "default")
    page = tmp_path / "page.png"
    page.write_bytes(png_bytes(Image.new("RGB", (10, 10), "white")))
    code, stdout, stderr = _cli([str(page)], capsys)
    assert code == 2 and "no default model found; pass --model PATH" in stderr
    code, stdout, stderr = _cli([str(page), "--model", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "no model found" in stderr


def test_cli_refuses_bad_decoding_settings_clearly(tmp_path, tiny_model_dir, capsys):
    page = tmp_path / "page.png"
    page.write_bytes(png_bytes(Image.new("RGB", (10, 10), "white")))
    code, _, stderr = _cli([str(page), "--model", str(tiny_model_dir), "--block-size", "1"], capsys)
    assert code == 2 and "cannot start: block_size (--block-size) must be at least 2" in stderr
    code, _, stderr = _cli([str(page), "--model", str(tiny_model_dir), "--speculative-max-batch", "-1"], capsys)
    assert code == 2 and "cannot start: speculative_max_batch (--speculative-max-batch) must be at least 0" in stderr


def test_cli_json_writes_an_error_record_for_a_bad_file_among_good_ones(tmp_path, tiny_model_dir, capsys):
    sample = Path(__file__).resolve().parents[1] / "samples" / "notice.png"
    cut = tmp_path / "cut.png"
    cut.write_bytes(sample.read_bytes()[:2000])  # a real PNG cut short: its header reads, its pixels do not
    argv = [str(sample), str(cut), str(sample), "--model", str(tiny_model_dir), "--format", "json",
            "--max-new-tokens", str(MAX_NEW_TOKENS), "--no-progress"]
    code, stdout, stderr = _cli(argv, capsys)
    assert code == 1 and f"{cut}: corrupt:" in stderr
    records = [json.loads(line) for line in stdout.splitlines()]
    assert [r["document_id"] for r in records] == [str(sample), str(cut), str(sample)]
    validator = _validator("document")
    for record in records:
        validator.validate(record)
    good, bad, again = records
    assert bad["error"]["reason"] == "corrupt" and bad["error"]["message"] and bad["pages"] == []
    assert good["error"] is None and again["error"] is None and good["format"] == "png"
    assert good["page_count"] == 1 and good["pages"][0]["regions"]
    assert _untimed(good) == _untimed(again)  # the bad file between them changed nothing of theirs
    # with --out: one .json per input, the bad one's naming its error
    out = tmp_path / "out"
    code, _, _ = _cli([str(sample), str(cut), *argv[3:], "--out", str(out)], capsys)
    assert code == 1 and sorted(p.name for p in out.iterdir()) == ["cut.png.json", "notice.png.json"]
    assert json.loads((out / "cut.png.json").read_text())["error"]["reason"] == "corrupt"
    assert _untimed(json.loads((out / "notice.png.json").read_text())) == _untimed(good)


def _untimed(document: dict) -> dict:
    """A document record without its wall-clock timings, which differ from run to run."""
    return {**document, "pages": [{k: v for k, v in page.items() if k != "seconds"} for page in document["pages"]]}


ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL|FATAL)\b|^\[E[ :]|^E\d{4} |Traceback \(most recent call last\)", re.M)


@pytest.mark.skipif(not ocr_cli.has_weights(ocr_cli.default_model_path()), reason="no default model in model/default")
@pytest.mark.timeout(300)
def test_healthy_run_logs_no_error_line():
    """`gravityocr ocr samples/notice.png` as a newcomer runs it (its own process, the
    default model): markdown on stdout and no error-level line on stderr from Ray,
    transformers, onnxruntime or our code."""
    sample = Path(__file__).resolve().parents[1] / "samples" / "notice.png"
    run = subprocess.run([sys.executable, "-m", "gravityocr.cli", "ocr", str(sample)], capture_output=True, text=True,
                         timeout=280)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
    assert not ERROR_LINE.search(run.stderr), run.stderr
