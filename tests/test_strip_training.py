"""`gravityocr train-strips` end to end on a tiny corpus: the frozen tower's features are
cached per shard (and a second cache run adds nothing), training resumes from its
checkpoint, the tower never moves, and the trained reader (with its reading prefix)
decodes exactly."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from gravityocr.cli import main
from gravityocr.corpus.build import BuildConfig, build
from gravityocr.model.decode.reference import greedy_decode, speculative_decode
from gravityocr.model.network.loading import Recognizer, load_recognizer, save_recognizer
from gravityocr.model.network.ppocr_conversion import convert_onnx, rapidocr_model_path
from gravityocr.model.network.ppocr_loading import load_ppocr_recognizer as load_tower
from gravityocr.model.training.strip_feature_cache import read_cache
from gravityocr.model.network.strip_vision import UNREAD_BIAS, ReadingPrefix

from test_corpus_build import fixture_package  # noqa: F401  (the one-PDF Debian package)


def test_cache_train_resume_and_decode_exactly(tmp_path, fixture_package, tiny_model_factory, processor):  # noqa: F811
    corpus = tmp_path / "corpus"
    build(BuildConfig(corpus, tmp_path / "debs", seed=1, types=("text",), augment_share=0.3), log=lambda line: None,
          training={"text": ["fixture-doc"]}, fetch=lambda name, cache: fixture_package)
    start = tmp_path / "start"
    save_recognizer(Recognizer(tiny_model_factory(3, torch.float32), processor), start)
    tower = convert_onnx(rapidocr_model_path(), tmp_path / "tower.safetensors")
    recipe = tmp_path / "strips.yaml"
    recipe.write_text(json.dumps({
        "corpus": str(corpus), "cache": str(tmp_path / "cache"), "output_dir": str(tmp_path / "run"),
        "init_from": str(start), "tower_weights": str(tower), "reading_prefix": True, "types": ["text"],
        "validation_items": 1,
        "steps": 6, "projection_steps": 2, "batch_size": 4, "block_size": 8, "min_block_size": 4,
        "checkpoint_every": 2, "validate_every": 3, "warmup_steps": 1}))

    assert main(["train-strips", "--config", str(recipe), "--cache-only"]) == 0
    cached = read_cache(tmp_path / "cache")
    assert len(cached) == 8 and all(item.features.shape[1] == 1512 for item in cached)
    files = sorted(p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir())
    assert main(["train-strips", "--config", str(recipe), "--cache-only"]) == 0  # nothing left to do
    assert sorted(p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir()) == files

    assert main(["train-strips", "--config", str(recipe), "--stop-step", "4"]) == 0
    assert main(["train-strips", "--config", str(recipe)]) == 0  # resumes at step 4
    log = [json.loads(line) for line in (tmp_path / "run/train_log.jsonl").read_text().splitlines()]
    assert [record["step"] for record in log] == [1, 2, 3, 4, 5, 6]
    assert [record["denoise"] > 0 for record in log] == [False, False, True, True, True, True]
    assert "validation" in log[2] and "validation" in log[5]

    trained = load_file(str(tmp_path / "run/checkpoint/model.safetensors"))
    original = load_file(str(tower))
    for name, tensor in original.items():
        if not name.startswith("head."):
            assert torch.equal(trained[f"strip_vision.recognizer.{name}"], tensor), name
    # the reading hint: the classifier is the CTC head's rows for the decoder's characters
    # (blank last), frozen; its projection trained from zero
    vocab = processor.tokenizer.get_vocab()
    characters = load_tower(tower).characters
    for character in ("a", "Z", "7", " "):
        row = characters.index(character)
        assert torch.equal(trained["strip_vision.reading_head.weight"][vocab[character]], original["head.fc.weight"][row])
    assert torch.equal(trained["strip_vision.reading_head.weight"][-1], original["head.fc.weight"][0])
    assert trained["strip_vision.reading_head.bias"][vocab["<table>"]] == UNREAD_BIAS
    assert trained["strip_vision.reading_projection.weight"].abs().sum() > 0
    recognizer = load_recognizer(tmp_path / "run/checkpoint", dtype=torch.float64)
    eos = set(recognizer.processor.eos_token_ids)
    from PIL import Image

    prompt = recognizer.processor.encode(Image.new("RGB", (300, 30), "white"), "text")
    # trained and decoding with the reading prefix after the visual tokens
    prefix = ReadingPrefix.of(recognizer.model.config)
    assert prefix == ReadingPrefix.for_tokenizer(processor.tokenizer)
    assert int((prompt.input_ids == prefix.placeholder_id).sum()) > 0
    with torch.no_grad():
        expected = greedy_decode(recognizer.model, prompt, 16, eos).token_ids
        assert speculative_decode(recognizer.model, prompt, 16, eos, 8).token_ids == expected


def test_length_weights_favour_long_texts_and_keep_each_types_share():
    from gravityocr.model.training.strip_feature_cache import CachedItem
    from gravityocr.model.training.strips import LONGEST_WEIGHT, SHORTEST_WEIGHT, length_weights

    texts = [("text", "ab"), ("text", "a" * 40), ("text", "b" * 1000), ("table", "x" * 50), ("table", "y" * 500)]
    items = [CachedItem(str(i), kind, None, None, [], text) for i, (kind, text) in enumerate(texts)]
    weights = length_weights(items)
    # within a type: in proportion to the clamped length
    assert weights[1] / weights[0] == pytest.approx(40 / SHORTEST_WEIGHT)
    assert weights[2] / weights[1] == pytest.approx(LONGEST_WEIGHT / 40)
    # across types: each type's draws as its item count gives them (3 text items, 2 tables)
    assert sum(weights[:3]) == pytest.approx(3) and sum(weights[3:]) == pytest.approx(2)


def test_vertical_detail_trains_and_validates_on_a_development_set(tmp_path, fixture_package, tiny_model_factory,  # noqa: F811
                                                                   processor, capsys):
    """A run with vertical detail caches the map's rows beside the strip features, trains the
    detail's projection from zero, and validates on a development set's items, none of whose
    texts it trains on."""
    from gravityocr.model.evaluation.manifest import ManifestItem, write_manifest
    from gravityocr.model.network.strip_vision import FEATURES_PER_TOKEN, VERTICAL_PER_TOKEN

    corpus = tmp_path / "corpus"
    build(BuildConfig(corpus, tmp_path / "debs", seed=1, types=("text",), augment_share=0.0), log=lambda line: None,
          training={"text": ["fixture-doc"]}, fetch=lambda name, cache: fixture_package)
    rows = [row for shard in sorted(corpus.glob("shards/**/*.parquet")) for row in pq.read_table(shard).to_pylist()]
    development = tmp_path / "dev"
    (development / "images").mkdir(parents=True)
    entries = []
    for row in rows[:2]:  # two of the training texts, drawn again: held out of training
        path = development / "images" / f"{row['id']}.png"
        path.write_bytes(row["image"])
        entries.append(ManifestItem(f"dev-{row['id']}", path, "text", row["text"]))
    write_manifest(development, entries)
    start = tmp_path / "start"
    save_recognizer(Recognizer(tiny_model_factory(3, torch.float32), processor), start)
    tower = convert_onnx(rapidocr_model_path(), tmp_path / "tower.safetensors")
    recipe = tmp_path / "vertical.yaml"
    recipe.write_text(json.dumps({
        "corpus": str(corpus), "cache": str(tmp_path / "cache"), "output_dir": str(tmp_path / "run"),
        "init_from": str(start), "tower_weights": str(tower), "reading_prefix": True, "types": ["text"],
        "vertical_detail": True, "validation_set": str(development), "validation_items": 5,
        "steps": 3, "projection_steps": 1, "batch_size": 4, "block_size": 8, "min_block_size": 4,
        "checkpoint_every": 3, "validate_every": 3, "warmup_steps": 1}))
    assert main(["train-strips", "--config", str(recipe), "--cache-only"]) == 0
    cached = read_cache(tmp_path / "cache")
    assert all(item.features.shape[1] == FEATURES_PER_TOKEN + VERTICAL_PER_TOKEN for item in cached)
    capsys.readouterr()
    assert main(["train-strips", "--config", str(recipe)]) == 0
    assert f"{len(cached) - 2} training items, 2 held out" in capsys.readouterr().out
    log = [json.loads(line) for line in (tmp_path / "run/train_log.jsonl").read_text().splitlines()]
    assert set(log[-1]["validation"]) == {"text"}
    trained = load_file(str(tmp_path / "run/checkpoint/model.safetensors"))
    assert trained["strip_vision.vertical_projection.weight"].abs().sum() > 0
    assert load_recognizer(tmp_path / "run/checkpoint").model.strip_vision.vertical_detail


def test_every_train_strips_flag_says_what_it_does():
    import argparse

    from gravityocr.model.training.strips import add_arguments

    parser = argparse.ArgumentParser(prog="gravityocr train-strips")
    add_arguments(parser)
    assert all(action.help for action in parser._actions), [a.option_strings for a in parser._actions if not a.help]
    assert "where the checkpoint" in parser.format_help()


def test_type_shares_set_each_types_share_of_the_draws_whatever_its_count():
    from gravityocr.model.training.strip_feature_cache import CachedItem
    from gravityocr.model.training.strip_train_config import StripTrainConfig
    from gravityocr.model.training.strips import sampling_weights

    items = [CachedItem(f"t{i}", "text", torch.zeros(1, 1), torch.ones(1, 3), [1], "abc") for i in range(2)]
    items += [CachedItem(f"f{i}", "formula", torch.zeros(1, 1), torch.ones(1, 3), [1], "x^{2}") for i in range(8)]
    config = StripTrainConfig(types=("text", "formula"), type_shares={"text": 0.3, "formula": 0.7})
    weights = sampling_weights(items, config)
    assert sum(weights[:2]) == pytest.approx(0.3) and sum(weights[2:]) == pytest.approx(0.7)
    assert weights[0] == weights[1] and len(set(weights[2:])) == 1
    assert sampling_weights(items, StripTrainConfig()) is None  # uniform draws
    with pytest.raises(ValueError, match="type_shares"):
        StripTrainConfig(types=("formula",), type_shares={"text": 1.0}).validate()
