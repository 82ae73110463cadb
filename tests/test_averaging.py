"""`gravityocr average`: the written weights are the weighted mean, the result decodes exactly
as greedy AR, and sources that cannot be averaged are refused with a clear error."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gravityocr.cli import main
from gravityocr.model.training.averaging import IncompatibleRecognizers, average_recognizers
from gravityocr.model.network.configs import TINY, build_config
from gravityocr.model.decode.reference import greedy_decode, speculative_decode
from gravityocr.model.network.loading import Recognizer, load_recognizer, save_recognizer
from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration

from conftest import SEPARATED_INIT, make_tiny_model, random_image


@pytest.fixture
def two_models(tmp_path, tokenizer, processor):
    directories = []
    for seed in (1, 2):
        directory = tmp_path / f"model-{seed}"
        save_recognizer(Recognizer(make_tiny_model(tokenizer, seed, torch.float32), processor), directory)
        directories.append(directory)
    return directories


def test_cli_writes_weighted_mean_that_decodes_exactly(tmp_path, two_models, tokenizer):
    first, second = (load_recognizer(directory).model.state_dict() for directory in two_models)
    output = tmp_path / "averaged"
    assert main(["average", str(two_models[0]), str(two_models[1]), "--weights", "3", "1",
                 "--dtype", "float32", "--output", str(output)]) == 0
    averaged = load_recognizer(output)
    state = averaged.model.state_dict()
    for key, value in state.items():
        torch.testing.assert_close(value, 0.75 * first[key] + 0.25 * second[key], rtol=0, atol=1e-6)
    assert not torch.equal(state["lm_head.weight"], first["lm_head.weight"])

    model = averaged.model.to(torch.float64)
    eos = {tokenizer.eos_token_id}
    for seed in range(3):
        prompt = averaged.processor.encode(random_image(seed, 84, 56), "text")
        assert (speculative_decode(model, prompt, 40, eos, block_size=16).token_ids
                == greedy_decode(model, prompt, 40, eos).token_ids)


def test_default_dtype_is_half_and_equal_weights(tmp_path, two_models):
    output = tmp_path / "averaged"
    assert main(["average", *map(str, two_models), "--output", str(output)]) == 0
    averaged = load_recognizer(output, dtype=None)
    assert averaged.model.lm_head.weight.dtype == torch.float16
    first, second = (load_recognizer(directory).model.lm_head.weight for directory in two_models)
    torch.testing.assert_close(averaged.model.lm_head.weight.float(), ((first + second) / 2).half().float())


def test_different_architecture_is_refused(tmp_path, two_models, tokenizer, processor):
    wider = dataclasses.replace(SEPARATED_INIT, text_ffn=TINY.text_ffn * 2)
    other = tmp_path / "wider"
    torch.manual_seed(3)
    save_recognizer(Recognizer(GravityOcrForConditionalGeneration(build_config(tokenizer, wider)), processor), other)
    with pytest.raises(IncompatibleRecognizers, match="shape"):
        average_recognizers([two_models[0], other])


@pytest.mark.parametrize("weights, message", [([1.0], "1 weights for 2"), ([1.0, -1.0], "non-negative"),
                                              ([0.0, 0.0], "positive sum")])
def test_bad_weights_are_refused(two_models, weights, message):
    with pytest.raises(ValueError, match=message):
        average_recognizers(two_models, weights)
