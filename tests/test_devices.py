"""Device and dtype plumbing, checked on CPU: settings reach the engine, actors ask for GPUs
only when the cluster has them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.model.network.devices import resolve_device
from gravityocr.pipelines.batch_job import actor_resources
from gravityocr.serve.settings import ServeSettings


def test_auto_is_cpu_float32_without_a_gpu():
    assert not torch.cuda.is_available()
    assert resolve_device("auto") == ("cpu", torch.float32)
    assert resolve_device("cpu", "bfloat16") == ("cpu", torch.bfloat16)


def test_asking_for_cuda_without_one_is_a_clear_error():
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_device("cpu", "int8")


def test_engine_actors_request_gpus_only_when_the_cluster_has_them():
    assert actor_resources(cpus=16, gpus=2, max_actors=4) == {"num_gpus": 1, "num_cpus": 1}
    assert actor_resources(cpus=2, gpus=0, max_actors=2) == {"num_cpus": 0.5}  # leaves a CPU to render tasks
    assert actor_resources(cpus=1, gpus=0, max_actors=1) == {"num_cpus": 0.25}
    assert actor_resources(cpus=64, gpus=0, max_actors=4) == {"num_cpus": 1.0}


def test_serve_settings_carry_device_and_dtype():
    settings = ServeSettings.from_args({"device": "cpu", "dtype": "float32"})
    assert resolve_device(settings.device, settings.dtype) == ("cpu", torch.float32)
    assert ServeSettings().device == "auto"
    with pytest.raises(ValueError, match="unknown serve settings"):
        ServeSettings.from_args({"gpu": True})


def test_serve_settings_hold_the_decode_settings_of_their_config():
    with pytest.raises(ValueError, match=r"block_size \(--block-size\) must be at least 2"):
        ServeSettings.from_args({"decode": {"block_size": 1}})
    assert ServeSettings.from_args({"decode": {"block_size": 16, "speculative_max_batch": 0}}).decode == DecodeSettings(
        block_size=16, speculative_max_batch=0)
    with pytest.raises(ValueError, match=r"speculative_max_batch \(--speculative-max-batch\) must be at least 0"):
        ServeSettings.from_args({"decode": {"speculative_max_batch": -1}})
    with pytest.raises(ValueError, match="unknown decode settings"):
        ServeSettings.from_args({"decode": {"speculative_cap": 2}})
    # a decoding setting outside `decode:` is refused with where it belongs
    with pytest.raises(ValueError, match="speculative_max_batch: under `decode:`"):
        ServeSettings.from_args({"speculative_max_batch": 2})
    assert ServeSettings().decode == ServeSettings.from_args({}).decode == DecodeSettings()  # the product's


def test_engine_honours_its_dtype(trained_tiny_model, overfit_samples, tokenizer):
    from gravityocr.model.engine import Engine, EngineConfig, Request

    model = trained_tiny_model
    engine = Engine(model, EngineConfig(max_batch_size=2, max_seq_len=256, dtype=torch.float32, num_threads=1),
                    eos_token_ids=[tokenizer.eos_token_id])
    try:
        assert next(engine.model.parameters()).dtype == torch.float32
        result = engine.generate([Request("a", overfit_samples[0].prompt, 80)])[0]
        assert result.token_ids == overfit_samples[0].target_ids
    finally:
        model.to(torch.float64)


@pytest.mark.parametrize("flags, words", [
    (["--speculative-max-batch", "-1"], "speculative_max_batch (--speculative-max-batch) must be at least 0"),
    (["--block-size", "1"], "block_size (--block-size) must be at least 2")])
def test_serve_command_refuses_bad_overrides_before_starting_ray(flags, words):
    done = subprocess.run([sys.executable, "-m", "gravityocr.cli", "serve", *flags], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and f"gravityocr serve: {words}" in done.stderr
