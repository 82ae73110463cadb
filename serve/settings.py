"""Settings of the online service: one dataclass, filled from a Serve config's `args`."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.pipelines.page_ocr import PageOcrConfig

TOKEN_ENV = "GRAVITYOCR_API_TOKEN"
TOKEN_FILE_ENV = "GRAVITYOCR_API_TOKEN_FILE"


@dataclass
class ServeSettings:
    model: str | None = None  # directory or hub name; None: the shipped default
    # How crops are decoded: the config's `decode:` mapping (model/decode/settings.py), the
    # same settings and meanings as every command's decoding flags.
    decode: DecodeSettings = field(default_factory=DecodeSettings)
    max_batch_size: int = 32  # sequences one replica's engine decodes together
    # Prompt + output tokens of one crop (a KV cache slot). None: the model's whole context
    # (max_position_embeddings), the slot `gravityocr ocr` and `gravityocr batch` decode in, so
    # any crop they read fits here too.
    max_seq_len: int | None = None
    max_new_tokens: int = 1024  # cap per crop (chat requests may ask for less)
    # How pages are read: the config's `page:` mapping (pipelines/page_ocr.py PageOcrConfig),
    # the settings `gravityocr ocr` and `gravityocr batch` take too.
    page: PageOcrConfig = field(default_factory=PageOcrConfig)
    threads: int = 1  # torch threads per replica
    device: str = "auto"  # "auto": CUDA (bfloat16) when the replica was given a GPU, else CPU (float32)
    dtype: str | None = None  # overrides the device's default dtype
    max_upload_bytes: int = 20 * 1024 * 1024
    max_pages: int = 20
    request_timeout_s: float = 120.0  # then 504, and the request's crops leave the engine
    max_concurrent_requests: int = 32  # per replica; more answers 503 with Retry-After
    # Pages of a batch job (`gravityocr batch --serve-app`) a replica reads at once, in its
    # engine's batch lane after online requests; a job keeps at most this many per replica
    # in flight (the deployment's max_replicas of them), and they never answer 503: they wait.
    batch_pages_per_replica: int = 4
    retry_after_s: int = 2
    allowed_buckets: list[str] = field(default_factory=list)  # s3:// sources a request may name
    s3_endpoint_url: str | None = None
    api_token_file: str | None = None  # bearer token in a file; or GRAVITYOCR_API_TOKEN(_FILE) in the env

    @classmethod
    def from_args(cls, args: dict | None) -> "ServeSettings":
        args = dict(args or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(args) - known
        if unknown:
            decoding = unknown & {f.name for f in dataclasses.fields(DecodeSettings)}
            page = unknown & {f.name for f in dataclasses.fields(PageOcrConfig)}
            hint = "".join(f" ({', '.join(sorted(names))}: under `{where}:`)"
                           for names, where in ((decoding, "decode"), (page, "page")) if names)
            raise ValueError(f"unknown serve settings {sorted(unknown)}{hint}; known: {sorted(known)}")
        settings = cls(**{**args, "decode": DecodeSettings.from_mapping(args.get("decode")),
                          "page": PageOcrConfig.from_mapping(args.get("page"))})
        settings.check()
        return settings

    def check(self) -> None:
        """Raise ValueError for settings that cannot serve; the decoding and page settings are
        checked when they are made (DecodeSettings, PageOcrConfig)."""
        if self.batch_pages_per_replica < 1:
            raise ValueError(f"batch_pages_per_replica must be at least 1, got {self.batch_pages_per_replica}")

    def api_token(self) -> str | None:
        """The bearer token requests must carry, or None when auth is off. Never logged."""
        path = self.api_token_file or os.environ.get(TOKEN_FILE_ENV)
        if path:
            token = Path(path).read_text().strip()
            if not token:
                raise ValueError(f"the API token file {path} is empty")
            return token
        return os.environ.get(TOKEN_ENV) or None
