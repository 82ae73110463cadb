"""The flags every command that decodes takes besides the decoding settings (settings.py),
defined once: which model, and how many torch threads the engine runs on. Importing this
module does not import torch: commands build their parsers before loading a model."""

from __future__ import annotations


def add_model_argument(parser, default_text: str = "the shipped model") -> None:
    """`--model` (unset: None, which the command reads as `default_text` says)."""
    parser.add_argument("--model", default=None, metavar="PATH",
                        help=f"model directory (Hugging Face format) or hub name (default: {default_text})")


def add_threads_argument(parser, default: int | None = None) -> None:
    """`--threads`, the engine's torch threads (unset: all the process may use;
    model/engine/threads.py `reserve_for_engine` takes it)."""
    parser.add_argument("--threads", type=int, default=default,
                        help="torch threads of the engine (default: "
                             + ("all the process may use" if default is None else str(default)) + ")")
