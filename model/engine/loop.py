"""A long-lived engine on a thread of its own, fed from many callers.

An online service gets requests one by one from many concurrent handlers; they all submit
to one `EngineLoop`, whose thread keeps calling `engine.step()`. A request submitted while
others decode joins the batch at the next round (continuous batching across callers),
and each caller waits on its own future. A caller that gives up cancels its future
(`future.cancel()`): the request leaves the engine at the next round, so the slot and
compute go to requests someone still waits for. A caller that streams passes `on_tokens`:
it is called on the loop's thread with each round's newly committed tokens, all of them
before the future resolves.

Two lanes share the engine: online requests (an HTTP caller waits) and batch requests (a
nightly job's crops). Online requests go to the engine as they come; batch requests wait in
the loop's backlog and join, in steps that admit no online request, into the slots online
work leaves free: all of them while there is none, else no more slots than the online
requests hold (a round is as wide as its rows, and an online request waits for its rounds).
Batch sequences past that share, those that have committed least first, are preempted
(taken out, back at the head of the backlog): a waiting online request is admitted at the
next round whatever the batch backlog. The share holds for `ONLINE_HOLD_S` after the last
online request leaves, so a run of online requests does not find the batch lane grown into
every slot between two of them. A preempted crop is decoded again
from its prompt and writes the same tokens (each output is the request's greedy decoding
alone), so the lanes change who waits, never what is read.

The engine is built and run on the loop's thread, which takes the process's torch threads;
the thread that starts the loop runs torch on one thread from then on (model/engine/threads.py:
two threads with OpenMP teams of their own on the same cores leave the engine's workers asleep
between ops).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from gravityocr.model.engine.engine import Engine, EngineStats
from gravityocr.model.engine.sequence import Request, RequestResult
from gravityocr.model.engine.threads import release_caller_threads

log = logging.getLogger(__name__)
TokenListener = Callable[[list[int]], None]
ONLINE, BATCH = "online", "batch"  # the lanes, online first
LANES = (ONLINE, BATCH)
# Seconds the batch lane keeps to the online requests' share after the last of them left:
# online traffic comes in runs (a client sends its next request as the last one answers), and
# a batch lane that took every slot in the gap would hold the next request behind its
# prefills (`gravityocr bench lanes`, docs/one-pool.md).
ONLINE_HOLD_S = 1.0


@dataclass
class LaneStats:
    """Per lane since the loop started: requests waiting now (submitted, not in a slot yet),
    requests admitted into the engine (a preempted one counts again); batch sequences preempted."""

    waiting: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LANES, 0))
    admitted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LANES, 0))
    preempted: int = 0


class EngineLoop:
    def __init__(self, engine_factory, on_step=None):
        """`engine_factory()` builds the engine on the loop's thread (its error is raised
        here); it is called again after a failed step, so one bad batch fails only the
        requests that were in it. `on_step(stats, finished_by_lane, lanes)` is called on the
        loop's thread after every step (metrics); its error is logged, never stops the loop."""
        self._factory = engine_factory
        self._on_step = on_step
        self._engine: Engine
        # each item: the lane and requests of one submit call, admitted in the same step
        self._incoming: queue.Queue[tuple[str, list[tuple[Request, Future, TokenListener | None]]]] = queue.Queue()
        self._backlog: deque[tuple[Request, Future]] = deque()  # batch requests not in the engine yet
        self._batch_in_engine: dict[str, None] = {}  # ids of the batch requests in the engine, in admission order
        self._lanes = LaneStats()
        self._online_last = (0, float("-inf"))  # online requests in the engine when last seen, and when
        self._futures: dict[str, Future] = {}
        self._listeners: dict[str, tuple[TokenListener, int]] = {}  # request id -> (listener, tokens sent)
        self._ids = itertools.count()
        self._stopped = threading.Event()
        self._cancelled_before_admission = 0
        self.peak_batch_size = 0  # most sequences decoded together in one round so far
        built: Future = Future()  # settled once the engine is built, or with the error that building it raised
        self._thread = threading.Thread(target=self._run, args=(built,), name="engine-loop", daemon=True)
        self._thread.start()
        built.result()
        release_caller_threads()

    def submit(self, request: Request, on_tokens: TokenListener | None = None, lane: str = ONLINE) -> Future:
        """Queue `request` (its id is replaced by a unique one); the future resolves to its
        RequestResult, or raises the engine's error for it (e.g. RequestTooLong).
        `future.cancel()` withdraws the request, waiting or running. `on_tokens`, if given,
        gets the committed tokens as they come, round by round (online lane only: a batch
        request may be preempted and decoded again)."""
        return self._queue([(request, on_tokens)], lane)[0]

    def submit_all(self, requests: list[Request], lane: str = ONLINE) -> list[Future]:
        """Queue `requests` together: they join the engine in the same step (as far as slots
        allow, in order), so one caller's batch is scheduled the same way whenever it comes."""
        return self._queue([(request, None) for request in requests], lane)

    def _queue(self, items: list[tuple[Request, TokenListener | None]], lane: str) -> list[Future]:
        if lane not in LANES:
            raise ValueError(f"lane must be one of {', '.join(LANES)}, got {lane!r}")
        if lane == BATCH and any(on_tokens is not None for _, on_tokens in items):
            raise ValueError("batch requests do not stream (a preempted one is decoded again)")
        futures = [Future() for _ in items]
        if self._stopped.is_set():
            for future in futures:
                future.set_exception(RuntimeError("the engine loop is stopped"))
            return futures
        self._incoming.put((lane, [(Request(f"loop-{next(self._ids)}", request.prompt, request.max_new_tokens),
                                    future, on_tokens) for (request, on_tokens), future in zip(items, futures)]))
        return futures

    def generate(self, requests: list[Request], timeout: float | None = None) -> list[RequestResult]:
        futures = [self.submit(r) for r in requests]
        return [f.result(timeout) for f in futures]

    def stats(self) -> EngineStats:
        stats = self._engine.stats()
        with self._incoming.mutex:  # requests submitted, not yet handed to the engine
            stats.waiting += sum(len(items) for _, items in self._incoming.queue)
        stats.waiting += len(self._backlog)
        stats.aborted_requests += self._cancelled_before_admission
        return stats

    def lanes(self) -> LaneStats:
        """Each lane's waiting requests now and admissions so far (read from any thread)."""
        waiting = dict.fromkeys(LANES, 0)
        with self._incoming.mutex:
            for lane, items in self._incoming.queue:
                waiting[lane] += len(items)
        waiting[BATCH] += len(self._backlog)
        waiting[ONLINE] += max(0, self._engine.stats().waiting)  # only online requests wait inside the engine
        return LaneStats(waiting, dict(self._lanes.admitted), self._lanes.preempted)

    def stop(self, timeout: float = 10) -> None:
        self._stopped.set()
        self._thread.join(timeout)

    def _admit(self, block: bool) -> None:
        """Hand the online requests submitted since the last step to the engine; batch ones
        join the backlog."""
        try:
            lane, items = self._incoming.get(timeout=0.05) if block else self._incoming.get_nowait()
        except queue.Empty:
            return
        while True:
            for request, future, on_tokens in items:
                if future.cancelled():
                    self._cancelled_before_admission += 1
                elif lane == BATCH:
                    self._backlog.append((request, future))
                elif self._add(request, future, ONLINE):
                    if on_tokens is not None:
                        self._listeners[request.request_id] = (on_tokens, 0)
            try:
                lane, items = self._incoming.get_nowait()
            except queue.Empty:
                return

    def _add(self, request: Request, future: Future, lane: str) -> bool:
        """Give `request` to the engine; a request it refuses fails alone (False)."""
        try:
            self._engine.add_request(request)
        except Exception as error:  # noqa: BLE001 - refused requests fail alone
            _resolve(future, error=error)
            return False
        self._futures[request.request_id] = future
        self._lanes.admitted[lane] += 1
        if lane == BATCH:
            self._batch_in_engine[request.request_id] = None
        return True

    def _batch_slots(self) -> int:
        """Slots the batch lane may hold now: all the online requests leave free when there
        have been none for ONLINE_HOLD_S, else no more than they hold, or held last (rounds
        are as wide as their rows, and an online request waits for each of its rounds; the
        batch lane still moves)."""
        stats = self._engine.stats()
        online = stats.batch_size + stats.waiting - len(self._batch_in_engine)
        now = time.monotonic()
        if online:
            self._online_last = (online, now)
        elif now - self._online_last[1] < ONLINE_HOLD_S:
            online = self._online_last[0]
        free_of_online = self._engine.config.max_batch_size - online
        return free_of_online if online == 0 else min(free_of_online, online)

    def _make_room_for_online(self) -> None:
        """Preempt the batch sequences past the batch lane's share (`_batch_slots`), those
        that committed least first, back to the head of the backlog in their order."""
        excess = len(self._batch_in_engine) - max(0, self._batch_slots())
        if excess <= 0:
            return
        victims = sorted(self._batch_in_engine, key=lambda i: len(self._engine.committed(i)))[:excess]
        in_admission_order = [i for i in self._batch_in_engine if i in victims]
        for request_id in reversed(in_admission_order):
            request = self._engine.preempt(request_id)
            del self._batch_in_engine[request_id]
            self._backlog.appendleft((request, self._futures.pop(request_id)))
            self._lanes.preempted += 1

    def _fill_with_batch(self) -> None:
        """Batch requests into the batch lane's share of the slots, in a step that admits no
        online request: an online request's prefill never waits for batch crops' prefills."""
        if self._engine.stats().waiting:  # online requests to admit in this step
            return
        room = min(self._engine.free_slots(), self._batch_slots() - len(self._batch_in_engine))
        while room > 0 and self._backlog:
            request, future = self._backlog.popleft()
            if future.cancelled():
                self._cancelled_before_admission += 1
                continue
            room -= self._add(request, future, BATCH)

    def _abort_cancelled(self) -> None:
        for request_id in [i for i, future in self._futures.items() if future.cancelled()]:
            self._engine.abort(request_id)
            del self._futures[request_id]
            self._listeners.pop(request_id, None)
            self._batch_in_engine.pop(request_id, None)

    def _stream(self, finished: list[RequestResult]) -> None:
        """Hand every listener the tokens committed since it was last called."""
        final = {result.request_id: result.token_ids for result in finished}
        for request_id, (listener, sent) in list(self._listeners.items()):
            tokens = final[request_id] if request_id in final else self._engine.committed(request_id)
            if len(tokens) > sent:
                try:
                    listener(tokens[sent:])
                except Exception:  # noqa: BLE001 - a broken listener must not stop the engine
                    log.exception("token listener of %s failed", request_id)
            if request_id in final:
                del self._listeners[request_id]
            else:
                self._listeners[request_id] = (listener, len(tokens))

    def _run(self, built: Future) -> None:
        try:
            self._engine = self._factory()
        except BaseException as error:  # noqa: BLE001 - raised by the constructor, on the caller's thread
            built.set_exception(error)
            return
        built.set_result(None)
        while not self._stopped.is_set():
            self._admit(block=not (self._engine.has_work() or self._backlog))
            self._abort_cancelled()
            self._make_room_for_online()
            self._fill_with_batch()
            if not self._engine.has_work():
                continue
            try:
                finished = self._engine.step()
            except Exception as error:  # noqa: BLE001 - fail this batch, keep serving
                for future in self._futures.values():
                    _resolve(future, error=error)
                self._futures.clear()
                self._listeners.clear()
                self._batch_in_engine.clear()
                self._engine = self._factory()
                continue
            # The round ran over the sequences still running plus those it just finished.
            self.peak_batch_size = max(self.peak_batch_size, self._engine.stats().batch_size + len(finished))
            self._stream(finished)
            by_lane: dict[str, list[RequestResult]] = {lane: [] for lane in LANES}
            for result in finished:
                by_lane[BATCH if self._batch_in_engine.pop(result.request_id, None) else ONLINE].append(result)
                _resolve(self._futures.pop(result.request_id), result=result)
            if self._on_step:
                try:
                    self._on_step(self.stats(), by_lane, self.lanes())
                except Exception:  # noqa: BLE001 - an observer's fault must not stop the engine
                    log.exception("the engine loop's on_step failed; the engine goes on")
        stopped = RuntimeError("the engine loop stopped")
        for future in [*self._futures.values(), *(future for _, future in self._backlog)]:
            _resolve(future, error=stopped)


def _resolve(future: Future, result=None, error: BaseException | None = None) -> None:
    """Settle a future unless its caller cancelled it meanwhile (cancel() races the loop)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass
