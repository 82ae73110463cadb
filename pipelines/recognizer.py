"""The boundary between pages and the model: a list of (crop, task) in, text and decode
statistics per crop out, in one call, so that the regions of many pages decode as one
engine batch.

Everything about *how* crops are decoded lives in `_decode`: the batched engine
(`gravityocr.model.engine`, continuous batching of self-speculative decoding) when it is
installed, else the single-sequence reference decoders of `gravityocr.model.decoding`,
whose output the engine reproduces token for token. Either way the text is greedy AR
decoding of the same weights; only the speed differs.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from PIL import Image

from gravityocr.model.decoding import DecodeStats, greedy_decode, speculative_decode
from gravityocr.model.decode_settings import DecodeSettings
from gravityocr.model.loading import Recognizer, load_recognizer
from gravityocr.model.processor import TASK_PROMPTS, EncodedPrompt, InvalidInput
from gravityocr.model.stopping import without_loop


def engine_available() -> bool:
    try:
        from gravityocr.model.engine import Engine  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class RecognizerConfig:
    decode: DecodeSettings = field(default_factory=DecodeSettings)  # how crops are decoded (one meaning everywhere)
    # Longest output per task: a line of text, a whole table as HTML, one formula.
    max_new_tokens: dict[str, int] = field(default_factory=lambda: {"text": 256, "table": 1024, "formula": 256})
    max_batch_size: int = 32  # sequences the engine decodes together
    decoder: Literal["auto", "engine", "reference"] = "auto"  # auto: the engine when installed

    def __post_init__(self):
        if self.decoder not in ("auto", "engine", "reference"):
            raise ValueError(f"decoder must be 'auto', 'engine' or 'reference', got {self.decoder!r}")
        missing = set(TASK_PROMPTS) - set(self.max_new_tokens)
        if missing:
            raise ValueError(f"max_new_tokens lacks tasks {sorted(missing)}")

    def capped(self, limit: int) -> "RecognizerConfig":
        """The same config with every task's output capped at `limit` tokens."""
        return dataclasses.replace(self, max_new_tokens={task: min(n, limit) for task, n in self.max_new_tokens.items()})


@dataclass
class CropResult:
    text: str
    stats: DecodeStats | None = None
    finish_reason: str | None = None  # "eos" | "repetition" | "length" (model/stopping.py)
    error: str | None = None  # why this crop was not read (the rest of its page still is)

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
            "finish_reason": self.finish_reason,
        }


@dataclass
class _Job:
    index: int
    prompt: EncodedPrompt
    max_new_tokens: int


class CropRecognizer:
    """Reads crops with one recogniser; see the module docstring."""

    def __init__(self, recognizer: Recognizer, config: RecognizerConfig | None = None):
        self.recognizer = recognizer
        self.config = config or RecognizerConfig()
        if self.config.decoder == "engine" and not engine_available():
            raise ImportError("decoder='engine' but gravityocr.model.engine is not installed")
        self.decoder = ("engine" if engine_available() else "reference") if self.config.decoder == "auto" \
            else self.config.decoder

    @classmethod
    def load(cls, path: str | Path, config: RecognizerConfig | None = None,
             dtype: torch.dtype = torch.float32, device: str = "cpu") -> "CropRecognizer":
        return cls(load_recognizer(path, dtype=dtype, device=device), config)

    @property
    def context(self) -> int:
        return int(self.recognizer.model.config.text_config.max_position_embeddings)

    def recognize(self, crops: Sequence[tuple[Image.Image, str]]) -> list[CropResult]:
        """Text of every crop, in order. A crop the processor refuses (too small, too
        elongated, too large for the context) comes back with `error` set."""
        results: list[CropResult | None] = [None] * len(crops)
        jobs: list[_Job] = []
        processor = self.recognizer.processor
        for index, (image, task) in enumerate(crops):
            try:
                prompt = processor.encode(image, task)
            except InvalidInput as error:
                results[index] = CropResult("", error=str(error))
                continue
            room = self.context - prompt.length
            if room < 1:
                results[index] = CropResult("", error=f"crop needs {prompt.length} prompt tokens, more than the "
                                                      f"model's context of {self.context}")
                continue
            budget = min(self.config.max_new_tokens[task], processor.output_budget(prompt), room)
            jobs.append(_Job(index, prompt, budget))
        for index, result in self._decode(jobs).items():
            results[index] = result
        return results  # type: ignore[return-value]

    # --- the one place that knows how decoding is done ---------------------------------

    def _decode(self, jobs: list[_Job]) -> dict[int, CropResult]:
        if not jobs:
            return {}
        if self.decoder == "engine":
            return self._decode_with_engine(jobs)
        return self._decode_one_by_one(jobs)

    def _finish(self, token_ids: list[int], stats: DecodeStats, finish_reason: str) -> CropResult:
        """The crop's text; a loop cut by the stopping rule is shown once (model/stopping.py)."""
        if finish_reason == "repetition":
            token_ids = without_loop(token_ids)
        return CropResult(self.recognizer.processor.decode(token_ids), stats, finish_reason)

    def _decode_with_engine(self, jobs: list[_Job]) -> dict[int, CropResult]:
        from gravityocr.model.engine import Engine, Request

        model = self.recognizer.model
        longest = max(job.prompt.length + job.max_new_tokens for job in jobs)
        config = self.config.decode.engine_config(device=str(model.device), dtype=model.dtype,
                                                  threads=torch.get_num_threads(),
                                                  max_batch_size=min(self.config.max_batch_size, len(jobs)),
                                                  max_seq_len=min(longest, self.context))
        engine = Engine(model, config, eos_token_ids=self.recognizer.processor.eos_token_ids,
                        draft_rules=self.recognizer.processor.draft_rules)
        results: dict[int, CropResult] = {}
        for job in jobs:
            try:
                engine.add_request(Request(str(job.index), job.prompt, job.max_new_tokens))
            except (InvalidInput, ValueError) as error:
                results[job.index] = CropResult("", error=str(error))
        while engine.has_work():
            for finished in engine.step():
                results[int(finished.request_id)] = self._finish(finished.token_ids, finished.stats,
                                                                 finished.finish_reason)
        return results

    def _decode_one_by_one(self, jobs: list[_Job]) -> dict[int, CropResult]:
        model = self.recognizer.model
        eos = set(self.recognizer.processor.eos_token_ids)
        decode = self.config.decode
        results: dict[int, CropResult] = {}
        for job in jobs:
            try:
                if decode.mode == "spec":
                    decoded = speculative_decode(model, job.prompt, job.max_new_tokens, eos, decode.block_size,
                                                 draft_rules=self.recognizer.processor.draft_rules)
                else:
                    decoded = greedy_decode(model, job.prompt, job.max_new_tokens, eos)
            except ValueError as error:
                results[job.index] = CropResult("", error=str(error))
                continue
            results[job.index] = self._finish(decoded.token_ids, decoded.stats, decoded.finish_reason)
        return results
