"""`gravityocr average`: one recogniser whose weights are the (weighted) mean of several.

Two runs that start from the same weights stay in one basin, and the point between them
often scores better than either (weight averaging, "model soups"); the default model's
recipe uses it after a joint stage. Every source must share the architecture and tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gravityocr.model.network.loading import Recognizer, load_recognizer, save_recognizer


class IncompatibleRecognizers(ValueError):
    """The sources differ in architecture or tokenizer, so their weights cannot be averaged."""


def _check_compatible(first: Recognizer, other: Recognizer, name: str) -> None:
    if first.processor.tokenizer.get_vocab() != other.processor.tokenizer.get_vocab():
        raise IncompatibleRecognizers(f"{name}: its tokenizer differs from the first source's")
    expected = {key: value.shape for key, value in first.model.state_dict().items()}
    found = {key: value.shape for key, value in other.model.state_dict().items()}
    if expected.keys() != found.keys():
        missing = sorted(expected.keys() - found.keys())[:3]
        extra = sorted(found.keys() - expected.keys())[:3]
        raise IncompatibleRecognizers(f"{name}: different parameters (missing {missing}, extra {extra})")
    for key, shape in expected.items():
        if found[key] != shape:
            raise IncompatibleRecognizers(f"{name}: {key} has shape {tuple(found[key])}, expected {tuple(shape)}")


def average_recognizers(sources: list[str | Path], weights: list[float] | None = None) -> Recognizer:
    """Loads every source in float32 and returns the first, its floating tensors replaced by
    the weighted mean (weights normalised to sum 1; equal by default)."""
    if not sources:
        raise ValueError("average needs at least one source model")
    weights = [1.0] * len(sources) if weights is None else list(weights)
    if len(weights) != len(sources):
        raise ValueError(f"{len(weights)} weights for {len(sources)} source models")
    if any(weight < 0 for weight in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {weights}")
    total = sum(weights)
    result = load_recognizer(sources[0])
    state = {key: value.clone() for key, value in result.model.state_dict().items()}
    for key, value in state.items():
        if value.is_floating_point():
            value.mul_(weights[0] / total)
    for source, weight in zip(sources[1:], weights[1:]):
        other = load_recognizer(source)
        _check_compatible(result, other, str(source))
        for key, value in other.model.state_dict().items():
            if value.is_floating_point():
                state[key].add_(value, alpha=weight / total)
            elif not torch.equal(value, state[key]):
                raise IncompatibleRecognizers(f"{source}: non-float tensor {key} differs from the first source's")
    result.model.load_state_dict(state)
    return result


def add_arguments(parser) -> None:
    parser.add_argument("sources", nargs="+", help="model directories or hub names (same architecture)")
    parser.add_argument("--output", required=True, help="directory to write the averaged recogniser to")
    parser.add_argument("--weights", type=float, nargs="+", help="one weight per source (default: equal)")
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16",
                        help="precision of the written weights (default float16, as the shipped model)")


def run(args) -> int:
    recognizer = average_recognizers(args.sources, args.weights)
    recognizer.model.to(getattr(torch, args.dtype))
    save_recognizer(recognizer, args.output)
    print(f"averaged {len(args.sources)} models into {args.output}")
    return 0
