"""The online OCR service: a FastAPI ingress on Ray Serve around the same engine as the
batch job.

Each replica owns one engine on a thread of its own (`EngineLoop`); every request's crops
are submitted to it, so concurrent requests share engine batches and a request arriving
mid-decode joins the next round. Endpoints:
  POST /v1/ocr               a document (multipart, base64 JSON, or an allow-listed s3:// URI)
  POST /v1/chat/completions  OpenAI-compatible, one image as a data: URL, as vLLM serves GLM-OCR;
                             `stream: true` answers server-sent events, a chunk per decode round
  GET  /healthz, /readyz     process up; model loaded
and, for `gravityocr batch --serve-app` through a deployment handle (no HTTP route):
  read_planned_page(row)     one planned page of the batch job, read in the engine's batch lane
  batch_pages_in_flight()    how many of those pages a job keeps in flight

Online requests decode in the engine loop's online lane and batch pages in its batch lane,
which only fills the slots online work leaves free (model/engine/loop.py); a replica reads
at most `batch_pages_per_replica` batch pages at once, and the job sends no more than the
deployment's replicas can take that way, so a replica never holds an unbounded queue and
Serve's autoscaling counts the job's pages as ongoing requests beside the online ones.
"""

# No `from __future__ import annotations` here: FastAPI resolves the endpoint signatures
# (`request: Request`) at runtime, and strings would break the OpenAPI schema.
import asyncio
import hmac
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
import ray
from ray import serve

from gravityocr import metrics
from gravityocr.model.engine.loop import BATCH, ONLINE
from gravityocr.serve import schemas
from gravityocr.serve.schemas import HTTPProblem
from gravityocr.serve.chat_stream import ChatStream, error_event
from gravityocr.serve.engine_requests import EngineRequests
from gravityocr.serve.chat_work import ChatWork
from gravityocr.serve.ocr_work import OcrWork
from gravityocr.serve.settings import ServeSettings

OCR_ROUTE = "/v1/ocr"
CHAT_ROUTE = "/v1/chat/completions"


CLIENT_CLOSED_REQUEST = 499  # logged for a request whose client went away (nginx's convention)

app = FastAPI(title="GravityOCR", version="0.1.0",
              description="OCR with exact self-speculative decoding: documents to markdown and JSON.")


@app.exception_handler(HTTPProblem)
async def _problem_handler(request: Request, problem: HTTPProblem):
    return JSONResponse({"error": {"message": problem.message, "status": problem.status}},
                        status_code=problem.status, headers=problem.headers)


def _record_latency(endpoint: str, status: int, seconds: float) -> None:
    metrics.observe_request_latency(endpoint, str(status), seconds)


def _abandon(engine_requests: EngineRequests, reason: str) -> None:
    metrics.record_abandoned_engine_requests(reason, engine_requests.abandon())


class _EngineStepMetrics:
    """The engine loop's `on_step`: batch size, each lane's queue depth and admissions, and
    the online lane's decode counts (the batch job's driver records its pages' own)."""

    def __init__(self):
        self.admitted: dict[str, int] = {}

    def __call__(self, stats, finished, lanes) -> None:
        metrics.set_engine_batch_size(stats.batch_size)
        metrics.set_queue_depth(stats.waiting)
        for lane, waiting in lanes.waiting.items():
            metrics.set_queue_depth(waiting, queue=lane)
            metrics.record_admitted_crops(lane, lanes.admitted[lane] - self.admitted.get(lane, 0))
        self.admitted = dict(lanes.admitted)
        for result in finished[ONLINE]:
            metrics.record_decode(metrics.WORKLOAD_ONLINE, result.task, result.stats.committed_tokens,
                                  result.stats.forward_passes, result.stats.accepted_per_round, result.stats.ar_rounds)


@serve.deployment(name="OcrService")
@serve.ingress(app)
class OcrService:
    def __init__(self, settings: ServeSettings):
        self.settings = settings
        self.token = settings.api_token()
        self.in_flight = 0
        self.batch_gate = asyncio.Semaphore(settings.batch_pages_per_replica)  # the batch lane's pages at once
        self.ready = False
        self._load()

    def _load(self) -> None:
        from gravityocr.model.engine.threads import reserve_for_engine
        from gravityocr.model.network.devices import resolve_device
        from gravityocr.model.network.loading import DEFAULT_MODEL_DIR, load_recognizer
        from gravityocr.pipelines.page_ocr import PageOcr
        from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig

        reserve_for_engine(self.settings.threads)
        device, dtype = resolve_device(self.settings.device, self.settings.dtype)
        recognizer = load_recognizer(self.settings.model or DEFAULT_MODEL_DIR, dtype=dtype, device=device)
        config = RecognizerConfig(decode=self.settings.decode, max_batch_size=self.settings.max_batch_size,
                                  max_seq_len=self.settings.max_seq_len).capped(self.settings.max_new_tokens)
        # One engine loop for the replica: the crops of every /v1/ocr request and every chat
        # completion decode in the same rounds.
        self.crops = CropRecognizer(recognizer, config, on_step=_EngineStepMetrics())
        self.loop = self.crops.loop
        metrics.engine_actor_started(device)
        self.recognizer = recognizer
        self.engine_config = self.crops.engine_config
        self.decode = self.settings.decode.resolved()  # the cap written out
        self.pages = PageOcr(self.crops, self.settings.page)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.ready = True

    # --- plumbing shared by the endpoints ------------------------------------------------

    def _authorize(self, request: Request) -> None:
        if self.token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, supplied = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(supplied.strip().encode(), self.token.encode()):
            raise HTTPProblem(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})

    async def _guarded(self, endpoint: str, request: Request, work):
        """Auth, the replica's concurrency bound (503 + Retry-After, never a hang), the request
        timeout (504), and latency metrics, around `work.run` off the event loop. On a
        timeout or a client disconnect (Serve cancels the handler) the request's engine work
        is withdrawn: the thread running `work.run` cannot be stopped, but its crops leave
        the engine at the next round and it ends without decoding the rest. A chat stream
        is handed to `_stream_response`, which then owns its slot and latency record."""
        started = time.perf_counter()
        status, admitted, streaming = 500, False, False
        try:
            self._authorize(request)
            if self.in_flight >= self.settings.max_concurrent_requests:
                raise HTTPProblem(503, "the server is at capacity; retry later",
                                  {"Retry-After": str(self.settings.retry_after_s)})
            self.in_flight += 1
            admitted = True
            engine_requests = EngineRequests(self.loop)
            try:
                prepared = await work.prepare(request)
                body = await asyncio.wait_for(asyncio.to_thread(work.run, prepared, engine_requests),
                                              timeout=self.settings.request_timeout_s)
            except asyncio.TimeoutError:
                _abandon(engine_requests, metrics.ABANDONED_TIMEOUT)
                raise HTTPProblem(504, f"the request took longer than {self.settings.request_timeout_s:g} s") from None
            except asyncio.CancelledError:
                _abandon(engine_requests, metrics.ABANDONED_CLIENT_CLOSED)
                status = CLIENT_CLOSED_REQUEST
                raise
            if isinstance(body, ChatStream):
                streaming = True
                return self._stream_response(endpoint, started, body, engine_requests)
            status = 200
            return body
        except HTTPProblem as problem:
            status = problem.status
            raise
        finally:
            if not streaming:
                if admitted:
                    self.in_flight -= 1
                _record_latency(endpoint, status, time.perf_counter() - started)

    def _stream_response(self, endpoint: str, started: float, stream: ChatStream,
                         engine_requests: EngineRequests) -> StreamingResponse:
        """The stream holds its slot of the concurrency bound until its engine request is
        settled (finished, failed or withdrawn): that happens even if the response body is
        never iterated, so a client gone before the first byte cannot leak the slot."""
        event_loop = asyncio.get_running_loop()
        stream.future.add_done_callback(lambda _: event_loop.call_soon_threadsafe(self._release_slot))

        async def body():
            status = CLIENT_CLOSED_REQUEST
            try:
                async for line in stream.events(self.recognizer.processor.decode,
                                                started + self.settings.request_timeout_s):
                    yield line
                status = 200
            except TimeoutError:
                status = 504
                yield error_event(504, f"the request took longer than {self.settings.request_timeout_s:g} s")
            except Exception as error:  # noqa: BLE001 - the engine failed this request: said in the stream
                status = 500
                yield error_event(500, f"{type(error).__name__}: {error}")
            finally:  # also on a client disconnect (CancelledError or GeneratorExit here)
                # After a finished or failed stream nothing is left to withdraw (counts 0).
                _abandon(engine_requests, metrics.ABANDONED_TIMEOUT if status == 504
                         else metrics.ABANDONED_CLIENT_CLOSED)
                _record_latency(endpoint, status, time.perf_counter() - started)

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def _release_slot(self) -> None:
        self.in_flight -= 1

    # --- the batch lane (deployment handle calls from `gravityocr batch --serve-app`) ---------

    async def read_planned_page(self, row: dict) -> dict:
        """One planned page of a batch job (a `batch_rows.PLANNED_SCHEMA` row) read in the
        engine's batch lane: its READ_SCHEMA record, as the job's own engine actors write it.
        At most `batch_pages_per_replica` pages read at once; the others wait here, never
        refused (the job bounds how many it sends, `batch_pages_in_flight`)."""
        async with self.batch_gate:
            engine_requests = EngineRequests(self.loop, lane=BATCH)
            try:  # off the event loop, which answers the online requests meanwhile
                record = await asyncio.to_thread(self._read_batch_page, row, engine_requests)
            except asyncio.CancelledError:  # the job gave the page up: its crops leave the engine
                engine_requests.abandon()
                raise
        metrics.record_lane_page(BATCH)
        return record

    def _read_batch_page(self, row: dict, engine_requests: EngineRequests) -> dict:
        """Decode the page's crops (PNG), submit them, wait, fill the page: CPU work and waits
        a replica's event loop must not do."""
        from gravityocr.pipelines.batch_rows import page_record, submit_page_crops

        (page,) = submit_page_crops([row], self.crops, engine_requests.submit_all)
        return page_record(page, [future.result() for future in page.futures], self.decode.mode, self.node_id)

    async def batch_pages_in_flight(self) -> int:
        """How many batch pages a job keeps in flight on this deployment: this replica's
        `batch_pages_per_replica` for each replica the deployment may scale to, and no more
        than Serve routes to one replica beside a full online load (max_ongoing_requests less
        max_concurrent_requests): even all on one replica, a job's pages never keep an online
        request from it."""
        deployment = serve.get_replica_context()._deployment_config
        autoscaling = deployment.autoscaling_config
        replicas = autoscaling.max_replicas if autoscaling else deployment.num_replicas or 1
        beside_online = deployment.max_ongoing_requests - self.settings.max_concurrent_requests
        return max(1, min(self.settings.batch_pages_per_replica * replicas, beside_online))

    # --- endpoints ----------------------------------------------------------------------

    @app.get("/healthz")
    async def healthz(self) -> dict:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(self):
        if not self.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        stats = self.loop.stats()
        return {"status": "ready", "engine": {"batch_size": stats.batch_size, "waiting": stats.waiting,
                                              "batches_run": stats.batches_run}}

    @app.get("/v1/models")
    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": "gravityocr", "object": "model", "owned_by": "gravityocr"}]}

    @app.post(OCR_ROUTE, response_model=schemas.OcrResponse)
    async def ocr(self, request: Request):
        return await self._guarded(OCR_ROUTE, request, OcrWork(self))

    @app.post(CHAT_ROUTE, response_model=schemas.ChatCompletionResponse, responses={200: {"content": {
        "text/event-stream": {"description": "with `stream: true`: chat.completion.chunk events, then [DONE]"}}}})
    async def chat_completions(self, request: Request):
        return await self._guarded(CHAT_ROUTE, request, ChatWork(self))

    @app.get("/v1/engine/stats")
    async def engine_stats(self) -> dict:
        stats = self.loop.stats()
        return {"batches_run": stats.batches_run, "rounds": stats.rounds, "batch_size": stats.batch_size,
                "waiting": stats.waiting, "peak_batch_size": self.loop.peak_batch_size,
                "finished_requests": stats.finished_requests, "aborted_requests": stats.aborted_requests,
                "committed_tokens": stats.committed_tokens, "forward_passes": stats.forward_passes,
                "rounds_by_kind": stats.rounds_by_kind(),
                "speculative_max_batch": self.decode.speculative_max_batch}  # 0: any batch size



def build_app(settings: ServeSettings, deployment_options: dict | None = None):
    """The bound application; `deployment_options` are Serve deployment settings
    (autoscaling_config, max_ongoing_requests, max_queued_requests, ray_actor_options)."""
    deployment = OcrService.options(**deployment_options) if deployment_options else OcrService
    return deployment.bind(settings)


def app_builder(args: dict):
    """Entry point for `serve run` / `serve deploy`: `import_path: gravityocr.serve.app:app_builder`."""
    return build_app(ServeSettings.from_args(args))
