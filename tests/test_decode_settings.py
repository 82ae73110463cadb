"""DecodeSettings: checked in one place, one meaning for each cap (None: the product's
default on the device, 0: every batch size, N: at most N), the same flags in every command."""

from __future__ import annotations

import argparse

import pytest
import torch

from gravityocr.model.engine.config import EngineConfig
from gravityocr.model.decode.settings import FLAGS, DecodeSettings, add_decode_arguments, decode_settings_from_args


@pytest.mark.parametrize("values, words", [
    (dict(mode="fast"), "mode (--mode) must be 'spec' or 'ar'"),
    (dict(block_size=1), "block_size (--block-size) must be at least 2"),
    (dict(block_size="32"), "block_size (--block-size) must be a whole number"),
    (dict(speculative_max_batch=-1), "speculative_max_batch (--speculative-max-batch) must be at least 0"),
    (dict(speculative_max_batch=2.5), "speculative_max_batch (--speculative-max-batch) must be a whole number or null"),
])
def test_each_bad_value_is_refused_naming_its_setting_and_flag(values, words):
    with pytest.raises(ValueError) as raised:
        DecodeSettings(**values)
    assert words in str(raised.value)


def test_settings_are_frozen_once_checked():
    with pytest.raises(AttributeError):
        DecodeSettings().block_size = 1  # type: ignore[misc]


def test_an_unset_cap_resolves_to_the_product_default_every_batch_size():
    assert DecodeSettings().resolved().speculative_max_batch == 0
    assert DecodeSettings(speculative_max_batch=6).resolved().speculative_max_batch == 6


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_none_zero_and_n_reach_the_engine_as_one_meaning(device):
    def engine_cap(**values):
        config = EngineConfig.from_decode(DecodeSettings(**values), device=device, dtype=torch.float32, threads=2,
                                                        max_batch_size=16, max_seq_len=64)
        return config.speculative_max_batch  # the engine's None: no cap

    assert engine_cap() is None  # unset: the product's default, every batch size
    assert engine_cap(speculative_max_batch=0) is None  # 0: any
    assert engine_cap(speculative_max_batch=6) == 6  # N: at most N


def test_engine_config_carries_every_setting():
    config = EngineConfig.from_decode(DecodeSettings(mode="spec", block_size=16, speculative_max_batch=3),
        device="cpu", dtype=torch.float64, threads=3, max_batch_size=5, max_seq_len=300)
    assert (config.mode, config.block_size, config.device, config.dtype, config.num_threads) == (
        "spec", 16, "cpu", torch.float64, 3)
    assert (config.max_batch_size, config.max_seq_len, config.speculative_max_batch) == (5, 300, 3)
    ar = EngineConfig.from_decode(DecodeSettings(mode="ar"), device="cpu", dtype=torch.float32, threads=1,
                                                 max_batch_size=1, max_seq_len=64)
    assert ar.mode == "ar"


def test_report_says_whether_it_is_what_the_product_runs():
    report = DecodeSettings().report("cpu", 2)
    assert report == {"mode": "spec", "block_size": 32, "speculative_max_batch": 0, "device": "cpu", "threads": 2,
                      "product_default": True}
    assert DecodeSettings(speculative_max_batch=0).report("cpu", 2)["product_default"] is True  # resolves alike
    assert DecodeSettings(speculative_max_batch=8).report("cpu", 2)["product_default"] is False
    assert DecodeSettings(block_size=16).report("cuda", 2)["product_default"] is False


def test_from_mapping_refuses_unknown_keys():
    assert DecodeSettings.from_mapping(None) == DecodeSettings()
    assert DecodeSettings.from_mapping({"block_size": 16, "speculative_max_batch": None}) == DecodeSettings(block_size=16)
    with pytest.raises(ValueError, match="unknown decode settings \\['blok_size'\\]"):
        DecodeSettings.from_mapping({"blok_size": 16})
    with pytest.raises(ValueError, match="must be a mapping"):
        DecodeSettings.from_mapping(["spec"])


@pytest.mark.parametrize("key", ["draft_ahead", "draft_branches", "draft_ahead_max_batch"])
def test_a_config_that_sets_a_removed_setting_is_refused_naming_it(key):
    """The one-pass rounds and their settings are gone: an old config that still sets one
    is refused, naming the key and the settings there are, never silently decoded otherwise."""
    with pytest.raises(ValueError) as raised:
        DecodeSettings.from_mapping({"mode": "spec", key: 0})
    assert str(raised.value) == (f"unknown decode settings [{key!r}]; "
                                 "known: ['mode', 'block_size', 'speculative_max_batch']")


def _parser(defaults=None, **options) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_decode_arguments(parser, defaults, **options)
    return parser


def test_flags_round_trip_to_settings():
    settings = DecodeSettings(mode="ar", block_size=16, speculative_max_batch=0)
    argv = ["--mode", "ar", "--block-size", "16", "--speculative-max-batch", "0"]
    assert decode_settings_from_args(_parser(with_mode=True).parse_args(argv)) == settings
    # no flags: the defaults given, else the product's (both caps unset)
    assert decode_settings_from_args(_parser().parse_args([])) == DecodeSettings()
    here = DecodeSettings(speculative_max_batch=0)
    assert decode_settings_from_args(_parser(here).parse_args([])) == here
    assert decode_settings_from_args(_parser(here).parse_args(["--speculative-max-batch", "3"])).speculative_max_batch == 3


def test_flags_override_a_base_and_are_checked():
    base = DecodeSettings(block_size=16, speculative_max_batch=2)
    args = _parser(with_mode=True, defaults_from="the config's").parse_args(["--speculative-max-batch", "0"])
    assert decode_settings_from_args(args, base) == DecodeSettings(block_size=16, speculative_max_batch=0)
    with pytest.raises(ValueError, match=r"block_size \(--block-size\) must be at least 2"):
        decode_settings_from_args(_parser().parse_args(["--block-size", "1"]))
    assert "--mode" not in _parser().format_help()  # only commands that decode in one chosen mode


def test_every_decoding_command_takes_the_same_flags():
    import importlib

    from gravityocr.bench.decode import build_parser as bench_decode_parser
    from gravityocr.cli import COMMANDS

    def decoding_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
        return {action.option_strings[0]: action.help for action in parser._actions
                if action.option_strings and action.option_strings[0] in FLAGS.values()}

    def command_parser(command: str) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=f"gravityocr {command}")
        importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
        return parser

    helps = {command: decoding_helps(command_parser(command)) for command in ("eval", "ocr", "batch", "serve")}
    helps["bench decode"] = decoding_helps(bench_decode_parser())
    shared = [flag for flag in FLAGS.values() if flag != "--mode"]
    for command, flags in helps.items():
        assert set(shared) <= set(flags), command
        for flag in shared:  # one meaning: the same words, up to where the default is named
            assert flags[flag].rsplit(" (default", 1)[0] == helps["eval"][flag].rsplit(" (default", 1)[0], (command, flag)
    assert "0 or unset (null in a config): at any batch size" in helps["eval"]["--speculative-max-batch"]
    assert all("--mode" in helps[command] for command in ("ocr", "batch", "serve"))
    assert "--mode" not in helps["eval"] and "--mode" not in helps["bench decode"]
