"""What a caller hands the engine (`Request`), what it gets back (`RequestResult`), and the
engine's running state of one request (`Sequence`)."""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from gravityocr.model.decode.ctc_prefix import CTCPrefixScorer
from gravityocr.model.decode.reading_drafts import ReadingIndex
from gravityocr.model.decode.reference import DecodeStats
from gravityocr.model.network.processor import EncodedPrompt
from gravityocr.model.decode.stopping import stop_reason


@dataclass
class Request:
    request_id: str
    prompt: EncodedPrompt
    max_new_tokens: int


@dataclass
class RequestTimings:
    queue_seconds: float = 0.0  # added -> prefill started
    prefill_seconds: float = 0.0  # the batched prefill this request was part of
    decode_seconds: float = 0.0  # the rounds this request took part in


@dataclass
class RequestResult:
    request_id: str
    token_ids: list[int]  # committed tokens, the eos included when one was produced
    text: str | None  # decoded when the engine was given a tokenizer or processor
    finish_reason: str  # "eos" | "repetition" | "length" (model/decode/stopping.py)
    stats: DecodeStats
    timings: RequestTimings
    task: str = "text"  # the prompt's content type (metrics group decode figures by it)


@dataclass
class Sequence:
    """One admitted or waiting request: its committed tokens and where its KV lives."""

    request: Request
    eos_ids: frozenset[int]
    added_at: float = field(default_factory=time.perf_counter)
    slot: int = -1
    tokens: list[int] = field(default_factory=list)
    first_position: int = 0  # rope position of the first response token (set by prefill)
    stats: DecodeStats = field(default_factory=DecodeStats)
    timings: RequestTimings = field(default_factory=RequestTimings)
    recent_accepted: deque[int] = field(default_factory=lambda: deque(maxlen=4))
    # Drafts for the tokens after the last committed one, written by the prefill: the
    # first speculative round verifies them instead of running a draft pass.
    drafts: list[int] = field(default_factory=list)
    shape: object = None  # what the committed tokens say of a formula (model/decode/structured_drafts.py)
    # what the vision tower read, followed by the eos (set by the prefill of a model with a
    # reading prefix): what reading drafts and copy tokens come from (model/decode/reading_drafts.py)
    reading: ReadingIndex | None = None
    # a line decoded jointly with its CTC prefix scores (set by the prefill; model/decode/ctc_prefix.py)
    scorer: CTCPrefixScorer | None = None

    @property
    def prompt_len(self) -> int:
        return self.request.prompt.length

    @property
    def max_new_tokens(self) -> int:
        return self.request.max_new_tokens

    @property
    def finish_reason(self) -> str | None:
        """model/decode/stopping.py's rule, the one the reference decoders apply."""
        return stop_reason(self.tokens, self.eos_ids, self.max_new_tokens, self.request.prompt.task)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def x_position(self) -> int:
        """Rope position of the last committed token, the input of the next round."""
        return self.first_position + len(self.tokens) - 1

    def commit(self, tokens: list[int]) -> None:
        """Append tokens until the sequence is finished (same rule as the reference decoder)."""
        for token in tokens:
            if self.finished:
                return
            self.tokens.append(token)
            if self.shape is not None:
                self.shape.feed(token)

    def next_block(self, block_size: int, adaptive: bool) -> int:
        """Draft block for the next round. Never longer than what may still be committed
        after y (as in `speculative_decode`); with `adaptive`, about twice the recent
        acceptance, so a sequence whose drafts keep failing stops paying for long blocks."""
        block = block_size
        if adaptive and self.recent_accepted:
            mean = sum(self.recent_accepted) / len(self.recent_accepted)
            block = min(block_size, max(4, math.ceil(2 * mean + 2)))
        return max(2, min(block, self.max_new_tokens - len(self.tokens)))

    def result(self, text: str | None) -> RequestResult:
        self.stats.committed_tokens = len(self.tokens)
        return RequestResult(self.request.request_id, list(self.tokens), text, self.finish_reason or "length",
                             self.stats, self.timings, self.request.prompt.task)
