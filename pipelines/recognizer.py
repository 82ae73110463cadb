"""The boundary between pages and the model: crops (image, task) in, text and decode
statistics per crop out, through one long-lived engine.

Every entry point reads crops through this class: `gravityocr ocr`, `eval`, the batch
job's engine actors and serve's replicas. Each `CropRecognizer` owns one `EngineLoop` (the
batched engine on a thread of its own, model/engine/loop.py), so crops submitted by
different callers, page batches or HTTP requests decode in the same rounds (continuous
batching across them), and the engine and its KV cache are built once, not per batch.
The reference decoders of `gravityocr.model.decode.reference` (decoder "reference") read the same
crops one by one: the engine's output equals theirs token for token, and tests compare the
two. Either way the text is greedy AR decoding of the same weights; only the speed differs.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from PIL import Image

from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.model.decode.reference import DecodeStats, greedy_decode, speculative_decode
from gravityocr.model.network.loading import Recognizer, load_recognizer
from gravityocr.model.network.processor import EncodedPrompt, InvalidInput
from gravityocr.model.network.tasks import TASK_PROMPTS, TASK_TOKEN_BUDGETS
from gravityocr.model.decode.crop_text import crop_text
from gravityocr.model.decode.draft_rules import DraftRules
from gravityocr.model.engine.config import EngineConfig
from gravityocr.model.engine.threads import engine_threads

if TYPE_CHECKING:
    from gravityocr.model.engine import Request
    from gravityocr.model.engine.loop import EngineLoop

DECODERS = ("engine", "reference")


@dataclass
class RecognizerConfig:
    decode: DecodeSettings = field(default_factory=DecodeSettings)  # how crops are decoded (one meaning everywhere)
    max_new_tokens: dict[str, int] = field(default_factory=lambda: dict(TASK_TOKEN_BUDGETS))  # longest output per task
    max_batch_size: int = 32  # sequences the engine decodes together (its cache slots)
    max_seq_len: int | None = None  # per crop: prompt + output tokens (a cache slot); None: the model's context
    decoder: Literal["engine", "reference"] = "engine"  # the reference decoders: for checking the engine

    def __post_init__(self):
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {', '.join(map(repr, DECODERS))}, got {self.decoder!r}")
        missing = set(TASK_PROMPTS) - set(self.max_new_tokens)
        if missing:
            raise ValueError(f"max_new_tokens lacks tasks {sorted(missing)}")
        if self.max_batch_size < 1 or (self.max_seq_len is not None and self.max_seq_len < 2):
            raise ValueError(f"max_batch_size must be >= 1 and max_seq_len >= 2, got {self.max_batch_size}, "
                             f"{self.max_seq_len}")

    def capped(self, limit: int) -> "RecognizerConfig":
        """The same config with every task's output capped at `limit` tokens."""
        return dataclasses.replace(self, max_new_tokens={task: min(n, limit) for task, n in self.max_new_tokens.items()})


@dataclass
class CropResult:
    text: str
    stats: DecodeStats | None = None
    finish_reason: str | None = None  # "eos" | "repetition" | "length" (model/decode/stopping.py)
    error: str | None = None  # why this crop was not read (the rest of its page still is)
    token_ids: list[int] = field(default_factory=list)  # what was decoded (exactness is about these)

    @property
    def ok(self) -> bool:
        return self.error is None

    def stats_dict(self) -> dict | None:
        if self.stats is None:
            return None
        return {
            "committed_tokens": self.stats.committed_tokens,
            "forward_passes": self.stats.forward_passes,
            "tokens_per_forward": round(self.stats.tokens_per_forward, 4),
            "accepted_per_round": list(self.stats.accepted_per_round),
            "ar_rounds": self.stats.ar_rounds,
            "drafted_tokens": dict(self.stats.drafted_tokens),
            "finish_reason": self.finish_reason,
        }


# Where a call's engine requests go, all at once: the loop itself (`EngineLoop.submit_all`),
# or a group that withdraws its requests together (serve's `EngineRequests`, one per HTTP request).
Submit = Callable[[list["Request"]], list[Future]]


class CropRecognizer:
    """Reads crops with one recogniser; see the module docstring."""

    def __init__(self, recognizer: Recognizer, config: RecognizerConfig | None = None, on_step=None):
        """`on_step(stats, finished_by_lane, lanes)` is called on the engine's thread after every
        step (metrics; model/engine/loop.py)."""
        self.recognizer = recognizer
        self.config = config or RecognizerConfig()
        # a formula's drafts kept to LaTeX's command names, where the tokenizer spells them
        self.draft_rules = DraftRules.of(recognizer.processor.tokenizer)
        self._on_step = on_step
        self._loop: EngineLoop | None = None
        self._loop_lock = threading.Lock()  # callers on several threads start one loop

    @classmethod
    def load(cls, path: str | Path, config: RecognizerConfig | None = None,
             dtype: torch.dtype = torch.float32, device: str = "cpu") -> "CropRecognizer":
        return cls(load_recognizer(path, dtype=dtype, device=device), config)

    @property
    def max_seq_len(self) -> int:
        """Prompt + output tokens one crop may take: the config's, within the model's context."""
        context = int(self.recognizer.model.config.text_config.max_position_embeddings)
        return min(self.config.max_seq_len or context, context)

    @functools.cached_property
    def engine_config(self) -> EngineConfig:
        """The engine's configuration: the decoding settings resolved for the model's device
        and the process's engine threads (model/engine/threads.py), the config's batch and
        slot sizes."""
        model = self.recognizer.model
        return EngineConfig.from_decode(self.config.decode, device=str(model.device), dtype=model.dtype,
                                        threads=engine_threads(), max_batch_size=self.config.max_batch_size,
                                        max_seq_len=self.max_seq_len)

    @property
    def loop(self) -> EngineLoop:
        """The long-lived engine loop (started on first use; `close()` stops it)."""
        with self._loop_lock:
            return self._loop or self._start_loop()

    def _start_loop(self) -> EngineLoop:
        from gravityocr.model.engine import Engine
        from gravityocr.model.engine.loop import EngineLoop

        model, processor, config = self.recognizer.model, self.recognizer.processor, self.engine_config
        self._loop = EngineLoop(lambda: Engine(model, config, processor.eos_token_ids,
                                               draft_rules=self.draft_rules), on_step=self._on_step)
        weakref.finalize(self, self._loop.stop)  # a recogniser dropped unclosed stops its thread too
        return self._loop

    def close(self) -> None:
        """Stop the engine loop (its thread); crops still in flight fail with an error."""
        with self._loop_lock:
            if self._loop is not None:
                self._loop.stop()
                self._loop = None

    def __enter__(self) -> "CropRecognizer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit(self, crops: Sequence[tuple[Image.Image, str]], submit: Submit | None = None) -> list[Future]:
        """One future per crop, in order, each resolving to its CropResult (never raising).
        A crop the processor refuses (too small, too elongated, too large for a slot) or that
        its caller abandoned comes back with `error` set. The crops go to the engine together
        (`submit`, default: this recogniser's loop's `submit_all`), so they join it in one step."""
        from gravityocr.model.engine import Request

        futures: list[Future | None] = [None] * len(crops)
        requests: dict[int, Request] = {}
        processor = self.recognizer.processor
        for index, (image, task) in enumerate(crops):
            try:
                prompt = processor.encode(image, task)
                budget = self._budget(prompt, task)
            except InvalidInput as error:
                futures[index] = _done(CropResult("", error=str(error)))
                continue
            if self.config.decoder == "reference":
                futures[index] = _done(self._decode_alone(prompt, budget, task))
            else:
                requests[index] = Request(str(index), prompt, budget)
        if requests:
            order = list(requests)
            try:
                engine_futures = (submit or self.loop.submit_all)([requests[index] for index in order])
            except Exception as error:  # noqa: BLE001 - e.g. serve's RequestAbandoned: these crops fail alone
                engine_futures = [_failed(error) for _ in order]
            for index, engine_future in zip(order, engine_futures):
                futures[index] = self._crop_future(engine_future, crops[index][1])
        return futures  # type: ignore[return-value]

    def recognize(self, crops: Sequence[tuple[Image.Image, str]], submit: Submit | None = None) -> list[CropResult]:
        """Text of every crop, in order (see `submit`)."""
        return [future.result() for future in self.submit(crops, submit)]

    # --- one crop ------------------------------------------------------------------------

    def _budget(self, prompt: EncodedPrompt, task: str) -> int:
        """Tokens the crop may write: its task's cap, what its size can hold, what its slot leaves."""
        room = self.max_seq_len - prompt.length
        if room < 1:
            raise InvalidInput(f"crop needs {prompt.length} prompt tokens, more than the {self.max_seq_len} "
                               "one crop may take")
        return min(self.config.max_new_tokens[task], self.recognizer.processor.output_budget(prompt), room)

    def _crop_future(self, engine_future: Future, task: str) -> Future:
        """A future of the CropResult that the engine's future of a RequestResult leads to."""
        out: Future = Future()

        def settle(done: Future) -> None:
            try:
                finished = done.result()
            except CancelledError:
                out.set_result(CropResult("", error="the request was abandoned"))
            except Exception as error:  # noqa: BLE001 - the engine's error for this crop
                out.set_result(CropResult("", error=str(error)))
            else:
                out.set_result(self._finish(finished.token_ids, finished.stats, finished.finish_reason, task))

        engine_future.add_done_callback(settle)
        return out

    def _finish(self, token_ids: list[int], stats: DecodeStats, finish_reason: str, task: str) -> CropResult:
        """The crop's text (model/decode/crop_text.py)."""
        text = crop_text(self.recognizer.processor, self.recognizer.lexicon, token_ids, finish_reason, task)
        return CropResult(text, stats, finish_reason, token_ids=list(token_ids))

    def _decode_alone(self, prompt: EncodedPrompt, budget: int, task: str) -> CropResult:
        model, processor, decode = self.recognizer.model, self.recognizer.processor, self.config.decode
        eos = set(processor.eos_token_ids)
        try:
            if decode.mode == "spec":
                decoded = speculative_decode(model, prompt, budget, eos, decode.block_size,
                                             draft_rules=self.draft_rules)
            else:
                decoded = greedy_decode(model, prompt, budget, eos)
        except ValueError as error:
            return CropResult("", error=str(error))
        return self._finish(decoded.token_ids, decoded.stats, decoded.finish_reason, task)


def _failed(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future


def _done(result: CropResult) -> Future:
    future: Future = Future()
    future.set_result(result)
    return future
