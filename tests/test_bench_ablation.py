"""`gravityocr bench ablation`: three arms from the same weights, matched budget, each read
greedily on held-out crops with spec output checked against AR (figures are not judged)."""

from __future__ import annotations

import json

import pytest
import torch

from gravityocr.bench.ablation import main
from gravityocr.model.network.loading import Recognizer, save_recognizer


@pytest.mark.timeout(600)
def test_ablation_trains_three_arms_and_reports_their_scores(tiny_model_factory, processor, tmp_path, capsys):
    model = tiny_model_factory(0).to(torch.float32)
    save_recognizer(Recognizer(model, processor), tmp_path / "init")
    argv = ["--init", str(tmp_path / "init"), "--stage", "mono-2-5", "--steps", "2", "--batch-size", "2",
            "--eval-items", "3", "--dtype", "float64", "--out", str(tmp_path / "arms"), "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [arm["objective"] for arm in report["arms"]] == ["joint", "ar_only", "no_ar"]
    for arm in report["arms"]:
        assert arm["steps"] == 2 and arm["exact"] is True
        assert 0.0 <= arm["overall"] <= 1.0 and arm["tpf"] >= 1.0
        assert (tmp_path / "arms" / arm["objective"] / "checkpoint" / "model.safetensors").exists()
    assert {"joint_over_ar_only", "no_ar_over_joint"} <= report.keys()
    for difference in ("joint_minus_ar_only", "no_ar_minus_joint"):
        assert -1.0 <= report[difference]["mean"] <= 1.0 and report[difference]["standard_error"] >= 0
    # The arms trained different objectives from the same start: their weights differ.
    from safetensors.torch import load_file
    joint, ar_only = (load_file(str(tmp_path / "arms" / o / "checkpoint" / "model.safetensors"))
                      for o in ("joint", "ar_only"))
    assert any(not torch.equal(joint[name], ar_only[name]) for name in joint)

    # Run again on the same folder: the finished arms are evaluated again, not retrained.
    argv[argv.index("--eval-items") + 1] = "4"
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert all(arm["train_seconds"] is None for arm in again["arms"])
    assert [arm["final_loss"] for arm in again["arms"]] == [arm["final_loss"] for arm in report["arms"]]
