"""What a person watching `gravityocr batch` sees while it runs: one line per finished
document, and a line at least every `every_s` seconds while pages arrive, on stderr, so that a
job that works for minutes is never silent and a pipe of stdout still holds only the summary."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class BatchProgress:
    documents: int = 0  # the documents this run reads (the job sets it once it has listed them)
    every_s: float = 10.0
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    documents_done: int = 0
    documents_failed: int = 0
    pages: int = 0
    _started: float = field(default_factory=time.perf_counter)
    _last: float = field(default_factory=time.perf_counter)

    def page_done(self) -> None:
        self.pages += 1
        if time.perf_counter() - self._last >= self.every_s:
            self._print("")

    def document_done(self, name: str, failed: bool) -> None:
        self.documents_done += 1
        self.documents_failed += failed
        self._print(f"  {name}{' FAILED' if failed else ''}")

    def _print(self, note: str) -> None:
        seconds = time.perf_counter() - self._started
        rate = self.pages / seconds if seconds else 0.0
        print(f"batch: {self.documents_done}/{self.documents} documents ({self.documents_failed} failed), "
              f"{self.pages} pages, {rate:.2f} pages/s{note}", file=self.stream, flush=True)
        self._last = time.perf_counter()
