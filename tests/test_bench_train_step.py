"""`gravityocr bench train-step`: times a recipe's batches whole and in micro-batches, and
reports that the micro-batches give the whole pass's gradient (figures are not judged)."""

from __future__ import annotations

import json

import torch

from gravityocr.bench.train_step import main
from gravityocr.model.network.loading import Recognizer, save_recognizer


def test_train_step_bench_reports_each_setting_with_the_same_gradient(tiny_model_factory, processor, tmp_path,
                                                                      capsys):
    save_recognizer(Recognizer(tiny_model_factory(0).to(torch.float32), processor), tmp_path / "model")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("size: tiny\nbatch_size: 6\ncurriculum:\n  - {stage: tables-formulas-intro, steps: 10}\n")
    assert main(["--config", str(recipe), "--model", str(tmp_path / "model"), "--steps", "2", "--first-step", "0",
                 "--rounds", "1", "--budgets", "0,300", "--threads", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    whole, split = report["settings"]
    assert report["padding"] >= 1.0
    assert whole["micro_batches"] == 1 and split["micro_batches"] > 1
    assert whole["max_grad_diff"] == 0.0 and split["max_grad_diff"] < 1e-4
    assert whole["speed_up"] == 1.0 and split["seconds_per_step"] > 0
