"""The process's torch threads belong to the thread that runs the engine.

On a CPU, torch runs each op's parallel part on an OpenMP team that belongs to the thread
calling it, and a team lives as long as its thread. GNU OpenMP counts the threads of all
teams together; once they outnumber the cores, its workers stop spinning between parallel
regions and sleep, so every op of a decoding step waits for a wake-up.
The engine decodes on a thread of its own (`EngineLoop`) while the caller's thread lays
out pages and encodes crops. If the caller's thread has ever run an op on two or more
threads, its idle team and the engine's outnumber the cores the engine uses, and the
engine leaves cores idle (docs/decoding.md has the figures).

So an entry point hands the process's count to the engine before its first torch op
(`reserve_for_engine`): its own thread, and every thread started after it, run torch on
one thread, and the engine's thread takes the count (`engine_threads`). Code that decodes
without a loop runs its engine on a thread of its own (`on_engine_thread`), whose team
ends with it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")

_reserved: int | None = None


def reserve_for_engine(threads: int | None = None) -> int:
    """Keep `threads` (default: torch's current count) for engine threads; the calling
    thread, and the threads torch starts after it, run torch on one. Returns the count.
    Call it before the process's first torch op: a team, once made, stays with its thread."""
    global _reserved
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    _reserved = threads or _reserved or torch.get_num_threads()
    torch.set_num_threads(1)
    return _reserved


def engine_threads() -> int:
    """Torch threads an engine runs on: those reserved, else torch's count on this thread
    when first asked (kept: the caller's own count drops to one once an engine has run)."""
    global _reserved
    if _reserved is None:
        _reserved = torch.get_num_threads()
    return _reserved


def release_caller_threads() -> None:
    """After an engine thread has set its count: this thread, and the threads torch starts
    later, go back to one (the engine's thread keeps its own)."""
    torch.set_num_threads(1)


def on_engine_thread(function: Callable[..., T], *args, **kwargs) -> T:
    """`function(*args, **kwargs)` on a thread of its own that runs torch on
    `engine_threads()` and ends before this returns; returns its result or raises its
    error. The calling thread runs torch on one thread afterwards."""
    threads = engine_threads()

    def run() -> T:
        torch.set_num_threads(threads)
        return function(*args, **kwargs)

    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine") as worker:
            return worker.submit(run).result()
    finally:
        release_caller_threads()
