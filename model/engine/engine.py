"""The decoding engine: continuous batching of self-speculative (or plain AR) decoding.

One `step()` is one round for every running sequence: admit waiting requests into free
slots (one batched prefill, which also drafts each newcomer's first round), then draft +
verify every running sequence together (a newcomer verifies its prefill's drafts), or one
AR token each (AR mode, or a batch past EngineConfig.speculative_max_batch), commit, and
hand back the sequences that finished. The output of every request is token for token
what `decoding.greedy_decode` writes for it alone.

Single-threaded and synchronous on purpose: a Ray actor or a Serve replica owns one
engine and calls `add_request` / `step` (or `generate`) from its own loop.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

from ..decoding import first_block
from ..draft_rules import DraftRules
from ..structured_drafts import kept_to_structure
from .config import EngineConfig
from .runner import ModelRunner
from .scheduler import Scheduler
from .sequence import Request, RequestResult, Sequence


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
    committed_tokens: int = 0  # all committed tokens, prefill's first token included
    forward_passes: int = 0  # per sequence, as in DecodeStats: TPF = committed / passes
    decode_tokens: int = 0  # tokens committed by decode rounds (not by prefill)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0  # wall time of decode rounds only
    # CPU time of the whole process (all threads) during decode rounds: unlike wall time,
    # not inflated when other processes compete for the cores (used by the bench).
    decode_cpu_seconds: float = 0.0

    def rounds_by_kind(self) -> dict[str, int]:
        """Decode rounds so far by kind (the metrics' `kind` label)."""
        return {"speculative": self.rounds - self.ar_rounds, "ar": self.ar_rounds}

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0


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
        self.runner = ModelRunner(self.model, self.config)
        self.scheduler = Scheduler(self.config.max_batch_size)
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
            self._free_slot(sequence)
        self._stats.aborted_requests += 1
        return True

    def committed(self, request_id: str) -> list[int]:
        """The tokens committed so far for a waiting or running request (for streaming)."""
        return list(self._sequences[request_id].tokens)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[RequestResult]:
        """Admit waiting requests, run one round for every running sequence; returns the
        requests that finished in this step."""
        finished: list[RequestResult] = []
        newcomers = self.scheduler.admit()
        if newcomers:
            self._prefill(newcomers, finished)
        running = list(self.scheduler.running)
        if running:
            start, cpu_start = time.perf_counter(), time.process_time()
            if self.config.speculates(len(running)):
                self._speculative_round(running)
            else:
                self._ar_round(running)
            elapsed = time.perf_counter() - start
            self._stats.rounds += 1
            self._stats.decode_seconds += elapsed
            self._stats.decode_cpu_seconds += time.process_time() - cpu_start
            for sequence in running:
                sequence.timings.decode_seconds += elapsed
            self._finish_all([s for s in running if s.finished], finished)
        return finished

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

    # --- one round --------------------------------------------------------------------

    def _prefill(self, newcomers: list[Sequence], finished: list[RequestResult]) -> None:
        start = time.perf_counter()
        # Drafts for the first round only where that round is speculative (newcomers are running already).
        speculating = self.config.speculates(len(self.scheduler.running))
        blocks = [first_block(self.config.block_size, s.max_new_tokens) if speculating else 0 for s in newcomers]
        output = self.runner.prefill(newcomers, blocks)
        elapsed = time.perf_counter() - start
        self._stats.prefill_seconds += elapsed
        for i, sequence in enumerate(newcomers):
            sequence.timings.queue_seconds = start - sequence.added_at
            sequence.timings.prefill_seconds = elapsed
            self._count_pass(sequence)
            self._commit(sequence, [output.first_tokens[i]], in_decode=False)
            sequence.drafts = output.drafts[i]
        self._finish_all([s for s in newcomers if s.finished], finished)

    def _speculative_round(self, running: list[Sequence]) -> None:
        for sequence in running:  # drafts from the prefill: verified first
            if sequence.drafts:
                room = max(0, sequence.max_new_tokens - len(sequence.tokens) - 1)  # drafts beyond the bonus
                sequence.drafts = kept_to_structure(sequence.shape, sequence.drafts[:room])
        blocks = [s.next_block(self.config.block_size, self.config.adaptive_block) for s in running]
        shapes = [s.shape for s in running] if self._structured_classic_drafts else None
        output = self.runner.speculative_round(running, blocks, shapes)
        for sequence, y, accepted, after_y in zip(running, output.y, output.accepted, output.after_y):
            if y is None:  # verified the drafts it came with: no draft pass of its own
                sequence.drafts = []
            else:
                self._count_pass(sequence)  # draft
                self._commit(sequence, [y])
                if sequence.finished:  # the reference stops here: its verify pass never ran
                    sequence.stats.accepted_per_round.append(0)
                    continue
            self._count_pass(sequence)  # verify
            accepted = min(accepted, self._commit(sequence, after_y))  # none past an eos or the length
            sequence.stats.accepted_per_round.append(accepted)
            sequence.recent_accepted.append(accepted)

    def _ar_round(self, running: list[Sequence]) -> None:
        for sequence, token in zip(running, self.runner.ar_round(running)):
            self._count_pass(sequence)
            sequence.stats.ar_rounds += 1
            self._commit(sequence, [token])
            # A speculative sequence's pending drafts were for the token just committed and
            # those after it: a later speculative round drafts afresh.
            sequence.drafts = []
        self._stats.ar_rounds += 1

    def _count_pass(self, sequence: Sequence) -> None:
        sequence.stats.forward_passes += 1
        self._stats.forward_passes += 1

    def _commit(self, sequence: Sequence, tokens: list[int], in_decode: bool = True) -> int:
        """Commit tokens until the sequence finishes; returns how many were committed."""
        before = len(sequence.tokens)
        sequence.commit(tokens)
        added = len(sequence.tokens) - before
        self._stats.committed_tokens += added
        if in_decode:
            self._stats.decode_tokens += added
        return added

    def _finish_all(self, done: list[Sequence], finished: list[RequestResult]) -> None:
        # Highest slot first: a finished sequence in the last slot then never moves.
        for sequence in sorted(done, key=lambda s: s.slot, reverse=True):
            finished.append(self._finish(sequence))

    def _finish(self, sequence: Sequence) -> RequestResult:
        self._free_slot(sequence)
        self._sequences.pop(sequence.request.request_id, None)
        self._stats.finished_requests += 1
        return sequence.result(self._decode_text(sequence.tokens))

    def _free_slot(self, sequence: Sequence) -> None:
        self.runner.cache.lengths[sequence.slot] = 0
        moved = self.scheduler.release(sequence)
        if moved is not None:  # the last slot's sequence took the freed slot: its KV follows
            moved_sequence, moved_from = moved
            self.runner.cache.move(moved_from, moved_sequence.slot)

    def _decode_text(self, token_ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        if hasattr(self.tokenizer, "image_processor"):  # an OcrProcessor
            return self.tokenizer.decode(token_ids)
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)
