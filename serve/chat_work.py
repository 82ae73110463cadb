"""POST /v1/chat/completions on a replica: one image (a data: URL) and a task prompt, read
whole by the replica's engine, answered as OpenAI's chat completions are (or streamed, a
chunk per decode round). The answer is the model's own text: the page pipeline's rules
(glyph fixes, structure) are the OCR route's."""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
import uuid
from concurrent.futures import CancelledError

from fastapi import Request

from gravityocr.serve import schemas
from gravityocr.serve.chat_stream import ChatStream
from gravityocr.serve.engine_requests import EngineRequests, RequestAbandoned
from gravityocr.serve.request_bodies import DOCUMENT_ERROR_STATUS, JSON_BODY_SETTING, parse_body, read_body
from gravityocr.serve.schemas import HTTPProblem
from gravityocr.serve.table_answer import closed_table


class ChatWork:
    """POST /v1/chat/completions: one image + a task prompt, read whole by the engine."""

    def __init__(self, service):
        self.service = service
        self.event_loop: asyncio.AbstractEventLoop | None = None

    async def prepare(self, request: Request) -> schemas.ChatCompletionRequest:
        self.event_loop = asyncio.get_running_loop()  # a stream's tokens are handed to it
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise HTTPProblem(415, "chat completions take application/json")
        body = await read_body(request, self.service.settings.max_upload_bytes * 4 // 3 + 65536, JSON_BODY_SETTING)
        return parse_body(schemas.ChatCompletionRequest, body, "chat completion request")

    def run(self, chat: schemas.ChatCompletionRequest, engine_requests: EngineRequests) -> dict | ChatStream:
        from gravityocr.model.engine import Request as EngineRequest
        from gravityocr.model.network.processor import InvalidInput
        from gravityocr.pipelines.documents import DocumentError, open_document

        image_url, prompt_text = chat.image_and_prompt()
        if not image_url.startswith("data:"):
            raise HTTPProblem(400, "images must be data: URLs; the server fetches nothing")
        header, _, payload = image_url.partition(",")
        if ";base64" not in header:
            raise HTTPProblem(400, "data: URLs must be base64-encoded")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise HTTPProblem(400, "the image data: URL is not valid base64") from None
        try:
            page = next(iter(open_document("image", data, self.service.settings.page.dpi).pages()))
        except DocumentError as error:
            raise HTTPProblem(DOCUMENT_ERROR_STATUS.get(error.reason, 422), f"{error.reason}: {error.message}") from None
        task = schemas.task_for_prompt(prompt_text)
        processor = self.service.recognizer.processor
        try:
            prompt = processor.encode(page.image, task)
        except InvalidInput as error:
            raise HTTPProblem(422, str(error)) from None
        limit = min(chat.max_tokens or self.service.settings.max_new_tokens, self.service.settings.max_new_tokens)
        try:  # the engine would refuse it too, but on its thread: after a stream had answered 200
            self.service.engine_config.check_fits("chat", prompt.length, limit)
        except InvalidInput as error:
            raise HTTPProblem(413, str(error)) from None
        completion_id, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), chat.model or "gravityocr"
        if chat.stream:
            return ChatStream.submit(engine_requests, EngineRequest("chat", prompt, limit), self.event_loop,
                                     completion_id=completion_id, created=created, model=model,
                                     prompt_tokens=prompt.length, task=task,
                                     include_usage=bool((chat.stream_options or {}).get("include_usage")))
        try:
            result = engine_requests.submit(EngineRequest("chat", prompt, limit)).result()
        except InvalidInput as error:
            raise HTTPProblem(413, str(error)) from None
        except (RequestAbandoned, CancelledError):  # nobody reads this answer any more
            raise HTTPProblem(504, "the request was abandoned") from None
        text = processor.decode(result.token_ids)
        if task == "table":  # one table an HTML parser reads, even when cut at the budget
            text = closed_table(text)
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop" if result.finish_reason == "eos" else "length"}],
            "usage": {"prompt_tokens": prompt.length, "completion_tokens": len(result.token_ids),
                      "total_tokens": prompt.length + len(result.token_ids)},
            "gravityocr": {"tokens_per_forward": result.stats.tokens_per_forward,
                           "accepted_per_round": list(result.stats.accepted_per_round), "task": task,
                           "stop_reason": result.finish_reason},  # eos, repetition or length (model/decode/stopping.py)
        }
