"""The decoding engine: continuous batching of self-speculative (or plain AR) decoding.

One `step()` is one round for every running sequence: admit waiting requests into free
slots (one batched prefill, which also drafts each newcomer's first round, or verifies
the first tokens of its reading where it drafts from one), then a
speculative round for every running sequence together (a newcomer verifies its prefill's
drafts), or one AR token each (AR mode, or a batch past EngineConfig.speculative_max_batch)
(model/engine/rounds.py); the scheduler applies each sequence's outcome and frees the
slots of those that finished, which are handed back. The output of every request is token for token
what `greedy_decode` (model/decode/reference.py) writes for it alone.

Single-threaded and synchronous on purpose: a Ray actor or a Serve replica owns one
engine and calls `add_request` / `step` (or `generate`) from its own loop.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

from gravityocr.model.decode.reference import first_block
from gravityocr.model.decode.draft_rules import DraftRules
from gravityocr.model.engine import rounds
from gravityocr.model.engine.config import EngineConfig
from gravityocr.model.engine.runner import ModelRunner
from gravityocr.model.engine.scheduler import Scheduler, prefill_groups
from gravityocr.model.engine.sequence import Request, RequestResult, Sequence


@dataclass
class EngineStats:
    """Counters for metrics, since the engine started."""

    batches_run: int = 0  # batched forward passes (prefill, draft, verify, AR)
    rounds: int = 0  # decode rounds (one per step that had running sequences)
    ar_rounds: int = 0  # of them, one AR token each (mode "ar", or past EngineConfig.speculative_max_batch)
    batch_size: int = 0  # sequences running now
    waiting: int = 0  # requests queued for a slot
    finished_requests: int = 0
    aborted_requests: int = 0  # dropped by `abort` before they finished (caller gone)
    preempted_requests: int = 0  # taken out by `preempt` to free a slot (their callers add them again)
    committed_tokens: int = 0  # all committed tokens, the prefills' included
    forward_passes: int = 0  # per sequence, as in DecodeStats: TPF = committed / passes
    # Wall time of prefills (the vision tower included), of the vision tower, of decode
    # rounds; and the CPU time of the whole process (all threads) in each, which unlike wall
    # time is not inflated when other processes compete for the cores (used by the bench).
    prefill_seconds: float = 0.0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    prefill_cpu_seconds: float = 0.0
    encode_cpu_seconds: float = 0.0
    decode_cpu_seconds: float = 0.0

    def decoder_seconds(self, clock: str = "wall") -> float:
        """Time in the decoder's passes, prefills' and rounds', the vision tower excluded
        (what speculation changes); `clock` "wall" or "cpu"."""
        if clock == "cpu":
            return self.prefill_cpu_seconds + self.decode_cpu_seconds - self.encode_cpu_seconds
        return self.prefill_seconds + self.decode_seconds - self.encode_seconds

    def rounds_by_kind(self) -> dict[str, int]:
        """Decode rounds so far by kind (the metrics' `kind` label)."""
        return {"speculative": self.rounds - self.ar_rounds, "ar": self.ar_rounds}


class Engine:
    def __init__(self, model, config: EngineConfig | None = None, eos_token_ids=(), tokenizer=None,
                 draft_rules: DraftRules | None = None):
        """`model` is moved to config.device / config.dtype and put in eval mode.
        `tokenizer` (a tokenizer or an OcrProcessor) is only used to fill RequestResult.text.
        With `draft_rules`, a formula's drafts are kept to LaTeX's command names, as
        `speculative_decode` does: the prefill's, and on the CPU also each
        round's draft pass's (elsewhere that would cost a device-to-host transfer between
        the round's two passes; the output is the same either way)."""
        self.config = config or EngineConfig()
        torch.set_num_threads(self.config.num_threads)
        context = model.config.text_config.max_position_embeddings
        if self.config.max_seq_len > context:
            raise ValueError(f"max_seq_len {self.config.max_seq_len} exceeds the model's context of {context}")
        self.model = model.to(device=self.config.device, dtype=self.config.dtype).eval()
        self.eos_ids = frozenset(int(t) for t in eos_token_ids)
        self.tokenizer = tokenizer
        self.draft_rules = draft_rules
        # Classic rounds keep their draft pass's drafts to structure too where those are host
        # memory anyway; on an accelerator that would cost a transfer between the two passes.
        self._structured_classic_drafts = (draft_rules is not None
                                           and torch.device(self.config.device).type == "cpu")
        # Rounds draft from the reading prefix where the model has one, the prefill included.
        self._reading_drafts = self.config.reading_drafts and self.model.reading_prefix is not None
        self.runner = ModelRunner(self.model, self.config, self.eos_ids)
        self.scheduler = Scheduler(self.runner.cache, self.config.max_batch_size)
        self._stats = EngineStats()
        self._sequences: dict[str, Sequence] = {}  # by request id: waiting or running

    # --- the API --------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a request; it joins the batch at the start of the next step."""
        self._check(request)
        sequence = Sequence(request, self.eos_ids, recent_accepted=deque(maxlen=self.config.adaptive_window),
                            shape=self.draft_rules.shape_for(request.prompt.task) if self.draft_rules else None)
        self._sequences[request.request_id] = sequence
        self.scheduler.add(sequence)

    def abort(self, request_id: str) -> bool:
        """Drop a waiting or running request (its caller is gone): its slot and KV are
        freed before the next step, and the other sequences decode on unchanged. False if
        no such request is waiting or running (already finished, or never added)."""
        sequence = self._sequences.pop(request_id, None)
        if sequence is None:
            return False
        if sequence.slot < 0:  # not admitted yet
            self.scheduler.withdraw(sequence)
        else:
            self.scheduler.release(sequence)
        self._stats.aborted_requests += 1
        return True

    def preempt(self, request_id: str) -> Request:
        """Take a running or waiting request out, as `abort` does, and return it for its
        caller to add again later: decoded again from its prompt, it writes the same tokens
        (every output is the request's greedy decoding alone), so only the work is lost."""
        sequence = self._sequences[request_id]
        self.abort(request_id)
        self._stats.aborted_requests -= 1
        self._stats.preempted_requests += 1
        return sequence.request

    def free_slots(self) -> int:
        """Slots the next step leaves free after admitting every waiting request (negative:
        requests that will still wait)."""
        return self.scheduler.max_slots - len(self.scheduler.running) - len(self.scheduler.waiting)

    def committed(self, request_id: str) -> list[int]:
        """The tokens committed so far for a waiting or running request (for streaming)."""
        return list(self._sequences[request_id].tokens)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[RequestResult]:
        """Admit waiting requests, run one round for every running sequence; returns the
        requests that finished in this step."""
        finished = []
        newcomers = self.scheduler.admit()
        if newcomers:
            finished += self._prefill(newcomers)
        running = list(self.scheduler.running)
        if running:
            start, cpu_start = time.perf_counter(), time.process_time()
            speculative = self.config.speculates(len(running))
            outcomes = rounds.speculative(self.runner, running, self.config.block_size, self.config.adaptive_block,
                                          self._structured_classic_drafts, self._reading_drafts) if speculative \
                else rounds.ar(self.runner, running)
            self._apply(running, outcomes)
            elapsed = time.perf_counter() - start
            self._stats.rounds += 1
            self._stats.ar_rounds += not speculative
            self._stats.decode_seconds += elapsed
            self._stats.decode_cpu_seconds += time.process_time() - cpu_start
            for sequence in running:
                sequence.timings.decode_seconds += elapsed
            finished += self.scheduler.release_finished(running)
        return [self._result(sequence) for sequence in finished]

    def generate(self, requests: list[Request]) -> list[RequestResult]:
        """Decode all `requests` to the end; results in request order."""
        if self.has_work():
            raise RuntimeError("generate() needs an idle engine; use add_request/step alongside other requests")
        if len({r.request_id for r in requests}) != len(requests):
            raise ValueError("generate() needs distinct request ids")
        for request in requests:  # refuse the whole batch before queueing any of it
            self._check(request)
        for request in requests:
            self.add_request(request)
        results: dict[str, RequestResult] = {}
        while self.has_work():
            results.update((r.request_id, r) for r in self.step())
        return [results[r.request_id] for r in requests]

    def stats(self) -> EngineStats:
        self._stats.batches_run = self.runner.batched_passes
        self._stats.encode_seconds = self.runner.encode_seconds
        self._stats.encode_cpu_seconds = self.runner.encode_cpu_seconds
        self._stats.batch_size = len(self.scheduler.running)
        self._stats.waiting = len(self.scheduler.waiting)
        return EngineStats(**vars(self._stats))

    def _check(self, request: Request) -> None:
        """Refuse a request that could never finish in its slot, before it is queued."""
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {request.max_new_tokens}")
        self.config.check_fits(request.request_id, request.prompt.length, request.max_new_tokens)
        if request.request_id in self._sequences:
            raise ValueError(f"request id {request.request_id!r} is already queued or running")

    # --- one step -------------------------------------------------------------------------

    def _prefill(self, newcomers: list[Sequence]) -> list[Sequence]:
        """The newcomers' prefill (where it is speculative, drafting their first round or
        verifying the first tokens of their readings); returns those it finished."""
        start, cpu_start = time.perf_counter(), time.process_time()
        speculating = self.config.speculates(len(self.scheduler.running))  # newcomers are running already
        blocks = [first_block(self.config.block_size, s.max_new_tokens) if speculating else 0 for s in newcomers]
        outcomes = []
        for group in prefill_groups([s.request.prompt.length for s in newcomers]):
            outcomes += rounds.prefill(self.runner, newcomers[group.start:group.stop], blocks[group.start:group.stop],
                                       self._reading_drafts)
        elapsed = time.perf_counter() - start
        self._stats.prefill_seconds += elapsed
        self._stats.prefill_cpu_seconds += time.process_time() - cpu_start
        for sequence in newcomers:
            sequence.timings.queue_seconds = start - sequence.added_at
            sequence.timings.prefill_seconds = elapsed
        self._apply(newcomers, outcomes)
        return self.scheduler.release_finished(newcomers)

    def _apply(self, sequences: list[Sequence], outcomes: list[rounds.Outcome]) -> None:
        for sequence, outcome in zip(sequences, outcomes):
            passes, committed = self.scheduler.apply(sequence, outcome)
            self._stats.forward_passes += passes
            self._stats.committed_tokens += committed

    def _result(self, sequence: Sequence) -> RequestResult:
        self._sequences.pop(sequence.request.request_id, None)
        self._stats.finished_requests += 1
        return sequence.result(self._decode_text(sequence.tokens))

    def _decode_text(self, token_ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        if hasattr(self.tokenizer, "image_processor"):  # an OcrProcessor
            return self.tokenizer.decode(token_ids)
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)
