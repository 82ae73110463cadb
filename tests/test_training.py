"""`gravityocr train`: checkpoints as it goes, and a resumed run equals an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gravityocr.cli import main
from gravityocr.model.training.schedule import REPLAN_EVERY, TIME_BUDGET_WINDOW, LearningRateSchedule, TimeBudget
from gravityocr.model.training.train import CurriculumPhase, TrainConfig, Trainer

# The stages that trained the previous default (docs/training-log.md), in order: 01-*.yaml ...
LINEAGE_RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("[0-9][0-9]-*.yaml"))

CONFIG_YAML = """
size: tiny
steps: 4
batch_size: 2
warmup_steps: 1
checkpoint_every: 2
shuffled_loss_every: 2
vision_frozen_steps: 2
threads: 1
curriculum:
  - {stage: mono-2-5, steps: 2, objective: ar_only}
  - {stage: mono-3-11, steps: 2}
"""


def _weights(run_dir):
    return load_file(str(run_dir / "checkpoint" / "model.safetensors"))


@pytest.mark.timeout(300)
def test_resumed_run_equals_uninterrupted_run(tmp_path):
    config_file = tmp_path / "train.yaml"
    config_file.write_text(CONFIG_YAML)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["train", "--config", str(config_file), "--output-dir", str(straight), "--no-progress"]) == 0
    assert main(["train", "--config", str(config_file), "--output-dir", str(resumed), "--no-progress",
                 "--steps", "2"]) == 0
    assert (resumed / "checkpoint" / "trainer_state.pt").exists()
    with (resumed / "train_log.jsonl").open("a") as log:  # a step done after the checkpoint, then killed
        log.write(json.dumps({"step": 3, "loss": 0.0}) + "\n")
    assert main(["train", "--config", str(config_file), "--output-dir", str(resumed), "--no-progress"]) == 0
    a, b = _weights(straight), _weights(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    log = [json.loads(line) for line in (resumed / "train_log.jsonl").read_text().splitlines()]
    assert [record["step"] for record in log] == [1, 2, 3, 4]  # no step logged twice after the resume
    assert log[0]["denoise_loss"] == 0.0 and log[3]["denoise_loss"] > 0  # AR-only phase, then joint
    assert log[0]["shuffled_loss"] is not None


def test_vision_tower_starts_frozen_and_biases_stay_frozen(tmp_path):
    config = TrainConfig(output_dir=str(tmp_path), size="tiny", steps=2, batch_size=2, vision_frozen_steps=1,
                         curriculum=[CurriculumPhase("mono-2-5", 2, "ar_only")], threads=1)
    trainer = Trainer(config)
    visual = trainer.model.model.visual
    before = {name: p.detach().clone() for name, p in visual.named_parameters()}
    trainer.run(progress_bar=False)
    after = dict(visual.named_parameters())
    changed = {name for name in before if not torch.equal(before[name], after[name].detach())}
    assert changed, "vision weights must train once unfrozen"
    assert not any(name.endswith(".bias") for name in changed)


def test_bad_config_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("size: huge\n")
    with pytest.raises(ValueError, match="size must be one of"):
        TrainConfig.from_file(bad)
    bad.write_text("learning_rat: 0.1\n")
    with pytest.raises(ValueError, match="unknown settings"):
        TrainConfig.from_file(bad)
    bad.write_text("curriculum: [{stage: nonsense, steps: 3}]\n")
    with pytest.raises((ValueError, KeyError)):
        TrainConfig.from_file(bad)


def test_micro_batched_steps_train_like_whole_steps(tmp_path):
    """A step run as length-sorted micro-batches updates the weights as one pass does."""
    def trained(name, micro_batch_tokens):
        config = TrainConfig(output_dir=str(tmp_path / name), size="tiny", steps=2, batch_size=6, warmup_steps=1,
                             vision_frozen_steps=0, vision_lr_scale=1.0, checkpoint_every=2,
                             shuffled_loss_every=1000, threads=1, micro_batch_tokens=micro_batch_tokens,
                             replay_fraction=0.5,
                             curriculum=[CurriculumPhase("mono-3-11", 1), CurriculumPhase("tables-formulas-intro", 1)])
        trainer = Trainer(config)
        trainer.model.double()
        history = trainer.run(progress_bar=False)
        return history, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    whole_history, whole = trained("whole", 0)
    split_history, split = trained("split", 300)
    for a, b in zip(whole_history, split_history):
        assert (b.loss, b.ar_loss, b.denoise_loss) == pytest.approx((a.loss, a.ar_loss, a.denoise_loss), rel=1e-6)
    for name in whole:
        assert torch.allclose(split[name], whole[name], rtol=1e-7, atol=1e-10), name


def test_many_loader_workers_deliver_the_single_worker_batches_in_step_order(tmp_path):
    from gravityocr.model.training.train import CropBatches, build_fresh_recognizer

    phases = [CurriculumPhase("mono-2-5", 2), CurriculumPhase("fonts-8-20", 5)]
    config = TrainConfig(output_dir=str(tmp_path), size="tiny", steps=7, batch_size=3, curriculum=phases, threads=1)
    recognizer = build_fresh_recognizer(config)

    def batches(workers: int) -> list:
        loader = torch.utils.data.DataLoader(CropBatches(config, recognizer.processor, recognizer.model, start=2),
                                             batch_size=None, num_workers=workers)
        return list(loader)

    single, many = batches(1), batches(3)
    assert [batch.step for batch in single] == [batch.step for batch in many] == [2, 3, 4, 5, 6]
    assert len({str(batch.joint.input_ids.tolist()) for batch in single}) == 5
    for one, other in zip(single, many):
        for name in ("input_ids", "position_ids", "attention_mask", "pixel_values", "ar_targets", "denoise_targets"):
            assert torch.equal(getattr(one.joint, name), getattr(other.joint, name)), (one.step, name)


def test_a_time_budget_ends_the_run_early_with_a_checkpoint_of_its_last_step(tmp_path):
    config = TrainConfig(output_dir=str(tmp_path), size="tiny", steps=10_000, batch_size=2, warmup_steps=1,
                         checkpoint_every=1000, shuffled_loss_every=1000, threads=1, data_workers=2,
                         max_seconds=20, curriculum=[CurriculumPhase("mono-2-5", 10_000)])
    history = Trainer(config).run(progress_bar=False)
    last = history[-1].step
    assert TIME_BUDGET_WINDOW[1] <= last < 10_000  # planned from the timed window, far short of the config's steps
    state = torch.load(tmp_path / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert state["step"] == last
    assert json.loads((tmp_path / "train_config.json").read_text())["steps"] == last
    with pytest.raises(ValueError, match="data_workers"):
        TrainConfig(data_workers=0).validate()
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        TrainConfig(micro_batch_tokens=-1).validate()


def test_a_moved_end_continues_the_learning_rate_from_where_it_was():
    schedule = LearningRateSchedule(peak=1e-3, floor=1e-5, warmup_steps=10, end_step=1000)
    assert schedule.rate(0) == pytest.approx(1e-4) and schedule.rate(9) == pytest.approx(1e-3)
    assert schedule.rate(505) == pytest.approx((1e-3 + 1e-5) / 2)  # the cosine's midpoint
    before = schedule.rate(300)
    schedule.retarget(300, 400)  # a budget shortens the run
    assert schedule.rate(300) == pytest.approx(before)
    rates = [schedule.rate(step) for step in range(300, 401)]
    assert all(a > b for a, b in zip(rates, rates[1:]))
    assert rates[-1] == pytest.approx(1e-5)
    early = LearningRateSchedule(peak=1e-3, floor=1e-5, warmup_steps=10, end_step=1000)
    early.retarget(3, 110)  # re-planned during the warm-up: the cosine starts at the warm-up's end
    assert early.rate(3) == pytest.approx(4e-4) and early.rate(10) == pytest.approx(1e-3)
    assert early.rate(110) == pytest.approx(1e-5)


def test_a_time_budget_plans_from_the_timed_window_and_stops_on_time():
    budget = TimeBudget(seconds=100, first_step=40, longest_end=10_000)
    start, end = (40 + step for step in TIME_BUDGET_WINDOW)
    assert budget.planned_end(start, 10.0, 10_000) == 10_000
    # 30 steps in 30 s: 1 s a step, 60 s left at step `end`
    assert budget.planned_end(end, 40.0, 10_000) == end + 60
    assert budget.planned_end(end, 40.0, end + 20) == end + 60  # lengthened again when time allows
    capped = TimeBudget(seconds=100, first_step=40, longest_end=end + 30)
    capped.planned_end(start, 10.0, end + 20)
    assert capped.planned_end(end, 40.0, end + 20) == end + 30  # never past the steps asked for
    assert budget.planned_end(end + 10, 50.0, end + 60) == end + 60  # between re-plans: the plan stands
    # REPLAN_EVERY steps on, the machine has slowed down: 80 steps in 85 s since the window
    # opened, 1.0625 s a step with 5 s left: 4 more steps, not the 10 planned
    later = end + REPLAN_EVERY
    assert budget.planned_end(later, 95.0, end + 60) == later + 4
    assert budget.planned_end(later + 2, 100.5, later + 4) == later + 2  # past the budget: stop now


def test_a_resumed_budgeted_run_keeps_its_plan_unless_asked_for_another(tmp_path):
    def config(steps):
        return TrainConfig(output_dir=str(tmp_path), size="tiny", steps=steps, batch_size=2, warmup_steps=1,
                           checkpoint_every=1000, shuffled_loss_every=1000, threads=1,
                           curriculum=[CurriculumPhase("mono-2-5", 10_000)])

    first = Trainer(config(100))
    first.replan(3)  # what a time budget does
    first.run(progress_bar=False)
    resumed = Trainer(config(100))
    assert resumed.step == 3 and resumed.config.steps == 3
    assert resumed.schedule == first.schedule  # no jump back to a 100-step cosine
    assert resumed.run(progress_bar=False) == [] and resumed.step == 3  # its plan is done
    extended = Trainer(config(50))
    assert extended.config.steps == 50 and extended.schedule.end_step == 50
    fresh = LearningRateSchedule(extended.config.learning_rate, extended.config.min_learning_rate, 1, 50)
    assert extended.schedule.rate(3) == pytest.approx(fresh.rate(3))


def test_a_phase_can_restrict_its_stage_to_one_content_type(tmp_path):
    from gravityocr.model.training import synthetic
    from gravityocr.model.training.train import sample_for_step

    recipe = tmp_path / "formulas.yaml"
    recipe.write_text("curriculum:\n  - {stage: fonts-8-20, steps: 0}\n  - {stage: hard, kind: formula, steps: 5}\n"
                      "batch_size: 8\nreplay_fraction: 0.5\n")
    config = TrainConfig.from_file(recipe)
    drawn = [synthetic.generate_crop(*sample_for_step(config, step, index)) for step in range(5) for index in range(8)]
    kinds = [crop.type for crop in drawn]
    assert set(kinds) == {"formula", "text"}  # the restricted phase, and replay of the text stage
    assert kinds.count("formula") > 10
    with pytest.raises(ValueError, match="has no 'table' crops"):
        TrainConfig(curriculum=[CurriculumPhase("fonts-8-20", 1, kind="table")]).validate()


@pytest.mark.parametrize("recipe", [path for path in LINEAGE_RECIPES if "grpo" not in path.name],
                         ids=lambda path: path.name)
def test_the_lineage_recipes_are_valid_configs(recipe):
    config = TrainConfig.from_file(recipe)
    assert config.size == "small" and config.curriculum
    # each stage starts from the stage before it (the first from scratch), never from
    # model/default, which now holds another model
    if recipe.name.startswith("01-"):
        assert config.init_from is None
    else:
        assert config.init_from.startswith("runs/")


def test_a_recipe_extends_another_and_overrides_whole_settings(tmp_path):
    (tmp_path / "base.yaml").write_text(CONFIG_YAML + "seed: 5\noutput_dir: runs/base\n")
    (tmp_path / "stages").mkdir()
    child = tmp_path / "stages" / "child.yaml"
    child.write_text("extends: ../base.yaml\nseed: 6\noutput_dir: runs/child\n"
                     "curriculum:\n  - {stage: fonts-8-20, steps: 3}\n")
    config = TrainConfig.from_file(child)
    assert (config.seed, config.output_dir, config.steps, config.batch_size) == (6, "runs/child", 4, 2)
    assert config.curriculum == [CurriculumPhase("fonts-8-20", 3)]  # the base's two phases are replaced, not merged
    grandchild = tmp_path / "stages" / "grandchild.yaml"
    grandchild.write_text("extends: child.yaml\nbatch_size: 3\n")
    config = TrainConfig.from_file(grandchild)
    assert (config.seed, config.batch_size, config.size) == (6, 3, "tiny")


def test_a_recipe_that_extends_wrongly_is_refused_with_the_file_named(tmp_path):
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("extends: second.yaml\n")
    second.write_text("extends: first.yaml\nseed: 1\n")
    with pytest.raises(ValueError, match="cycle.*first.yaml -> .*second.yaml -> .*first.yaml"):
        TrainConfig.from_file(first)
    first.write_text("extends: missing.yaml\n")
    with pytest.raises(FileNotFoundError, match=r"missing.yaml not found \(named by .*first.yaml\)"):
        TrainConfig.from_file(first)
    second.write_text(CONFIG_YAML + "sed: 1\n")
    first.write_text("extends: second.yaml\nseed: 2\n")
    with pytest.raises(ValueError, match=r"second.yaml: unknown settings \['sed'\]"):
        TrainConfig.from_file(first)
    first.write_text("extends: [second.yaml]\n")
    with pytest.raises(ValueError, match="names one recipe file"):
        TrainConfig.from_file(first)


def test_no_two_lineage_recipes_write_to_the_same_run_directory():
    from gravityocr.model.training.grpo import GrpoConfig

    output_dirs = {}
    for recipe in LINEAGE_RECIPES:
        settings_type = GrpoConfig if "grpo" in recipe.name else TrainConfig
        output_dirs.setdefault(settings_type.from_file(recipe).output_dir, []).append(recipe.name)
    assert len(LINEAGE_RECIPES) == 16  # 01-train.yaml ... 16-realign-text.yaml
    assert {d: names for d, names in output_dirs.items() if len(names) > 1} == {}


@pytest.mark.timeout(300)
def test_seed_flag_overrides_the_recipe(tmp_path):
    """`--seed N` runs what a recipe with `seed: N` runs (a repeat is a flag, not a file)."""
    config_file, seeded_file = tmp_path / "train.yaml", tmp_path / "seeded.yaml"
    config_file.write_text(CONFIG_YAML)
    seeded_file.write_text(CONFIG_YAML + "seed: 7\n")
    runs = {name: tmp_path / name for name in ("flag", "file", "default")}
    common = ["--no-progress", "--steps", "1"]
    assert main(["train", "--config", str(config_file), "--output-dir", str(runs["flag"]), "--seed", "7", *common]) == 0
    assert main(["train", "--config", str(seeded_file), "--output-dir", str(runs["file"]), *common]) == 0
    assert main(["train", "--config", str(config_file), "--output-dir", str(runs["default"]), *common]) == 0
    flag, file, default = (_weights(runs[name]) for name in ("flag", "file", "default"))
    assert all(torch.equal(flag[name], file[name]) for name in flag)
    assert not all(torch.equal(flag[name], default[name]) for name in flag)
