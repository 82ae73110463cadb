"""The layering holds: network <- decode <- engine <- recognizer <- pipelines <- serve, with
evaluation, corpus and training beside them and no cycle between modules
(`gravityocr bench layering`, bench/layering.py)."""

from __future__ import annotations

from gravityocr.bench.layering import allowed, cycles, import_graph, room_of, wrong_arrows


def test_no_import_runs_against_the_layering_and_no_modules_import_each_other():
    graph = import_graph()
    assert {"gravityocr.serve.app", "gravityocr.model.engine.engine", "gravityocr.pipelines.recognizer"} <= set(graph)
    assert wrong_arrows(graph) == []
    assert cycles(graph) == []


def test_the_checker_sees_a_wrong_arrow_and_a_cycle():
    assert room_of("gravityocr.pipelines.recognizer") == "recognizer" and room_of("gravityocr.pipelines.page_ocr") == "pipelines"
    assert allowed("engine", "decode") and not allowed("decode", "engine") and not allowed("network", "training")
    assert allowed("training", "evaluation") and not allowed("evaluation", "training") and allowed("bench", "serve")
    graph = {"gravityocr.model.decode.reference": {"gravityocr.model.engine.engine"},
             "gravityocr.model.engine.engine": {"gravityocr.model.decode.reference"}}
    assert wrong_arrows(graph) == [("gravityocr.model.decode.reference", "gravityocr.model.engine.engine")]
    assert cycles(graph) == [["gravityocr.model.decode.reference", "gravityocr.model.engine.engine"]]
