"""The synthetic crop generator: deterministic, in-vocabulary, at the model's scale, tables that match their targets."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re

import numpy as np
import pytest

from gravityocr.model.evaluation.scores import canonicalize_latex, parse_table
from gravityocr.model.training.curriculum import (
    CURRICULUM, KINDS, MAX_HEIGHT, MAX_WIDTH, TOKEN_PX, VOCABULARY, CurriculumStage,
)
from gravityocr.model.training.synthetic import crop_stream, generate_crop
from gravityocr.model.training.text_sources import clean_text, corpus

HARD = CURRICULUM[-1]
CLEAN_TABLES = CurriculumStage("test-clean-tables", type_weights={"table": 1.0})
MERGED_TABLES = dataclasses.replace(CLEAN_TABLES, name="test-merged-tables", merged_cells=True)


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_crop(kind):
    a, b = generate_crop(123, HARD, kind), generate_crop(123, HARD, kind)
    assert a.image.tobytes() == b.image.tobytes() and a.text == b.text and a.type == kind
    other = generate_crop(124, HARD, kind)
    assert (other.image.tobytes(), other.text) != (a.image.tobytes(), a.text)


def test_kind_drawn_by_stage_weights_is_the_same_crop_as_asking_for_it():
    crops = [generate_crop(seed, HARD) for seed in range(12)]
    assert {crop.type for crop in crops} == set(KINDS)
    for seed, crop in enumerate(crops[:4]):
        assert generate_crop(seed, HARD, crop.type).text == crop.text
    assert {generate_crop(seed, CURRICULUM[0]).type for seed in range(5)} == {"text"}


def test_crop_stream_is_consecutive_seeds():
    stream = list(itertools.islice(crop_stream(40, CURRICULUM[1]), 3))
    assert [c.text for c in stream] == [generate_crop(40 + i, CURRICULUM[1]).text for i in range(3)]


def test_every_stage_and_type_renders_in_vocabulary_within_size_limits():
    for stage in CURRICULUM:
        kinds = [k for k in KINDS if stage.type_weights.get(k, 0) > 0]
        for kind, seed in itertools.product(kinds, range(3)):
            crop = generate_crop(seed, stage, kind)
            assert crop.image.mode == "RGB"
            assert crop.image.width <= MAX_WIDTH and crop.image.height <= MAX_HEIGHT, (stage.name, kind)
            assert np.asarray(crop.image.convert("L")).min() < 128, "no ink"
            assert crop.text and set(crop.text) <= VOCABULARY, (stage.name, kind, crop.text)
            if kind == "text":
                lines = crop.text.split("\n")
                assert 1 <= len(lines) <= stage.max_lines
                assert all(len(line) <= stage.max_chars for line in lines)


def test_first_stage_is_short_clean_monospace_at_one_character_per_token_column():
    stage = CURRICULUM[0]
    assert (stage.min_chars, stage.max_chars, stage.fonts, stage.noise) == (2, 5, ("DejaVuSansMono",), 0.0)
    for seed in range(5):
        crop = generate_crop(seed, stage, "text")
        assert 2 <= len(crop.text) <= 5 and "\n" not in crop.text
        advance = (crop.image.width - 4) / len(crop.text)  # margins are 2-8 px a side
        assert TOKEN_PX - 6 <= advance <= TOKEN_PX + 8
        assert 2 * TOKEN_PX - 6 <= crop.image.height <= 2 * TOKEN_PX + 20


def test_curriculum_gets_harder_in_small_steps():
    assert 8 <= len(CURRICULUM) <= 20
    for easier, harder in zip(CURRICULUM, CURRICULUM[1:]):
        assert harder.max_chars >= easier.max_chars and harder.noise >= easier.noise
        assert harder.max_lines >= easier.max_lines and harder.formula_complexity >= easier.formula_complexity
    assert CURRICULUM[-1].max_chars == 40 and len(CURRICULUM[-1].fonts) > 3
    assert CURRICULUM[-1].type_weights["table"] > 0 and CURRICULUM[-1].type_weights["formula"] > 0


def _rules(dark: np.ndarray, axis: int) -> int:
    """Count runs of pixel lines (rows for axis=1, columns for axis=0) that are dark across the table."""
    full = dark.mean(axis=axis) > 0.9
    return int(np.sum(full[1:] & ~full[:-1]) + full[0])


def test_table_targets_parse_and_match_the_drawn_grid():
    seen_rulings = set()
    for seed in range(16):
        crop = generate_crop(seed, CLEAN_TABLES)
        layout = crop.table
        assert crop.type == "table" and crop.text == layout.to_html()
        assert crop.text.startswith("<table><tr>") and crop.text.endswith("</tr></table>")
        assert re.search(r">\s+<", crop.text) is None, "whitespace between tags"
        tree = parse_table(crop.text)
        assert len(tree.children) == layout.n_rows
        cells = [cell for row in tree.children for cell in row.children]
        assert len(cells) == len(layout.cells) == layout.n_rows * layout.n_cols
        assert [c.content for c in cells] == [c.text for c in layout.cells]
        assert all(len(c.text) <= 8 for c in layout.cells)
        seen_rulings.add(layout.ruling)
        # Measure the grid in the pixels: ink is dark, the image is clean (noise 0).
        gray = np.asarray(crop.image.convert("L"))
        ys, xs = np.nonzero(gray < 128)
        dark = gray[ys.min():ys.max() + 1, xs.min():xs.max() + 1] < 128
        if layout.ruling == "grid":
            assert _rules(dark, axis=1) == layout.n_rows + 1
            assert _rules(dark, axis=0) == layout.n_cols + 1
        elif layout.ruling == "horizontal":
            assert _rules(dark, axis=1) == 2 + layout.header
    assert {"grid", "horizontal"} <= seen_rulings


def test_merged_cells_produce_colspan_and_rowspan():
    spans = set()
    for seed in range(30):
        layout = generate_crop(seed, MERGED_TABLES).table
        tree = parse_table(layout.to_html())
        cells = [cell for row in tree.children for cell in row.children]
        assert [(c.rowspan, c.colspan) for c in cells] == [(c.rowspan, c.colspan) for c in layout.cells]
        assert sum(c.rowspan * c.colspan for c in layout.cells) == layout.n_rows * layout.n_cols
        html = layout.to_html()
        spans |= {attr for attr in ('colspan="2"', 'rowspan="2"') if attr in html}
    assert spans == {'colspan="2"', 'rowspan="2"'}


def test_formula_targets_are_canonical_latex():
    for seed in range(10):
        crop = generate_crop(seed, HARD, "formula")
        assert canonicalize_latex(crop.text) == crop.text
        assert "$" not in crop.text and "\\left" not in crop.text


def test_clean_text_maps_onto_the_allowed_characters():
    allowed = frozenset("abcdefghijklmnopqrstuvwxyz '\"-")
    assert clean_text("“café”\t—  naïve\x00", allowed) == "\"cafe\" - naive"


def test_corpus_has_prose_and_code():
    lines = corpus()
    assert len(lines.prose) >= 5 and len(lines.code) >= 5


def test_a_saved_corpus_replaces_the_machines_own(tmp_path, monkeypatch):
    """A leased machine renders this machine's text: the corpus travels as a file."""
    from gravityocr.model.training import text_sources

    saved = tmp_path / "corpus.json"
    text_sources.write_corpus(saved)
    here = corpus()
    monkeypatch.setenv(text_sources.CORPUS_FILE_VARIABLE, str(saved))
    corpus.cache_clear()
    try:
        assert corpus() == here
        saved.write_text(json.dumps({"prose": ["Only this line."], "code": ["x = 1"]}))
        corpus.cache_clear()
        assert corpus() == text_sources.Corpus(("Only this line.",), ("x = 1",))
    finally:
        corpus.cache_clear()
