"""One chat completion streamed as server-sent events, in OpenAI's `stream: true` format: a
chunk per decode round with the text its committed tokens add (a self-speculative round
commits several at once), a last chunk with the finish reason, then `data: [DONE]`. A table's
chunks join into the same closed HTML as its non-streamed answer (serve/table_answer.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass

from gravityocr.serve.engine_requests import EngineRequests
from gravityocr.serve.stream_text import StreamText
from gravityocr.serve.table_answer import closed_table, unfinished_tag

_END = object()  # queued after the last tokens, once the engine request is settled


@dataclass
class ChatStream:
    future: Future  # the engine request's RequestResult
    tokens: asyncio.Queue  # lists of newly committed tokens, then _END
    completion_id: str
    created: int
    model: str
    prompt_tokens: int
    task: str
    include_usage: bool

    @classmethod
    def submit(cls, engine_requests: EngineRequests, request, event_loop: asyncio.AbstractEventLoop,
               **fields) -> "ChatStream":
        """Submit `request` with a listener that hands its tokens to `event_loop`; called off
        that loop (the engine's thread calls the listener)."""
        queue: asyncio.Queue = asyncio.Queue()

        def push(item) -> None:
            event_loop.call_soon_threadsafe(queue.put_nowait, item)

        future = engine_requests.submit(request, on_tokens=push)
        future.add_done_callback(lambda _: push(_END))  # after every listener call: same thread, FIFO
        return cls(future, queue, **fields)

    async def events(self, decode: Callable[[list[int]], str], deadline: float) -> AsyncIterator[str]:
        """The SSE lines. Raises TimeoutError once `deadline` (time.perf_counter()) passes
        before the stream ends, and the engine's error if the request failed there.
        A withdrawn request (abandoned) raises concurrent.futures.CancelledError."""
        yield self._chunk({"role": "assistant", "content": ""})
        text = StreamText(decode)
        told, held = "", ""  # held: a table's unfinished tag, told once the tokens after it finish it
        while True:
            item = await asyncio.wait_for(self.tokens.get(), timeout=max(0.0, deadline - time.perf_counter()))
            if item is _END:
                break
            added = held + text.add(item)
            if self.task == "table":
                cut = unfinished_tag(added)
                added, held = added[:cut], added[cut:]
            if added:
                told += added
                yield self._chunk({"content": added})
        result = self.future.result()
        rest = held + text.rest(result.token_ids)
        if self.task == "table":  # the whole answer as the non-streamed one reads (serve/table_answer.py);
            rest = closed_table(told + rest)[len(told):]  # `told` never ends inside a tag: it stays a prefix
        if rest:
            yield self._chunk({"content": rest})
        finish_reason = "stop" if result.finish_reason == "eos" else "length"
        yield self._chunk({}, finish_reason, gravityocr={
            "tokens_per_forward": result.stats.tokens_per_forward,
            "accepted_per_round": list(result.stats.accepted_per_round), "task": self.task,
            "stop_reason": result.finish_reason})
        if self.include_usage:
            completion = len(result.token_ids)
            yield self._line({**self._head(), "choices": [], "usage": {
                "prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}})
        yield "data: [DONE]\n\n"

    def _head(self) -> dict:
        return {"id": self.completion_id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model}

    def _chunk(self, delta: dict, finish_reason: str | None = None, **extra) -> str:
        return self._line({**self._head(), "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
                           **extra})

    @staticmethod
    def _line(payload: dict) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def error_event(status: int, message: str) -> str:
    """How a stream that already answered 200 reports a failure, then ends."""
    return f"data: {json.dumps({'error': {'message': message, 'status': status}})}\n\ndata: [DONE]\n\n"
