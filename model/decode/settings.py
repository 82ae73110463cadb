"""The decoding settings a person chooses: one dataclass and one set of command-line flags
(the engine's configuration is built from them by `EngineConfig.from_decode`).

Every command that decodes (`eval`, `ocr`, `batch`, `serve`, `bench decode`, `bench serve`,
`bench samples`) takes these flags through `add_decode_arguments`, and every config file
(the Serve config, the RayService) nests them under `decode:`, so a value means the same
wherever it is set.

The batch cap (`speculative_max_batch`) reads:

    None   the product's default, every batch size (what a user gets by leaving it unset)
    0      every batch size
    N >= 1 only while at most N sequences decode together

`resolved()` writes the default out (never None), in the same vocabulary;
`EngineConfig.from_decode(...)` hands the engine that cap (where the engine's own `None`
means no cap). The output text is the same under any setting: greedy AR decoding of the same weights.

Importing this module does not import torch: commands build their parsers before loading
a model.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

MODES = ("spec", "ar")

# What each setting is called on the command line, for messages that must name it either way.
FLAGS = {"mode": "--mode", "block_size": "--block-size", "speculative_max_batch": "--speculative-max-batch"}


def _named(field_name: str) -> str:
    """A setting as both spellings a user may have typed: `block_size (--block-size)`."""
    return f"{field_name} ({FLAGS[field_name]})"


@dataclass(frozen=True)
class DecodeSettings:
    """How crops are decoded. Frozen and checked on construction, so a settings object
    that exists is one the engine and the reference decoder accept."""

    mode: Literal["spec", "ar"] = "spec"  # self-speculative or plain greedy AR: the same text
    block_size: int = 32  # draft block B: masks drafted per speculative round
    # Speculative rounds only while at most this many sequences decode together, AR rounds
    # above. None (the default) and 0: every batch size; with the shipped reader's drafts
    # speculation beats AR rounds at every batch size measured, on a CPU too (docs/decoding.md).
    speculative_max_batch: int | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"{_named('mode')} must be 'spec' or 'ar', got {self.mode!r}")
        for name in ("block_size", "speculative_max_batch"):
            value = getattr(self, name)
            optional = name.endswith("_max_batch")
            if not (isinstance(value, int) and not isinstance(value, bool)) and not (optional and value is None):
                raise ValueError(f"{_named(name)} must be a whole number{' or null' if optional else ''}, "
                                 f"got {value!r}")
        if self.block_size < 2:
            raise ValueError(f"{_named('block_size')} must be at least 2, got {self.block_size}")
        if self.speculative_max_batch is not None and self.speculative_max_batch < 0:
            raise ValueError(f"{_named('speculative_max_batch')} must be at least 0 (0: any batch size; unset: the "
                             f"product default), got {self.speculative_max_batch}")

    @classmethod
    def from_mapping(cls, mapping: Mapping | None) -> "DecodeSettings":
        """From a config file's `decode:` mapping (missing keys: the defaults); an unknown
        key is refused, so a misspelt setting never passes for a default."""
        if mapping is not None and not isinstance(mapping, Mapping):
            raise ValueError(f"decode settings must be a mapping of setting to value, got {mapping!r}")
        values = dict(mapping or {})
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = set(values) - set(known)
        if unknown:
            raise ValueError(f"unknown decode settings {sorted(unknown)}; known: {known}")
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def resolved(self) -> "DecodeSettings":
        """These settings with the unset cap replaced by the product's default (0: every batch
        size), so the cap reads 0 or N, never None: what `EngineConfig.from_decode` runs and what
        reports say was run."""
        speculative = 0 if self.speculative_max_batch is None else self.speculative_max_batch
        return dataclasses.replace(self, speculative_max_batch=speculative)

    def report(self, device: str, threads: int) -> dict:
        """What a report says was measured: the resolved settings, the device and threads
        they ran on, and whether they are the ones the product decodes with by default."""
        resolved = self.resolved()
        return {**resolved.to_dict(), "device": device, "threads": threads,
                "product_default": resolved == DecodeSettings().resolved()}


# --- the command line ----------------------------------------------------------------------

def _default_text(value, defaults_from: str | None) -> str:
    if defaults_from is not None:
        return f"default: {defaults_from}"
    return "default: unset" if value is None else f"default: {value}"


def add_decode_arguments(parser: argparse.ArgumentParser, defaults: DecodeSettings | None = None, *,
                         with_mode: bool = False, defaults_from: str | None = None) -> None:
    """The decoding flags, in a group of their own. A flag left out leaves its value to
    `defaults` (the product's defaults unless given), or with `defaults_from` to the base
    that `decode_settings_from_args` is handed (e.g. a config file, named there). `--mode`
    only for commands that decode in one mode chosen by the user."""
    defaults = defaults or DecodeSettings()
    group = parser.add_argument_group(
        "decoding", "the same flags and meanings in every command (model/decode/settings.py); the text is the "
                    "same under any of them, only the speed differs")
    if with_mode:
        group.add_argument("--mode", choices=MODES, default=None,
                           help="self-speculative or plain greedy AR decoding "
                                f"({_default_text(defaults.mode, defaults_from)})")
    group.add_argument("--block-size", type=int, default=None, metavar="B",
                       help=f"draft block: masks drafted per speculative round, at least 2 "
                            f"({_default_text(defaults.block_size, defaults_from)})")
    group.add_argument("--speculative-max-batch", type=int, default=None, metavar="N",
                       help="speculative rounds only while at most N sequences decode together, AR rounds above "
                            "(the same text); 0 or unset (null in a config): at any batch size "
                            f"({_default_text(defaults.speculative_max_batch, defaults_from)})")
    parser.set_defaults(decode_defaults=defaults)


def decode_settings_from_args(args: argparse.Namespace, base: DecodeSettings | None = None) -> DecodeSettings:
    """The settings the flags ask for: each flag given replaces its value in `base` (else
    in the defaults `add_decode_arguments` was given). Raises ValueError, naming the flag,
    for values that cannot decode."""
    base = base if base is not None else getattr(args, "decode_defaults", None) or DecodeSettings()
    given = {name: getattr(args, name) for name in FLAGS if getattr(args, name, None) is not None}
    return dataclasses.replace(base, **given)
