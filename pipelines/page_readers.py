"""The batch job's read stage: the engines that read a planned page's crops.

`PageReader`: the job's own engine actors (the laptop default), each with one recogniser
and its long-lived engine loop.
`ServePageReader`: no engine of its own; each page goes to a running Serve application's
replicas (`OcrService.read_planned_page`), whose engine loops read it in their batch lane,
after online requests (model/engine/loop.py). The job then shares one pool of engines with
the online service: one model per replica process, and Serve's autoscaling sees the job's
pages as ongoing requests.

Both run `batch_rows.submit_page_crops` and `batch_rows.read_page`, so a page's row is the
same whichever engine read it.
"""

from __future__ import annotations

import asyncio
import logging

import pyarrow as pa

from gravityocr import metrics
from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.pipelines.batch_rows import READ_SCHEMA, read_page, submit_page_crops

log = logging.getLogger(__name__)
DEFAULT_SERVE_APP = "gravityocr"  # the application `gravityocr serve` runs


class PageReader:
    """An engine actor: one recogniser and its long-lived engine loop. Its `__call__` is
    async, so Ray Data keeps several page batches in flight on one actor and their crops
    decode in the same engine rounds; each page is handed on as soon as its last crop is read."""

    def __init__(self, model: str | None, decode: DecodeSettings, threads: int, max_new_tokens: int | None):
        import ray

        from gravityocr.model.engine.threads import reserve_for_engine
        from gravityocr.model.network.devices import resolve_device
        from gravityocr.model.network.loading import DEFAULT_MODEL_DIR
        from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig

        reserve_for_engine(threads)
        self.mode = decode.mode
        self.node_id = ray.get_runtime_context().get_node_id()
        settings = RecognizerConfig(decode=decode)
        device, dtype = resolve_device("auto")  # the GPU Ray assigned this actor, if any
        self.crops = CropRecognizer.load(model or DEFAULT_MODEL_DIR,
                                         settings.capped(max_new_tokens) if max_new_tokens else settings,
                                         dtype=dtype, device=device)
        metrics.engine_actor_started(device)

    async def __call__(self, batch: pa.Table):
        """The batch's crops go to the engine in one call (scheduled as `gravityocr ocr`
        schedules the same pages); each page is yielded as soon as its own crops are read."""
        submitted = submit_page_crops(batch.to_pylist(), self.crops)
        pending = [asyncio.ensure_future(read_page(page, self.mode, self.node_id)) for page in submitted]
        for page in asyncio.as_completed(pending):
            yield pa.Table.from_pylist([await page], schema=READ_SCHEMA)


# A page whose replica died (killed, its node lost, restarted by Serve) is sent again, to
# whichever replica Serve routes it to; each page is yielded once, so nothing is duplicated.
REPLICA_LOST_RETRIES = 5
RETRY_WAIT_S = 2.0


class ServePageReader:
    """The read stage through a Serve application: each page of a batch is one call to a
    replica's batch lane, at most `pages_in_flight` at once from this reader (the bound the
    application gives, `OcrService.batch_pages_in_flight`: backpressure outside the replicas, never an
    unbounded queue inside one); each page is yielded as soon as its replica answers."""

    def __init__(self, app_name: str, pages_in_flight: int):
        from ray import serve

        self.handle = serve.get_app_handle(app_name)
        self.app_name = app_name
        self.gate = asyncio.Semaphore(pages_in_flight)

    async def __call__(self, batch: pa.Table):
        pending = [asyncio.ensure_future(self._read(row)) for row in batch.to_pylist()]
        for page in asyncio.as_completed(pending):
            yield pa.Table.from_pylist([await page], schema=READ_SCHEMA)

    async def _read(self, row: dict) -> dict:
        from ray.exceptions import ActorUnavailableError, RayActorError

        async with self.gate:
            for _ in range(REPLICA_LOST_RETRIES):
                try:
                    return await self.handle.read_planned_page.remote(row)
                except (RayActorError, ActorUnavailableError) as error:
                    log.warning("page %s/%s: the replica reading it was lost (%s); sending it again",
                                row["document_id"], row["page_number"], type(error).__name__)
                    await asyncio.sleep(RETRY_WAIT_S)
            return await self.handle.read_planned_page.remote(row)  # the last try: its error fails the job
