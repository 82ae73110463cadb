"""Engine settings and the two ways the engine refuses work up front (never by running
out of memory half-way through a batch)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

import torch

from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.model.network.processor import InvalidInput


class RequestTooLong(InvalidInput):
    """prompt + max_new_tokens does not fit a cache slot (EngineConfig.max_seq_len)."""


class CacheTooLarge(ValueError):
    """The KV cache the config asks for would not fit in the memory that is free."""


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


@dataclass
class EngineConfig:
    """The engine's own configuration. Commands build it from the user's decoding settings
    (model/decode/settings.py) with `from_decode`, which resolves the product's defaults;
    here each batch cap is already resolved, None meaning no cap."""

    max_batch_size: int = 64  # cache slots = sequences decoded together in one round
    max_seq_len: int = 2048  # per slot: prompt + new tokens
    block_size: int = 32  # draft block B (mode "spec")
    mode: Literal["spec", "ar"] = "spec"
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    num_threads: int = field(default_factory=_usable_cpus)  # torch.set_num_threads at engine start
    # Per-request block from its running acceptance: next = clamp(2 * mean(recent) + 2, 4, block_size).
    # Every drafted position costs a pass position whether it is accepted or not, so a
    # sequence whose drafts keep failing drafts short blocks (`gravityocr bench decode
    # --fixed-block` measures fixed blocks beside it). Same output either way.
    adaptive_block: bool = True
    adaptive_window: int = 4  # rounds that "recent" covers
    # A model with a reading prefix: speculative rounds verify the reading's next tokens
    # instead of running a draft pass (model/decode/reading_drafts.py; `gravityocr bench
    # decode --no-reading-drafts` measures mask drafts beside them). Same output either way.
    reading_drafts: bool = True
    # Speculative rounds only while at most this many sequences run, plain AR rounds above
    # (None: at any batch size). A round's verify pass costs by its tokens on a CPU; with the
    # shipped reader's drafts a round commits enough of them that speculation wins at every
    # batch size measured (docs/decoding.md). Same output either way.
    speculative_max_batch: int | None = None

    @classmethod
    def from_decode(cls, decode: DecodeSettings, *, device: str, dtype: torch.dtype, threads: int,
                    max_batch_size: int, max_seq_len: int) -> "EngineConfig":
        """The engine configuration `decode` decodes with. The one place user settings become
        an `EngineConfig`, so that every command resolves the cap alike."""
        resolved = decode.resolved()
        return cls(max_batch_size=max_batch_size, max_seq_len=max_seq_len, block_size=decode.block_size,
                   mode=decode.mode, device=device, dtype=dtype, num_threads=threads,
                   speculative_max_batch=resolved.speculative_max_batch or None)

    def __post_init__(self):
        if self.mode not in ("spec", "ar"):
            raise ValueError(f"mode must be 'spec' or 'ar', got {self.mode!r}")
        if self.max_batch_size < 1 or self.max_seq_len < 2:
            raise ValueError(f"max_batch_size must be >= 1 and max_seq_len >= 2, got {self.max_batch_size}, {self.max_seq_len}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be at least 2, got {self.block_size}")
        if self.num_threads < 1:
            raise ValueError(f"num_threads must be at least 1, got {self.num_threads}")
        if self.speculative_max_batch is not None and self.speculative_max_batch < 1:
            raise ValueError("speculative_max_batch must be at least 1 (None: any batch), "
                             f"got {self.speculative_max_batch}")

    def speculates(self, running: int) -> bool:
        """Whether a round of `running` sequences is speculative (else one AR token each)."""
        return self.mode == "spec" and (self.speculative_max_batch is None or running <= self.speculative_max_batch)

    def check_fits(self, request_id: str, prompt_length: int, max_new_tokens: int) -> None:
        """Raise RequestTooLong if prompt + max_new_tokens cannot finish in one slot."""
        total = prompt_length + max_new_tokens
        if total > self.max_seq_len:
            raise RequestTooLong(
                f"request {request_id!r}: prompt of {prompt_length} tokens plus {max_new_tokens} new tokens is "
                f"{total}, more than the engine's max_seq_len of {self.max_seq_len}; use a smaller image or "
                "fewer new tokens"
            )

    @property
    def slot_capacity(self) -> int:
        """Tokens one slot holds: max_seq_len plus room for the mask tokens of a draft pass
        started just before the end (their KV is written, then dropped)."""
        return self.max_seq_len + self.block_size + 1
