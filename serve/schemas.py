"""HTTP request and response bodies (published in the OpenAPI schema at /openapi.json), and the
error answer every route gives in one problem format."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class HTTPProblem(Exception):
    """An error answer: status code, message, optional headers."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


class OcrJsonRequest(BaseModel):
    """A document as base64 bytes, or an s3:// URI in an allow-listed bucket."""

    model_config = ConfigDict(extra="forbid")
    document: str | None = Field(None, description="the PDF or image, base64-encoded")
    filename: str | None = Field(None, description="a name for the document in the response")
    uri: str | None = Field(None, description="s3://bucket/key of the document (allow-listed buckets only)")

    @model_validator(mode="after")
    def _one_source(self):
        if (self.document is None) == (self.uri is None):
            raise ValueError("give exactly one of 'document' (base64) or 'uri' (s3://…)")
        return self


class PageOut(BaseModel):
    page_number: int
    markdown: str  # this page's piece of the document's markdown (the document's first title is its `#`)
    result: dict[str, Any]  # regions with bbox, type, order, text, decode stats (schemas/ in the repo)


class OcrStats(BaseModel):
    """Decode counts over every region of the document: token and pass counts are integers."""

    committed_tokens: int = Field(description="tokens written, over every region")
    forward_passes: int = Field(description="model passes that wrote them")
    tokens_per_forward: float = Field(description="committed_tokens / forward_passes (0 when nothing was decoded)")


class OcrResponse(BaseModel):
    document_id: str
    page_count: int
    markdown: str = Field(description="the whole document, as `gravityocr batch` and `gravityocr ocr` write it; "
                                      "figures are left out (no files are written), their boxes are in `document`")
    pages: list[PageOut] = Field(description="each page's piece of `markdown` and its result")
    document: dict[str, Any] = Field(description="the document JSON (schemas/document.schema.json), as "
                                                 "`gravityocr ocr --format json` writes it")
    stats: OcrStats


class ImageUrl(BaseModel):
    url: str


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageUrl | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant"]
    content: str | list[ContentPart]


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # temperature etc. are accepted; decoding is greedy
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream: bool = False  # server-sent events, a chunk per decode round
    stream_options: dict[str, Any] | None = None  # {"include_usage": true} adds a usage chunk

    @model_validator(mode="after")
    def _merge_token_limits(self):
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self

    def image_and_prompt(self) -> tuple[str, str]:
        """The one image (a URL) and the text of the last user message."""
        users = [m for m in self.messages if m.role == "user"]
        if not users or isinstance(users[-1].content, str):
            raise HTTPProblem(422, "the last user message must hold an image_url part")
        parts = users[-1].content
        images = [p.image_url.url for p in parts if p.type == "image_url" and p.image_url]
        if len(images) != 1:
            raise HTTPProblem(422, f"exactly one image per request, got {len(images)}")
        text = " ".join(p.text or "" for p in parts if p.type == "text")
        return images[0], text


class ChatChoice(BaseModel):
    index: int
    message: dict[str, str]
    finish_reason: str


class ChatCompletionResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: dict[str, int]


def task_for_prompt(text: str) -> str:
    """GLM-OCR's prompts name the task ("Table Recognition:" ...); plain text by default."""
    lowered = text.lower()
    if "table" in lowered:
        return "table"
    if "formula" in lowered or "latex" in lowered:
        return "formula"
    return "text"
