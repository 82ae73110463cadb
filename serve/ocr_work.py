"""POST /v1/ocr on a replica: a whole document (multipart, base64 JSON, or an allow-listed
s3:// URI) checked on the event loop, then read through the page pipeline and the replica's
engine, answered with the markdown and JSON `gravityocr ocr` and the batch job write."""

from __future__ import annotations

import asyncio
import base64
import binascii

from fastapi import Request

from gravityocr import metrics
from gravityocr.model.engine.loop import ONLINE
from gravityocr.serve import schemas
from gravityocr.serve.engine_requests import EngineRequests
from gravityocr.serve.request_bodies import (DOCUMENT_ERROR_STATUS, JSON_BODY_SETTING, PAGES_SETTING, UPLOAD_SETTING,
                                             parse_body, read_body, too_large)
from gravityocr.serve.schemas import HTTPProblem
from gravityocr.serve.settings import ServeSettings


class OcrWork:
    """POST /v1/ocr: a whole document through layout and the shared engine."""

    def __init__(self, service):
        self.service = service

    async def prepare(self, request: Request):
        """Read and check the upload on the event loop: size, content type, format and page
        count are refused here, before any rendering."""
        from gravityocr.pipelines.documents import DocumentError, open_document

        name, data = await self._upload(request)
        settings = self.service.settings
        try:
            document = open_document(name, data, settings.page.dpi)
        except DocumentError as error:
            raise HTTPProblem(DOCUMENT_ERROR_STATUS.get(error.reason, 422), f"{error.reason}: {error.message}") from None
        if document.page_count > settings.max_pages:
            raise too_large("the document", document.page_count, settings.max_pages, "page", PAGES_SETTING)
        return name, document

    async def _upload(self, request: Request) -> tuple[str, bytes]:
        settings = self.service.settings
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "multipart/form-data":
            declared = request.headers.get("content-length") or "0"
            if declared.isdigit() and int(declared) > settings.max_upload_bytes + 64 * 1024:  # room for the form
                raise too_large("the upload", int(declared), settings.max_upload_bytes, "byte", UPLOAD_SETTING)
            form = await request.form(max_files=1, max_fields=8, max_part_size=settings.max_upload_bytes)
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise HTTPProblem(422, "multipart requests need the document in a file field named 'file'")
            data = await upload.read()
            if len(data) > settings.max_upload_bytes:
                raise too_large("the upload", len(data), settings.max_upload_bytes, "byte", UPLOAD_SETTING)
            return upload.filename or "upload", data
        if content_type == "application/json":
            body = await read_body(request, settings.max_upload_bytes * 4 // 3 + 4096, JSON_BODY_SETTING)
            parsed = parse_body(schemas.OcrJsonRequest, body, "OCR request")
            if parsed.uri:
                return parsed.uri, await asyncio.to_thread(read_allowed_s3, parsed.uri, settings)
            try:
                data = base64.b64decode(parsed.document or "", validate=True)
            except (binascii.Error, ValueError):
                raise HTTPProblem(400, "'document' is not valid base64") from None
            if len(data) > settings.max_upload_bytes:
                raise too_large("the document", len(data), settings.max_upload_bytes, "byte", UPLOAD_SETTING)
            return parsed.filename or "document", data
        raise HTTPProblem(415, f"unsupported content type {content_type or '(none)'!r}; send multipart/form-data "
                               "with a 'file' field or application/json")

    def run(self, prepared, engine_requests: EngineRequests) -> dict:
        """The document's markdown and JSON from the functions `gravityocr ocr` and the batch
        job use: `document_markdown`, its pages' pieces `page_markdowns` (the document's first
        title `#` on whichever page it is), `document_json`. There is no output folder, so
        figures are left out of the markdown (their boxes are in the JSON)."""
        from gravityocr.pipelines.assembly import document_json, document_markdown, page_markdowns
        from gravityocr.pipelines.documents import DocumentError

        name, document = prepared
        try:
            pages = list(document.pages())
        except DocumentError as error:
            raise HTTPProblem(DOCUMENT_ERROR_STATUS.get(error.reason, 422), f"{error.reason}: {error.message}") from None
        results = self.service.pages.read_pages(pages, submit=engine_requests.submit_all)
        metrics.record_lane_page(ONLINE, len(results))
        stats = [region.stats for page in results for region in page.regions if region.stats]
        committed = sum(s["committed_tokens"] for s in stats)
        passes = sum(s["forward_passes"] for s in stats)
        record = document_json(name, results, None, document.format)
        return {
            "document_id": name,
            "page_count": len(results),
            "markdown": document_markdown(results, figure_prefix=None),
            "pages": [{"page_number": page.page_number, "markdown": markdown, "result": result}
                      for page, markdown, result in zip(results, page_markdowns(results, figure_prefix=None),
                                                        record["pages"])],
            "document": record,
            "stats": {"committed_tokens": int(committed), "forward_passes": int(passes),
                      "tokens_per_forward": committed / passes if passes else 0.0},
        }


def read_allowed_s3(uri: str, settings: ServeSettings) -> bytes:
    """Only s3:// objects in allow-listed buckets: a request can never make the server read
    a local file or fetch an arbitrary URL."""
    from gravityocr.pipelines.storage import read_bytes, resolve

    if not uri.startswith("s3://"):
        raise HTTPProblem(400, "only s3:// URIs are accepted as 'uri'")
    bucket, _, key = uri[len("s3://"):].partition("/")
    if bucket not in settings.allowed_buckets:
        raise HTTPProblem(403, f"bucket {bucket!r} is not in the server's allow-list")
    if not key or key.endswith("/"):
        raise HTTPProblem(400, f"{uri!r} names no object")
    location = resolve(f"s3://{bucket}", settings.s3_endpoint_url)
    try:
        return read_bytes(location, key)
    except FileNotFoundError:
        raise HTTPProblem(404, f"{uri} does not exist") from None
    except OSError as error:
        message = str(error)
        if "NoSuchKey" in message or "Path does not exist" in message or "not found" in message.lower():
            raise HTTPProblem(404, f"{uri} does not exist") from None
        raise HTTPProblem(502, f"could not read {uri}: {message}") from None
