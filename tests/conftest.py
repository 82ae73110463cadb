"""Shared fixtures: tiny random GLM-OCR-architecture models and their processor."""

from __future__ import annotations

import dataclasses

import gravityocr  # noqa: F401 - first: it sets MKL's reproducibility before torch computes
import numpy as np
import pytest
import torch
from PIL import Image

from gravityocr.model.network.configs import TINY, build_config
from gravityocr.model.training.joint_loss import Objective, TrainingSample, build_joint_batch, joint_loss
from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration
from gravityocr.model.network.processor import OcrProcessor, make_image_processor
from gravityocr.model.network.tokenizer import build_char_tokenizer

# Session fixtures defined once here, so every test module shares one local Ray cluster and
# one S3 endpoint (a fixture imported into two modules would be set up twice).
from ray_cluster import ray_cluster  # noqa: E402,F401
from s3_endpoint import s3_endpoint  # noqa: E402,F401

torch.set_num_threads(1)

# Modules that start Ray (a local cluster, Serve, a batch job): one worker runs them all, one
# at a time, so that no two clusters share the machine's ports and cores; the other tests
# go to either worker (`--dist loadgroup` in pyproject.toml).
RAY_MODULES = frozenset({"test_batch_job", "test_batch_through_serve", "test_infra_prometheus",
                         "test_metrics_export", "test_ray_cluster", "test_serve", "test_serve_cli"})


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__ in RAY_MODULES:
            item.add_marker(pytest.mark.xdist_group("ray"))

# Random tiny models have nearly tied logits; with a larger init scale their logits
# spread out, and in float64 a 33-token pass and a 1-token pass cannot round to a
# different argmax. Exactness tests then compare the algorithm, not float noise.
SEPARATED_INIT = dataclasses.replace(TINY, initializer_range=0.1)


@pytest.fixture(scope="session")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def processor(tokenizer):
    return OcrProcessor(tokenizer, make_image_processor(max_pixels=28 * 28 * 64))


def make_tiny_model(tokenizer, seed: int, dtype=torch.float64, size=SEPARATED_INIT):
    torch.manual_seed(seed)
    model = GravityOcrForConditionalGeneration(build_config(tokenizer, size))
    return model.to(dtype).eval()


def random_image(seed: int, width: int, height: int) -> Image.Image:
    pixels = np.random.RandomState(seed).randint(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="session")
def tiny_model_factory(tokenizer):
    return lambda seed, dtype=torch.float64: make_tiny_model(tokenizer, seed, dtype)


OVERFIT_TEXTS = [
    "the quick brown fox jumps over the lazy dog 0123456789",
    "<table><tr><td>a</td><td>b</td></tr><tr><td>1</td><td>2</td></tr></table>",
    "x^{2}+\\frac{1}{2}",
]


@pytest.fixture(scope="session")
def overfit_samples(processor, tokenizer):
    """Three (image, task, target) samples a tiny model can memorise in seconds."""
    tasks = ["text", "table", "formula"]
    samples = []
    for i, (text, task) in enumerate(zip(OVERFIT_TEXTS, tasks)):
        prompt = processor.encode(random_image(100 + i, 84 + 28 * i, 56), task)
        target = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        samples.append(TrainingSample(prompt, target))
    return samples


@pytest.fixture(scope="session")
def trained_tiny_model(tokenizer, overfit_samples):
    """A tiny model briefly joint-trained on `overfit_samples`, so its drafts are mostly right
    and it ends its outputs with eos: acceptance in decoding tests is then non-trivial."""
    torch.manual_seed(0)
    model = GravityOcrForConditionalGeneration(build_config(tokenizer, TINY))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(200):
        batch = build_joint_batch(model, overfit_samples * 2, Objective.JOINT, block_size=16, generator=generator)
        loss = joint_loss(model, batch).total
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.to(torch.float64).eval()
