"""The engine requests of one HTTP request (or one batch page), withdrawn together when
that request is abandoned. Imports nothing heavy: the app module uses it at import time."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gravityocr.model.engine import Request
    from gravityocr.model.engine.loop import EngineLoop, TokenListener


class RequestAbandoned(Exception):
    """The HTTP request these engine requests belong to timed out or lost its client."""


class EngineRequests:
    """The engine requests of one HTTP request. `abandon()` (on a timeout or a client
    disconnect) cancels those still waiting or decoding and refuses new ones, so the work
    of an answer nobody will read stops taking engine slots at the next round."""

    def __init__(self, loop: EngineLoop, lane: str = "online"):
        self.loop, self.lane = loop, lane  # the loop's lane (model/engine/loop.py LANES)
        self._futures: list[Future] = []
        self._lock = threading.Lock()
        self._abandoned = False

    def submit(self, request: Request, on_tokens: TokenListener | None = None) -> Future:
        with self._lock:
            if self._abandoned:
                raise RequestAbandoned("the HTTP request was abandoned (timed out or its client went away)")
            future = self.loop.submit(request, on_tokens, lane=self.lane)
            self._futures.append(future)
            return future

    def submit_all(self, requests: list[Request]) -> list[Future]:
        """`EngineLoop.submit_all` for requests of this HTTP request."""
        with self._lock:
            if self._abandoned:
                raise RequestAbandoned("the HTTP request was abandoned (timed out or its client went away)")
            futures = self.loop.submit_all(requests, lane=self.lane)
            self._futures += futures
            return futures

    def abandon(self) -> int:
        """Withdraw every unfinished request; returns how many were withdrawn."""
        with self._lock:
            self._abandoned = True
            return sum(future.cancel() for future in self._futures)
