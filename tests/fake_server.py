"""A tiny OpenAI-compatible streaming server for the probe tests (loopback only).

Deterministic output: request text is ``expected_tokens(prompt, max_tokens, config)``, each
token 4 characters wide ("t07 "), sent in chunks whose sizes cycle through
``config.chunk_pattern``, with ``config.delays_s`` (cycled) slept before each chunk.

Every chunk is treated as one speculative round that committed ``size`` tokens: drafts += 1,
draft_tokens += gamma, accepted += size - 1, accepted_per_pos[p] += 1 for p < size - 1. These
are exposed on /metrics with vLLM's names (as ``prometheus_client`` writes them, i.e. with
``_total`` and ``_created`` samples), split over two ``engine`` labels, together with
TTFT and inter-token-latency histograms.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest


@dataclass
class FakeServerConfig:
    model_name: str = "fake-model"
    response_tokens: int = 20
    chunk_pattern: tuple[int, ...] = (1, 3, 2, 4, 1, 2)
    delays_s: tuple[float, ...] = (0.002, 0.004)
    gamma: int = 3
    fail_every: int = 0  # every k-th request (1-based) answers HTTP 500; 0 = never
    crlf_every: int = 2  # every k-th request uses CRLF line endings and a comment line
    no_done_every: int = 0  # every k-th request ends its stream without `data: [DONE]`
    json_every: int = 0  # every k-th request answers 200 with a JSON body, not a stream


def expected_tokens(prompt: str, max_tokens: int, config: FakeServerConfig) -> list[str]:
    """The tokens the server streams for ``prompt`` (fixed 4-character tokens)."""
    seed = zlib.crc32(prompt.encode("utf-8")) % 100
    n = min(max_tokens, config.response_tokens)
    return [f"t{(seed + j) % 100:02d} " for j in range(n)]


def chunk_sizes(n_tokens: int, config: FakeServerConfig) -> list[int]:
    """Chunk sizes for ``n_tokens`` tokens: cycle the pattern, clip the last chunk."""
    sizes, i = [], 0
    while sum(sizes) < n_tokens:
        sizes.append(min(config.chunk_pattern[i % len(config.chunk_pattern)], n_tokens - sum(sizes)))
        i += 1
    return sizes


@dataclass
class ServedRequest:
    prompt: str
    status: int
    tokens: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    engine: str = "0"


def create_app(config: FakeServerConfig) -> tuple[FastAPI, list[ServedRequest]]:
    app = FastAPI()
    log: list[ServedRequest] = []
    lock = threading.Lock()
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    drafts = Counter("vllm:spec_decode_num_drafts", "drafts", labels, registry=registry)
    draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "draft tokens", labels, registry=registry)
    accepted = Counter("vllm:spec_decode_num_accepted_tokens", "accepted", labels, registry=registry)
    per_pos = Counter(
        "vllm:spec_decode_num_accepted_tokens_per_pos", "per pos", [*labels, "position"], registry=registry
    )
    buckets = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
    ttft_hist = Histogram(
        "vllm:time_to_first_token_seconds", "ttft", labels, buckets=buckets, registry=registry
    )
    itl_hist = Histogram(
        "vllm:inter_token_latency_seconds", "itl", labels, buckets=buckets, registry=registry
    )
    for engine in ("0", "1"):  # expose zeros from the start, as vLLM does
        for c in (drafts, draft_tokens, accepted):
            c.labels(config.model_name, engine)
        for p in range(config.gamma):
            per_pos.labels(config.model_name, engine, str(p))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": config.model_name, "object": "model"}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode("utf-8"))

    async def stream(body: dict[str, Any], chat: bool) -> Any:
        if chat:
            prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        else:
            prompt = body.get("prompt", "")
        with lock:
            number = len(log) + 1
            entry = ServedRequest(prompt=prompt, status=200, engine=str(number % 2))
            log.append(entry)
        if config.fail_every and number % config.fail_every == 0:
            entry.status = 500
            return JSONResponse({"error": {"message": "injected failure"}}, status_code=500)
        if config.json_every and number % config.json_every == 0:
            return JSONResponse({"choices": [{"index": 0, "text": "not a stream"}]})
        tokens = expected_tokens(prompt, int(body.get("max_tokens", 16)), config)
        sizes = chunk_sizes(len(tokens), config)
        entry.tokens, entry.sizes = tokens, sizes
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        eol = "\r\n" if config.crlf_every and number % config.crlf_every == 0 else "\n"

        def event(obj: dict[str, Any] | str) -> bytes:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            return f"data: {data}{eol}{eol}".encode()

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish}

        async def generate():
            start = time.perf_counter()
            last = None
            if eol == "\r\n":
                yield f": keep-alive{eol}{eol}".encode()
            if chat:
                yield event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            position = 0
            for i, size in enumerate(sizes):
                await asyncio.sleep(config.delays_s[i % len(config.delays_s)])
                text = "".join(tokens[position : position + size])
                position += size
                finish = "length" if position == len(tokens) else None
                now = time.perf_counter()
                engine = entry.engine
                if config.gamma:  # gamma 0: a plain server, no speculation counted
                    drafts.labels(config.model_name, engine).inc()
                    draft_tokens.labels(config.model_name, engine).inc(config.gamma)
                    accepted.labels(config.model_name, engine).inc(size - 1)
                    for p in range(size - 1):
                        per_pos.labels(config.model_name, engine, str(p)).inc()
                if last is None:
                    ttft_hist.labels(config.model_name, engine).observe(now - start)
                else:
                    itl_hist.labels(config.model_name, engine).observe(now - last)
                last = now
                yield event({"object": "chunk", "choices": [choice(text, finish)]})
            if include_usage:
                yield event(
                    {
                        "choices": [],
                        "usage": {
                            "prompt_tokens": len(prompt.split()),
                            "completion_tokens": len(tokens),
                            "total_tokens": len(prompt.split()) + len(tokens),
                        },
                    }
                )
            if not (config.no_done_every and number % config.no_done_every == 0):
                yield event("[DONE]")

        return StreamingResponse(generate(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await stream(await request.json(), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await stream(await request.json(), chat=True)

    return app, log


class FakeServer:
    """Run the fake app with uvicorn in a background thread on 127.0.0.1:<free port>."""

    def __init__(self, config: FakeServerConfig | None = None, app: FastAPI | None = None) -> None:
        """``app`` replaces the fake app (e.g. one that replays an engine's fixtures)."""
        self.config = config or FakeServerConfig()
        self.app, self.log = create_app(self.config)
        if app is not None:
            self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False)
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> FakeServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
