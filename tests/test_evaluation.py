"""`gravityocr eval`: scores per type, TPF, exactness check, unreadable items listed as 0."""

from __future__ import annotations

import json

import pytest
import torch

from gravityocr.cli import main
from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.model.network.loading import Recognizer, save_recognizer
from gravityocr.model.evaluation.manifest import ManifestItem, write_manifest
from gravityocr.model.evaluation.scores import score, teds

from conftest import OVERFIT_TEXTS, random_image


def _table_item(data, seed: int = 32) -> ManifestItem:
    """The table of a synthetic page, cut out, with its true HTML."""
    from gravityocr.corpus.synthetic_pages import table_formula_page
    from gravityocr.pipelines.layout import layout_page, make_layout, make_line_splitter

    page = table_formula_page(seed=seed)
    image = page.image.convert("RGB")
    (table,) = [r for r in layout_page(image, make_layout("projection"), make_line_splitter("projection"))
                if r.type == "table"]
    x0, y0, x1, y1 = table.bbox
    image.crop((x0 - 6, y0 - 6, x1 + 6, y1 + 6)).save(data / "images" / "table.png")
    (html,) = [t for t in page.text(include_furniture=True).split("\n") if t.startswith("<table>")]
    return ManifestItem("table", data / "images" / "table.png", "table", html)


def test_eval_json_on_a_trained_tiny_model(tmp_path, trained_tiny_model, processor, capsys):
    """Lines and formulas are read as crops (memorised here); a table's image goes through
    the page pipeline's table reading (its grid, its cells' lines)."""
    model_dir = tmp_path / "model"
    save_recognizer(Recognizer(trained_tiny_model.to(torch.float32), processor), model_dir)
    trained_tiny_model.to(torch.float64)
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    items = [_table_item(data)]
    for i, (text, kind) in enumerate(zip(OVERFIT_TEXTS, ["text", "table", "formula"])):
        if kind == "table":
            continue
        random_image(100 + i, 84 + 28 * i, 56).save(data / "images" / f"{i}.png")
        items.append(ManifestItem(f"item-{i}", data / "images" / f"{i}.png", kind, text))
    (data / "images" / "broken.png").write_bytes(b"this is not a png")
    items.append(ManifestItem("broken", data / "images" / "broken.png", "text", "anything"))
    items.append(ManifestItem("missing", data / "images" / "missing.png", "text", "anything"))
    write_manifest(data, items)

    # Speculating at every batch size (the product caps it on a CPU), with a block of 16.
    outcomes = tmp_path / "items.jsonl"
    assert main(["eval", str(data), "--model", str(model_dir), "--json", "--check-exact", "--block-size", "16",
                 "--speculative-max-batch", "0", "--items", str(outcomes)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["n"] == 5
    assert report["exact"] is True
    assert report["formula"] == 1.0  # memorised
    table = next(json.loads(line) for line in outcomes.read_text().splitlines() if json.loads(line)["id"] == "table")
    assert teds(table["prediction"], items[0].text, structure_only=True) == 1.0  # the grid is the table's
    assert report["table"] == teds(table["prediction"], items[0].text) < 1.0  # its cells: the tiny model's reading
    assert table["forward_passes"] >= 12  # a cell a crop at least
    # the memorised line as far as its crop's size lets any entry point read it (84 x 56 px
    # holds fewer characters than the line has), then two unreadable items scored 0
    held = OVERFIT_TEXTS[0][:processor.output_budget(processor.encode(random_image(100, 84, 56), "text"))]
    assert len(held) < len(OVERFIT_TEXTS[0])
    line = next(json.loads(line) for line in outcomes.read_text().splitlines() if json.loads(line)["id"] == "item-0")
    assert line["prediction"] == held
    assert report["text"] == pytest.approx(score("text", held, OVERFIT_TEXTS[0]) / 3)
    assert {entry["id"] for entry in report["unreadable"]} == {"broken", "missing"}
    assert report["overall"] == pytest.approx((report["text"] + report["table"] + report["formula"]) / 3)
    # speculation pays on what the model memorised (the table's cells are the tiny model's guesses)
    assert report["tpf_by_type"]["text"] > 1.5 and report["tpf_by_type"]["formula"] > 1.5
    assert set(report["tpf_by_type"]) == {"text", "table", "formula"} and all(
        tpf >= 1.0 for tpf in report["tpf_by_type"].values())
    assert min(report["tpf_by_type"].values()) <= report["tpf"] <= max(report["tpf_by_type"].values())
    assert set(report["accepted_per_round"]) == {"text", "table", "formula"}
    # the tiny model has no reading: every accepted draft is the mask block's
    by_source = report["committed_by_source"]
    assert set(by_source) == {"text", "table", "formula"}
    for shares in by_source.values():
        assert set(shares) == {"mask", "reading", "ar"} and shares["reading"] == 0
        assert sum(shares.values()) == pytest.approx(1, abs=1e-3)
    assert by_source["formula"]["mask"] > 0.5  # memorised: most of it drafted and accepted
    assert all(0 <= report[k] <= 1 for k in ("overall", "text", "table", "formula"))
    # the JSON says what was measured
    threads = torch.get_num_threads()
    assert report["decode"] == {"mode": "spec", "block_size": 16, "speculative_max_batch": 0,
                                "device": "cpu", "threads": threads, "product_default": False}

    # By default the product's decoding as it ships (speculation at every batch size, the cap
    # written out as 0): the same reading.
    assert main(["eval", str(data), "--model", str(model_dir), "--json", "--check-exact"]) == 0
    shipped = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert shipped["exact"] is True
    assert shipped["decode"] == {"mode": "spec", "block_size": 32,
                                 "speculative_max_batch": 0,
                                 "device": "cpu", "threads": threads, "product_default": True}
    assert {k: shipped[k] for k in ("text", "table", "formula")} == {k: report[k] for k in ("text", "table", "formula")}

    with pytest.raises(SystemExit, match=r"block_size \(--block-size\) must be at least 2"):
        main(["eval", str(data), "--model", str(model_dir), "--block-size", "1"])


def test_pages_are_read_by_the_page_pipeline_and_scored_as_page_text(tmp_path, trained_tiny_model, processor):
    """A page item is what `gravityocr ocr` makes of the page, not one crop of it; crops and
    pages share one report, and the exactness check covers the pages too."""
    from gravityocr.model.evaluation.report import evaluate
    from gravityocr.model.evaluation.scores import page_similarity
    from gravityocr.pipelines.documents import Page
    from gravityocr.model.evaluation.eval_command import evaluate_set
    from gravityocr.pipelines.page_ocr import PageOcr, PageOcrConfig
    from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig
    from gravityocr.corpus.synthetic_pages import sample_pages

    recognizer = Recognizer(trained_tiny_model, processor)
    (page,) = sample_pages(1, seed=3)
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    page.image.save(data / "images" / "page.png")
    random_image(100, 84, 56).save(data / "images" / "line.png")
    truth = page.text(include_furniture=True)
    items = [ManifestItem("page", data / "images" / "page.png", "page", truth),
             ManifestItem("line", data / "images" / "line.png", "text", OVERFIT_TEXTS[0])]

    report = evaluate_set(recognizer, items, decode=DecodeSettings(block_size=16), check_exact=True)
    assert set(report.scores) == {"page", "text"} and report.exact is True
    page_outcome = next(o for o in report.items if o.id == "page")
    pipeline = PageOcr(CropRecognizer(recognizer, RecognizerConfig(DecodeSettings(mode="ar"))), PageOcrConfig())
    (read,) = pipeline.read_pages([Page("page", 1, page.image.convert("RGB"), page.image.width, page.image.height)])
    assert page_outcome.prediction == read.text(include_furniture=True) != ""
    assert page_outcome.score == page_similarity(page_outcome.prediction, truth)
    assert page_outcome.forward_passes > 0
    assert 0 < sum(page_outcome.drafted_tokens.values()) < page_outcome.committed_tokens  # its regions' drafts
    with pytest.raises(ValueError, match="evaluate\\(\\) reads crops"):
        evaluate(recognizer, items)
