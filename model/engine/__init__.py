"""The batched decoding engine (one role per file, after nano-vllm's engine/):

config.py     EngineConfig and the errors that refuse work up front
sequence.py   Request, RequestResult, and one request's running state
kv_cache.py   the slot cache: per-sequence KV with rollback, preallocated
scheduler.py  waiting queue and slots: continuous batching
runner.py     the batched passes: prefill, draft + verify, AR step
engine.py     Engine: the loop that ties them together (add, step, abort)
loop.py       EngineLoop: one engine on a thread of its own, fed by many callers (serving)
"""

from .config import CacheTooLarge, EngineConfig, RequestTooLong
from .engine import Engine, EngineStats
from .sequence import Request, RequestResult, RequestTimings

__all__ = [
    "CacheTooLarge", "Engine", "EngineConfig", "EngineStats", "Request", "RequestResult", "RequestTimings",
    "RequestTooLong",
]
