"""What a request body may be, and the problem each wrong one gets: the size limits (a 413
naming the setting that raises it), JSON that must parse as a schema (400 or 422, never an
echo of the input), and the status of each way a document cannot be read."""

from __future__ import annotations

from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from gravityocr.serve.schemas import HTTPProblem

DOCUMENT_ERROR_STATUS = {
    "empty_file": 400, "unsupported_format": 415, "corrupt": 422, "encrypted": 422, "no_pages": 422,
    "too_large": 413, "unreadable": 422,
}
Body = TypeVar("Body", bound=BaseModel)  # a request body's schema (serve/schemas.py)

# What raises each size limit, named in its 413 (the settings are the Serve config's `args`).
UPLOAD_SETTING = "serve setting max_upload_bytes"
JSON_BODY_SETTING = "serve setting max_upload_bytes, plus a third for base64"
PAGES_SETTING = "serve setting max_pages"


def too_large(what: str, amount: int | str, limit: int, unit: str, setting: str) -> HTTPProblem:
    """A 413 worded as every size limit is (`pipelines.documents.limit_message`)."""
    from gravityocr.pipelines.documents import limit_message

    return HTTPProblem(413, limit_message(what, amount, limit, unit, setting))


async def read_body(request: Request, limit: int, setting: str) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large("the request body", int(declared), limit, "byte", setting)
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise too_large("the request body", f"at least {len(body)}", limit, "byte", setting)
    return bytes(body)


def parse_body(model: type[Body], body: bytes, what: str) -> Body:
    """`body` as a `model`, or an HTTPProblem in the API's error shape: 400 for a body that is
    not JSON at all, 422 for JSON that is not a valid `what`, its message naming each wrong
    field and never echoing the input (pydantic's own text repeats the body and links its docs)."""
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        errors = error.errors(include_url=False, include_input=False)
        syntax = [e for e in errors if e["type"] == "json_invalid"]
        if syntax:
            raise HTTPProblem(400, "the request body is not valid JSON: "
                                   + syntax[0]["msg"].removeprefix("Invalid JSON: ")) from None
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg'].removeprefix('Value error, ')}"
                             for e in errors)
        raise HTTPProblem(422, f"invalid {what}: {problems}") from None
