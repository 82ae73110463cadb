"""Crops read by a replica's shared engine loop instead of an engine of their own."""

from __future__ import annotations

from concurrent.futures import CancelledError

from ..model.engine import Request
from ..model.processor import InvalidInput
from ..pipelines.recognizer import CropRecognizer, CropResult
from .engine_requests import EngineRequests, RequestAbandoned


class SharedEngineRecognizer(CropRecognizer):
    """A `CropRecognizer` whose crops go to a long-lived `EngineLoop`, so the crops of
    concurrent HTTP requests are decoded in the same batches."""

    def __init__(self, recognizer, config, engine_requests: EngineRequests, max_seq_len: int):
        super().__init__(recognizer, config)
        self.engine_requests = engine_requests
        self.max_seq_len = max_seq_len

    def _decode(self, jobs) -> dict[int, CropResult]:
        futures = {}
        results: dict[int, CropResult] = {}
        for job in jobs:
            budget = min(job.max_new_tokens, self.max_seq_len - job.prompt.length)
            if budget < 1:
                results[job.index] = CropResult("", error=f"crop needs {job.prompt.length} prompt tokens, more than "
                                                          f"the engine's {self.max_seq_len}")
                continue
            try:
                futures[job.index] = self.engine_requests.submit(Request(str(job.index), job.prompt, budget))
            except RequestAbandoned as error:
                results[job.index] = CropResult("", error=str(error))
        for index, future in futures.items():
            try:
                finished = future.result()
            except CancelledError:
                results[index] = CropResult("", error="the HTTP request was abandoned")
                continue
            except (InvalidInput, ValueError) as error:
                results[index] = CropResult("", error=str(error))
                continue
            results[index] = self._finish(finished.token_ids, finished.stats, finished.finish_reason)
        return results
