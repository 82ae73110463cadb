"""Training recipes for `gravityocr train` and `gravityocr grpo`: a YAML file read into a
settings dataclass, the command-line flags that override it, and the run that follows."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gravityocr.model.network.loading import export_weights

Settings = TypeVar("Settings")


EXTENDS_KEY = "extends"


def read_recipe_mapping(path: str | Path, known: set[str], _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A recipe file's settings as a mapping, each file's names checked against `known`. A file
    may name another with `extends: FILE` (relative to its own directory): it starts from that
    file's settings and overrides the ones it names, whole values at a time (a curriculum given
    replaces the base's)."""
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ValueError(f"recipe files extend each other in a cycle: {chain}")
    if not path.is_file():
        named_by = f" (named by {_seen[-1]})" if _seen else ""
        raise FileNotFoundError(f"recipe file {path} not found{named_by}")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a recipe is a mapping of settings, got {type(raw).__name__}")
    base_name = raw.pop(EXTENDS_KEY, None)
    unknown = set(raw) - known
    if unknown:  # named here, so a typo in a base file points at that file
        raise ValueError(f"{path}: unknown settings {sorted(unknown)}; known: {sorted(known)}")
    if base_name is None:
        return raw
    if not isinstance(base_name, str):
        raise ValueError(f"{path}: `{EXTENDS_KEY}` names one recipe file, got {base_name!r}")
    return {**read_recipe_mapping(path.parent / base_name, known, (*_seen, path)), **raw}


def read_recipe(settings_type: type[Settings], path: str | Path, nested: dict[str, type] | None = None) -> Settings:
    """The settings a YAML file names (with those of the file it extends), validated; `nested`
    maps a setting holding a list of mappings to the dataclass each mapping becomes."""
    raw = read_recipe_mapping(path, {f.name for f in dataclasses.fields(settings_type)})
    for name, item_type in (nested or {}).items():
        if name in raw:
            raw[name] = [item_type(**item) for item in raw[name]]
    settings = settings_type(**raw)
    settings.validate()
    return settings


def add_run_arguments(parser: argparse.ArgumentParser, log_name: str) -> None:
    """The flags every training command takes; a command adds its own beside them."""
    parser.add_argument("--config", help="YAML file of the run's settings")
    parser.add_argument("--output-dir", help="where checkpoints and the log go (overrides the config)")
    parser.add_argument("--steps", type=int, help="total steps (overrides the config)")
    parser.add_argument("--threads", type=int, help="torch threads (overrides the config)")
    parser.add_argument("--device", help="torch device, e.g. cuda (overrides the config)")
    parser.add_argument("--max-seconds", type=float, help="this invocation's time budget (overrides the config)")
    parser.add_argument("--seed", type=int, help="data and initialisation seed (overrides the config)")
    parser.add_argument("--init-from", help="weights to start from (overrides the config)")
    parser.add_argument("--export", metavar="DIR", help="afterwards, write a float16 weights-only snapshot here")
    parser.add_argument("--no-progress", action="store_true", help=f"no progress bar (records still go to {log_name})")


def run_recipe(args: argparse.Namespace, settings_type: type, nested: dict[str, type], trainer_type: type,
               overridable: tuple[str, ...]) -> int:
    """Read the recipe, apply the flags given, train (resuming where a checkpoint is) and export."""
    settings: Any = read_recipe(settings_type, args.config, nested) if args.config else settings_type()
    for name in overridable:
        if getattr(args, name) is not None:  # a flag given on the command line overrides the config file
            setattr(settings, name, getattr(args, name))
    trainer = trainer_type(settings)  # validates the settings
    if trainer.step:
        print(f"resuming {settings.output_dir} from step {trainer.step}")
    trainer.run(progress_bar=not args.no_progress)
    if args.export:
        export_weights(trainer.checkpoint_dir, args.export)
    return 0
