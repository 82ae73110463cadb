"""The batched decoding engine (one role per file, after nano-vllm's engine/):

config.py     EngineConfig and the errors that refuse work up front
sequence.py   Request, RequestResult, and one request's running state
kv_cache.py   the slot cache: per-sequence KV with rollback, preallocated; the only writer
              of its own bookkeeping (keep, free, move)
scheduler.py  waiting queue and slots (continuous batching), and `apply`: a round's outcome
              committed to a sequence, its finish, its KV rollback
layouts.py    the passes as data: prefill, draft, verify and AR layouts of a batch
runner.py     ModelRunner.run(layout) -> logits, over the slot cache
rounds.py     prefill, speculative round (draft, verify, accept) and AR round -> outcomes
engine.py     Engine: add, abort, and step() = admit -> round -> apply -> release
loop.py       EngineLoop: one engine on a thread of its own, fed by many callers (every
              CropRecognizer owns one: `ocr`, eval, the batch job's actors, serve's replicas)
threads.py    which thread runs torch's parallel ops: the engine's (the rest run on one)
"""

from gravityocr.model.engine.config import CacheTooLarge, EngineConfig, RequestTooLong
from gravityocr.model.engine.engine import Engine, EngineStats
from gravityocr.model.engine.sequence import Request, RequestResult, RequestTimings

__all__ = [
    "CacheTooLarge", "Engine", "EngineConfig", "EngineStats", "Request", "RequestResult", "RequestTimings",
    "RequestTooLong",
]
