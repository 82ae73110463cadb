"""GRPO on the AR path: group sampling, advantages, the policy-gradient step, and
`gravityocr grpo` end to end on the shipped weights (checkpoints, resume, exact decoding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gravityocr.cli import main
from gravityocr.model.training import curriculum, synthetic
from gravityocr.model.decode.reference import greedy_decode, speculative_decode
from gravityocr.model.training.grpo import CropSource, GrpoConfig, GrpoTrainer, group_advantages, policy_loss, response_log_probs
from gravityocr.model.training.joint_loss import Objective, TrainingSample, build_joint_batch, joint_loss
from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer
from gravityocr.model.training.rollouts import sample_group


def test_sampling_near_zero_temperature_is_greedy_decoding(trained_tiny_model, overfit_samples, tokenizer):
    eos = {tokenizer.eos_token_id}
    for sample in overfit_samples:
        greedy = greedy_decode(trained_tiny_model, sample.prompt, 80, eos).token_ids
        group = sample_group(trained_tiny_model, sample.prompt, 3, 80, eos, temperature=1e-6,
                             generator=torch.Generator().manual_seed(0))
        assert group == [greedy] * 3


def test_sampling_is_repeatable_and_varied(tiny_model_factory, overfit_samples, tokenizer):
    model = tiny_model_factory(3)
    prompt = overfit_samples[0].prompt
    draw = [sample_group(model, prompt, 8, 12, {tokenizer.eos_token_id}, 1.0, torch.Generator().manual_seed(7))
            for _ in range(2)]
    assert draw[0] == draw[1]
    assert len({tuple(response) for response in draw[0]}) > 1
    assert all(1 <= len(response) <= 12 for response in draw[0])
    for response in draw[0]:  # cut after the first eos, which is kept
        assert tokenizer.eos_token_id not in response[:-1]


def test_bad_sampling_arguments_are_clear_errors(tiny_model_factory, overfit_samples):
    model, prompt = tiny_model_factory(3), overfit_samples[0].prompt
    with pytest.raises(ValueError, match="temperature"):
        sample_group(model, prompt, 2, 5, {1}, temperature=0)
    with pytest.raises(ValueError, match="group_size"):
        sample_group(model, prompt, 0, 5, {1})
    with pytest.raises(ValueError, match="exceeds the context"):
        sample_group(model, prompt, 2, 10**6, {1})


def test_group_advantages_standardise_within_groups():
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.5], [0.3, 0.3, 0.3, 0.3]])
    advantages = group_advantages(rewards)
    assert torch.allclose(advantages[0], torch.tensor([1.4142, -1.4142, 0.0, 0.0]), atol=1e-4)
    assert torch.equal(advantages[1], torch.zeros(4))  # alike members teach nothing


def test_policy_gradient_step_raises_the_better_response(tiny_model_factory, overfit_samples, tokenizer):
    model = tiny_model_factory(5, torch.float32).train()
    prompt = overfit_samples[0].prompt
    better = tokenizer.encode("the fox", add_special_tokens=False) + [tokenizer.eos_token_id]
    worse = tokenizer.encode("dog 42", add_special_tokens=False) + [tokenizer.eos_token_id]
    batch = build_joint_batch(model, [TrainingSample(prompt, better), TrainingSample(prompt, worse)],
                              Objective.AR_ONLY, random_block_offset=False)

    def sequence_log_probs():
        with torch.no_grad():
            return response_log_probs(model, batch, 1.0)[0].sum(dim=1)

    before = sequence_log_probs()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss, kl = policy_loss(model, batch, group_advantages(torch.tensor([[1.0, 0.0]]))[0], tokens=len(better) + len(worse))
    loss.backward()
    optimizer.step()
    after = sequence_log_probs()
    assert kl == 0.0
    assert after[0] > before[0] and after[1] < before[1]


def test_kl_term_is_zero_at_the_reference_and_positive_away_from_it(tiny_model_factory, overfit_samples, tokenizer):
    model, other = tiny_model_factory(5, torch.float32), tiny_model_factory(6, torch.float32)
    response = tokenizer.encode("abc", add_special_tokens=False) + [tokenizer.eos_token_id]
    batch = build_joint_batch(model, [TrainingSample(overfit_samples[0].prompt, response)], Objective.AR_ONLY,
                              random_block_offset=False)
    advantages = torch.zeros(1)
    loss, kl = policy_loss(model, batch, advantages, tokens=len(response), reference=model, kl_weight=1.0)
    assert kl == pytest.approx(0.0, abs=1e-6) and float(loss) == pytest.approx(0.0, abs=1e-6)
    loss, kl = policy_loss(model, batch, advantages, tokens=len(response), reference=other, kl_weight=0.5)
    assert kl > 0 and float(loss) == pytest.approx(0.5 * kl, rel=1e-5)


def test_bad_grpo_config_is_a_clear_error(tmp_path):
    bad = tmp_path / "grpo.yaml"
    for text, message in [("group_size: 1\n", "group_size must be at least 2"),
                          ("groups: 4\n", "unknown settings"),
                          ("sources: [{stage: mono-2-5, kind: table}]\n", "has no 'table' crops"),
                          ("temperature: 0\n", "temperature must be positive"),
                          ("denoise_weight: -1\n", "denoise_weight must be 0")]:
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            GrpoConfig.from_file(bad)
    bad.write_text("sources: [{stage: nonsense}]\n")
    with pytest.raises(KeyError, match="no curriculum stage"):
        GrpoConfig.from_file(bad)


LINEAGE_GRPO_RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("[0-9][0-9]-*grpo*.yaml"))


@pytest.mark.parametrize("recipe", LINEAGE_GRPO_RECIPES, ids=lambda path: path.name)
def test_the_lineage_grpo_recipes_are_valid_configs(recipe):
    config = GrpoConfig.from_file(recipe)
    assert config.group_size >= 2 and {source.kind for source in config.sources} >= {None, "formula"}
    assert config.init_from.startswith("runs/")  # the stage before, not the shipped (now another) model


def test_the_drafter_term_trains_the_drafter_on_true_targets(tmp_path):
    """One step from the same weights on the same rollouts, with and without the term: the
    policy step alone moves the shared weights too, the term must lower the drafter's loss more.
    Paragraphs, not short lines: on those the shipped drafter is near perfect (loss ~0.05), and
    one step of a 1e-5 learning rate can as well raise as lower it."""
    after = {}
    for weight in (0.0, 20.0):
        config = GrpoConfig(output_dir=str(tmp_path / str(weight)), prompts_per_step=2, group_size=2, extra_tokens=2,
                            warmup_steps=0, learning_rate=1e-5, denoise_weight=weight, threads=1, seed=5,
                            sources=[CropSource("paragraphs")])
        trainer = GrpoTrainer(config)
        _, truths, _, _ = trainer.rollouts(0)
        batch = build_joint_batch(trainer.model, truths, Objective.NO_AR, generator=torch.Generator().manual_seed(0))

        def drafter_loss():
            with torch.no_grad():
                return float(joint_loss(trainer.model, batch, Objective.NO_AR).denoise)

        before = drafter_loss()
        record = trainer.train_step()
        assert (record.denoise > 0) == (weight > 0)
        after[weight] = drafter_loss()
    assert after[20.0] < min(before, after[0.0])


GRPO_YAML = """
steps: 2
prompts_per_step: 2
group_size: 4
extra_tokens: 4
warmup_steps: 1
learning_rate: 0.0001
kl_weight: 0.1
denoise_weight: 0.5
micro_batch_tokens: 200
checkpoint_every: 1
threads: 1
seed: 3
temperature: 3.0  # diverse samples whatever the default weights read right: every group informs
sources:
  - {stage: mono-3-11}
  - {stage: fonts-3-11}
"""


@pytest.mark.timeout(600)
def test_grpo_command_learns_resumes_exactly_and_keeps_decoding_exact(tmp_path):
    config_file = tmp_path / "grpo.yaml"
    config_file.write_text(GRPO_YAML)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["grpo", "--config", str(config_file), "--output-dir", str(straight), "--no-progress"]) == 0
    assert main(["grpo", "--config", str(config_file), "--output-dir", str(resumed), "--no-progress", "--steps", "1"]) == 0
    assert main(["grpo", "--config", str(config_file), "--output-dir", str(resumed), "--no-progress",
                 "--export", str(tmp_path / "export")]) == 0

    a, b = (load_file(str(run / "checkpoint" / "model.safetensors")) for run in (straight, resumed))
    start = load_recognizer(DEFAULT_MODEL_DIR).model.state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert any(not torch.equal(a[name], start[name].float()) for name in a), "GRPO must change the weights"
    records = [json.loads(line) for line in (resumed / "grpo_log.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2]
    assert all(0.0 <= record["reward"] <= 1.0 and record["response_tokens"] >= 1 for record in records)
    assert any(record["informative_groups"] > 0 for record in records)
    assert records[-1]["kl"] > 0  # the second step starts away from the reference
    assert all(record["denoise"] > 0 for record in records)

    # The GRPO-trained weights still decode speculatively exactly as greedy AR.
    recognizer = load_recognizer(tmp_path / "export")
    eos = set(recognizer.processor.eos_token_ids)
    for seed, stage in [(11, "mono-3-11"), (12, "fonts-8-20"), (13, "tables-formulas")]:
        crop = synthetic.generate_crop(seed, curriculum.stage_by_name(stage))
        prompt = recognizer.processor.encode(crop.image, crop.type)
        assert (speculative_decode(recognizer.model, prompt, 200, eos).token_ids
                == greedy_decode(recognizer.model, prompt, 200, eos).token_ids)

