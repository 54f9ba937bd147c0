"""``create_app``: an OpenAI-compatible HTTP front end on the specledger engine.

Routes: POST /v1/completions (raw text prompt), POST /v1/chat/completions (chat template),
both streaming (SSE ``data: {json}\\n\\n`` ... ``data: [DONE]``) and not; GET /v1/models,
GET /health, GET /metrics (Prometheus text, vLLM names; see :mod:`specledger.serve.metrics`).

Request life cycle: host and content type (421 / 415, :mod:`specledger.serve.hardening`) ->
validate (400 / 404) -> reserve a place in the bounded queue (429 + Retry-After when full, before
any tokenizing; 503 once the engine thread has died) -> encode -> check the context (400 with the
engine's message) -> admit into the reserved place -> the worker
thread decodes it, batched with up to ``max_batch - 1`` others (continuous batching) -> events
reach the handler through the request's asyncio queue. When the client goes away (streaming or
not: a watcher task waits for the ASGI disconnect) the request leaves the queue, or, if running,
is dropped at the next step boundary, so its batch slot frees at once. On shutdown (SIGTERM) new
requests get 503 and requests in flight run to the grace deadline, then each stream ends with an
error event and ``[DONE]`` (:mod:`specledger.serve.drain`). The model is fixed at
start-up: a request can only name it.

Errors are OpenAI-shaped (``{"error": {"message", "type", "param", "code"}}``) for every status
(404 / 405 routes included); a 400 names the offending field, a 500 names no internal detail
(that goes to the server log). Transport limits (body size, slow clients): :mod:`specledger.serve.hardening`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from specledger.engine.decode import Emitted
from specledger.engine.drafters.catalog import NGRAM, PLAIN
from specledger.engine.policy import AcceptanceChain, GammaPolicy, make_policy, parse_gamma_spec
from specledger.engine.protocol import TargetEngine
from specledger.engine.sampling import SamplingParams
from specledger.errors import SpecLedgerError
from specledger.records import GammaSpec, RequestRecord
from specledger.serve.drain import SHUTDOWN_MESSAGE, SHUTTING_DOWN, Drain
from specledger.serve.hardening import AccessLog, BodyLimit, Limits, RequestGate, log_safe
from specledger.serve.metrics import ServeMetrics
from specledger.serve.protocol import (
    FINISH_REASONS,
    ChatCompletionRequest,
    CompletionRequest,
    ErrorBodyDict,
    Kind,
    RequestError,
    ResponseDict,
    SamplingFields,
    chat_messages,
    check_common,
    completion_prompt,
    error_body,
    full_response,
    models_list,
    parse_body,
    resolve_max_tokens,
    stream_chunk,
    usage_chunk,
)
from specledger.serve.worker import INTERNAL_FAILURE, EngineWorker, Job, JobCancelled, JobFailed, JobQueue

log = logging.getLogger("specledger.serve")

#: (prompt, messages) -> token ids; exactly one of the two is given (messages = chat template).
PromptEncoder = Callable[[str | None, list[dict[str, str]] | None], list[int]]

HEURISTIC_MAX_GAMMA = 16
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, the access log does


class _Disconnected:
    """Put on a non-streaming job's event queue when its client goes away."""


DISCONNECTED = _Disconnected()


def parse_gamma(gamma: GammaSpec, step_cost: Any = None) -> Callable[[], int | GammaPolicy]:
    """A factory of the per-request gamma: an integer >= 0, or a policy name (a fresh instance per
    call: requests decode concurrently, so each needs its own policy state). ``step_cost`` (shared
    by every request) lets goodput plan batched steps with the measured forward cost."""
    spec = parse_gamma_spec(gamma)
    if isinstance(spec, int):
        return lambda: spec
    chain = AcceptanceChain() if spec == "goodput" else None  # shared: what earlier requests taught
    return lambda: make_policy(spec, step_cost=step_cost, chain=chain)


def goodput_step_cost(engine: TargetEngine, gamma: GammaSpec) -> Any:
    """For ``--gamma goodput``: the engine's packed-forward cost, measured once at start-up (a few
    seconds), which the per-request goodput policies share; None otherwise."""
    model = getattr(engine, "model", None)
    if gamma != "goodput" or not hasattr(model, "forward_packed"):
        return None
    from specledger.engine.step_cost import step_cost_for

    return step_cost_for(model).fresh()


def max_positions(gamma: GammaSpec) -> int:
    """How many per-position acceptance counters to expose from the start."""
    value = gamma if isinstance(gamma, int) else int(gamma) if str(gamma).isdigit() else HEURISTIC_MAX_GAMMA
    return max(0, value)


def engine_encoder(engine: TargetEngine) -> PromptEncoder:
    """Encode with the engine's LoadedModel (chat template for messages, raw text otherwise)."""
    loaded = getattr(engine, "loaded", None)

    def encode(prompt: str | None, messages: list[dict[str, str]] | None) -> list[int]:
        if loaded is not None:
            return loaded.encode_prompt(prompt=prompt, messages=messages, chat=messages is not None)
        if messages is not None:
            raise SpecLedgerError("this model has no chat template; use /v1/completions with a raw prompt")
        if engine.tokenizer is None:
            raise SpecLedgerError("this model has no tokenizer; it cannot serve text requests")
        return list(engine.tokenizer.encode(prompt))

    return encode


def _sse(obj: ResponseDict | ErrorBodyDict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _error_response(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


class JobStreamingResponse(StreamingResponse):
    """A StreamingResponse that runs ``on_close`` however the response ends (disconnects included)."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class Service:
    """Everything a route needs: engine, encoder, queue, worker, metrics and the served name."""

    def __init__(self, engine: TargetEngine, drafter: Any, gamma: GammaSpec, model_name: str, max_queue: int,
                 encode: PromptEncoder, retry_after_s: int, keep_records: int, max_batch: int = 8) -> None:
        self.engine, self.model_name, self.encode, self.retry_after_s = engine, model_name, encode, retry_after_s
        self.gamma_label = str(gamma)
        self.drafter_name = getattr(drafter, "name", type(drafter).__name__)
        self.created = int(time.time())
        self.queue = JobQueue(max_queue, max_batch)
        self.metrics = ServeMetrics(model_name, max_positions(gamma), running=lambda: self.worker.num_running,
                                    waiting=lambda: len(self.queue))
        self.max_batch = max_batch
        self.worker = EngineWorker(engine, drafter, parse_gamma(gamma, goodput_step_cost(engine, gamma)), self.queue,
                                   self.metrics, max_batch, keep_records)
        config = getattr(getattr(engine, "model", None), "config", None)
        self.vocab_size: int | None = getattr(config, "vocab_size", None)
        self.drain = Drain()  # create_app sets the grace from its Limits

    # -- admission -------------------------------------------------------------------------
    def sampling_params(self, body: SamplingFields) -> SamplingParams:
        temperature = 1.0 if body.temperature is None else body.temperature
        seed = body.seed
        if seed is None and temperature > 0:
            seed = secrets.randbelow(2**63)  # OpenAI semantics: no seed, no reproducibility promise
        try:
            return SamplingParams(
                temperature=temperature,
                top_k=max(0, body.top_k or 0),
                top_p=1.0 if body.top_p is None else body.top_p,
                seed=seed,
            )
        except SpecLedgerError as exc:
            raise RequestError(str(exc)) from None

    def _refusal(self) -> RequestError:
        """Why the queue has no place: shutting down or the engine is gone (503), or the server is full (429)."""
        if self.drain.draining:
            return RequestError(f"{SHUTDOWN_MESSAGE}; retry on another server", status=503, kind="server_error",
                                code="server_shutting_down", headers={"Connection": "close"})
        if self.queue.closed:
            return RequestError("the engine has stopped; this server cannot generate (see its log)", status=503,
                                kind="server_error", code="engine_stopped")
        return RequestError(
            f"the server is busy: it holds at most {self.max_batch} decoding and {self.queue.maxsize} waiting "
            f"requests; retry after {self.retry_after_s} s",
            status=429, kind="rate_limit_error", code="queue_full",
            headers={"Retry-After": str(self.retry_after_s)},
        )

    async def admit(self, body: SamplingFields, prompt: str | None, messages: list[dict[str, str]] | None,
                    max_tokens: int | None, prefix: str) -> Job:
        """Reserve a queue place, then encode, check and enqueue one request; RequestError for
        anything refused. Invariant: a refused request gives its reserved place back."""
        if self.drain.draining or not self.queue.reserve():  # before tokenizing: a 429 costs no tokenizer time
            raise self._refusal()
        try:
            job = await self._prepare(body, prompt, messages, max_tokens, prefix)
        except BaseException:
            self.queue.unreserve()
            raise
        if not self.queue.offer(job, reserved=True):
            raise self._refusal()
        self.drain.track(job)  # from here on, a shutdown deadline ends it (release untracks it)
        return job

    async def _prepare(self, body: SamplingFields, prompt: str | None, messages: list[dict[str, str]] | None,
                       max_tokens: int | None, prefix: str) -> Job:
        """Encode and check one request into a Job (not yet queued); RequestError for anything refused."""
        try:
            ids = [int(t) for t in await asyncio.to_thread(self.encode, prompt, messages)]
        except SpecLedgerError as exc:
            raise RequestError(str(exc)) from None
        except Exception:  # the tokenizer or chat template rejected the user's text
            log.debug("cannot encode a prompt", exc_info=True)  # the client's input: not the server's problem
            raise RequestError("cannot encode the prompt with this model's tokenizer; check the text") from None
        if self.vocab_size is not None and any(not 0 <= t < self.vocab_size for t in ids):
            raise RequestError(f"the prompt encodes to token ids outside the model's vocabulary ({self.vocab_size})")
        max_tokens = resolve_max_tokens(max_tokens, len(ids), self.engine.max_context)
        try:
            self.engine.check_prompt(ids, max_tokens)
        except SpecLedgerError as exc:
            raise RequestError(str(exc)) from None
        return Job(
            request_id=f"{prefix}-{uuid.uuid4().hex[:24]}", prompt_ids=ids, params=self.sampling_params(body),
            max_tokens=max_tokens, stop=body.stop_strings, ignore_eos=bool(body.ignore_eos),
            loop=asyncio.get_running_loop(),
        )

    def release(self, job: Job) -> None:
        """The client is done with ``job`` (finished or gone): free its queue slot or stop it."""
        self.drain.untrack(job)
        self.queue.remove(job)
        job.cancel_flag.set()

    # -- responses -------------------------------------------------------------------------
    async def stream(self, job: Job, kind: Kind, include_usage: bool) -> AsyncIterator[bytes]:
        created = int(time.time())
        rid, model = job.request_id, self.model_name
        if kind == "chat":
            yield _sse(stream_chunk(kind, rid, model, created, None, role=True))
        while True:
            event = await job.events.get()
            if isinstance(event, Emitted):
                if event.text:
                    yield _sse(stream_chunk(kind, rid, model, created, event.text))
            elif isinstance(event, RequestRecord):
                finish = FINISH_REASONS.get(event.stop_reason, "stop")
                yield _sse(stream_chunk(kind, rid, model, created, None if kind == "chat" else "", finish))
                if include_usage:
                    yield _sse(usage_chunk(kind, rid, model, created, event.prompt_tokens, event.output_tokens))
                yield _sse("[DONE]")
                return
            elif isinstance(event, JobFailed):
                yield _sse(error_body(event.message, kind="server_error"))
                yield _sse("[DONE]")
                return
            elif isinstance(event, JobCancelled) or event is SHUTTING_DOWN:
                yield _sse(error_body(SHUTDOWN_MESSAGE if event is SHUTTING_DOWN else
                                      "the request was cancelled (server shutting down)", kind="server_error",
                                      code="server_shutting_down"))
                yield _sse("[DONE]")
                return

    async def collect(self, job: Job, kind: Kind, request: Request) -> Response:
        """Wait for the job's end; if the client leaves first, answer 499 at once (the caller's
        ``release`` then frees the job's queue place or batch slot)."""
        watcher = asyncio.create_task(self._watch_disconnect(job, request))
        try:
            return await self._collect(job, kind)
        finally:
            watcher.cancel()

    @staticmethod
    async def _watch_disconnect(job: Job, request: Request) -> None:
        """The body is read, so the next ASGI message is ``http.disconnect`` (client gone, or the
        response done); tell the collector, which stops the job."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.events.put_nowait(DISCONNECTED)

    async def _collect(self, job: Job, kind: Kind) -> Response:
        while True:
            event = await job.events.get()
            if event is DISCONNECTED:
                return Response(status_code=CLIENT_CLOSED)
            if isinstance(event, RequestRecord):
                finish = FINISH_REASONS.get(event.stop_reason, "stop")
                return JSONResponse(full_response(kind, job.request_id, self.model_name, event.text, finish,
                                                  event.prompt_tokens, event.output_tokens))
            if isinstance(event, JobFailed):
                return JSONResponse(error_body(event.message, kind="server_error"), status_code=500)
            if isinstance(event, JobCancelled) or event is SHUTTING_DOWN:
                return JSONResponse(error_body(SHUTDOWN_MESSAGE if event is SHUTTING_DOWN else
                                               "the request was cancelled (server shutting down)",
                                               kind="server_error", code="server_shutting_down"), status_code=503)

    async def handle(self, request: Request, kind: Kind) -> Response:
        try:
            try:
                raw = await request.body()
            except ClientDisconnect:  # the client left before its body was in: nobody to answer
                return Response(status_code=CLIENT_CLOSED)
            try:
                payload = json.loads(raw)
            except (ValueError, RecursionError):
                raise RequestError("the request body is not valid JSON") from None
            if kind == "completion":
                body: SamplingFields = parse_body(CompletionRequest, payload)
                check_common(body, self.model_name)
                prompt, messages, max_tokens = completion_prompt(body), None, body.max_tokens
            else:
                body = parse_body(ChatCompletionRequest, payload)
                check_common(body, self.model_name)
                prompt, messages = None, chat_messages(body)
                max_tokens = body.max_completion_tokens or body.max_tokens
            job = await self.admit(body, prompt, messages, max_tokens, "cmpl" if kind == "completion" else "chatcmpl")
        except RequestError as exc:
            return _error_response(exc)
        if body.stream:
            return JobStreamingResponse(self.stream(job, kind, body.include_usage), lambda: self.release(job))
        try:
            return await self.collect(job, kind, request)
        finally:
            self.release(job)


def create_app(
    engine: TargetEngine,
    drafter_name: str = NGRAM.name,
    gamma: GammaSpec = 4,
    model_name: str | None = None,
    max_queue: int = 64,
    max_batch: int = 8,
    *,
    drafter: Any = None,
    layers: str | None = None,
    draft_path: str | None = None,
    encode: PromptEncoder | None = None,
    retry_after_s: int = 1,
    keep_records: int = 0,
    limits: Limits | None = None,
    tree_budget: int = 0,
) -> FastAPI:
    """Build the app and start its engine worker thread.

    ``drafter``: a ready Drafter instance (else one is built from ``drafter_name`` with
    ``layers`` / ``draft_path``); drafter ``none`` means plain decoding (gamma 0).
    ``gamma``: candidates per round or a policy name ("heuristic"); one policy per request.
    ``tree_budget``: token-tree nodes per round (0: chains; each request's tree is cut to the room
    its prompt and max_tokens leave in the cache).
    ``max_batch``: requests decoded together (continuous batching); more wait in the queue
    (the server holds ``max_queue + max_batch`` requests in all, then 429).
    ``limits``: transport limits (:class:`~specledger.serve.hardening.Limits`); the body limit
    is enforced here, the others by :func:`~specledger.serve.hardening.uvicorn_config`.
    ``encode``: (prompt, messages) -> ids; default: the engine's LoadedModel.
    ``keep_records``: how many RequestRecords of finished requests to keep in memory (newest
    first out; 0, the default, keeps none -- a long-running server must not grow with traffic).
    State for callers: ``app.state.service`` (a :class:`Service`), ``app.state.records``
    (the kept RequestRecords), ``app.state.registry`` (Prometheus registry).
    Call ``app.state.service.worker.stop()`` (done on lifespan shutdown) to end the worker.
    """
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise SpecLedgerError(f"max_batch must be an integer >= 1, got {max_batch!r}")
    if max_queue < 1:
        raise SpecLedgerError(f"max_queue must be >= 1, got {max_queue}")
    if retry_after_s < 1:
        raise SpecLedgerError(f"retry_after_s must be >= 1, got {retry_after_s}")
    if isinstance(keep_records, bool) or not isinstance(keep_records, int) or keep_records < 0:
        raise SpecLedgerError(f"keep_records must be an integer >= 0, got {keep_records!r}")
    if drafter is None:
        from specledger.engine.drafters.registry import make_drafter

        drafter = make_drafter(drafter_name, engine, layers=layers, draft_path=draft_path)
    if getattr(drafter, "name", drafter_name) == PLAIN.name:
        gamma = 0
    parse_gamma(gamma)  # fail at start-up, not per request
    from specledger.engine.request import check_tree_budget

    check_tree_budget(tree_budget, int(getattr(engine, "max_context", 2048)) - 2)
    name = model_name or getattr(engine, "name", "") or "specledger"
    service = Service(engine, drafter, gamma, name, max_queue, encode or engine_encoder(engine), retry_after_s,
                      keep_records, max_batch)
    service.worker.tree_budget = 0 if gamma == 0 else tree_budget
    limits = limits or Limits()
    service.drain = Drain(limits.shutdown_grace_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        service.worker.stop()

    app = FastAPI(title="specledger serve", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s)
    app.add_middleware(RequestGate, allowed_hosts=limits.allowed_hosts)  # before the body limit
    app.add_middleware(AccessLog)  # added last: outermost, so refusals are logged too
    app.state.limits = limits
    app.state.service = service
    app.state.drain = service.drain
    app.state.records = service.worker.records
    app.state.registry = service.metrics.registry

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s", request.method, log_safe(request.url.path), exc_info=exc)
        return JSONResponse(error_body(INTERNAL_FAILURE, kind="server_error"), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see /v1/models, /v1/completions, " \
                      "/v1/chat/completions, /health, /metrics"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path} " \
                      f"(allowed: {(exc.headers or {}).get('allow', '?')})"
        else:
            message = str(exc.detail)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(error_body(message, code=code), status_code=exc.status_code, headers=exc.headers)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await service.handle(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await service.handle(request, "chat")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return models_list(service.model_name, service.created, engine.max_context)

    @app.get("/health")
    async def health() -> Response:
        """200 while the engine thread serves; 503 (OpenAI-shaped) once it has died or is stopping."""
        if service.worker.alive:
            return Response(status_code=200)
        return JSONResponse(error_body("the engine thread has stopped; see the server log", kind="server_error",
                                       code="engine_stopped"), status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    service.worker.start()
    return app
