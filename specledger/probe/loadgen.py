"""Async load generator for OpenAI-compatible streaming endpoints.

Two arrival modes, both bounded by a request count AND a duration (no request starts after
the duration has elapsed; requests in flight finish, bounded by the request timeout):

* closed loop: ``concurrency`` workers, each sends its next request when the previous ends;
* open loop: Poisson arrivals at ``rate`` req/s, exponential gaps from a seeded RNG.

Every token-bearing SSE chunk is timed with ``time.perf_counter`` (seconds since the request
was sent). A chunk bears tokens when its text delta or its reasoning delta
(``reasoning_content``) is non-empty; role-only or usage-only chunks are not timed. Reasoning text is
kept apart (``reasoning_text``) from the answer (``output_text``); llama.cpp's per-response
``timings`` (draft tokens proposed and accepted) are kept as ``server_timings``. Tokens per chunk come
from ``tokenizer(delta_text)`` when given, else 1 per chunk; when the server reports
``usage.completion_tokens`` (``stream_options:
{"include_usage": true}``) and the per-chunk counts disagree with it, they are reconciled
(:func:`reconcile_chunk_tokens`).

A request succeeds only if it is a complete stream: HTTP 200, an SSE body (``Content-Type:
text/event-stream`` when the server states one), and ``data: [DONE]`` at the end, all within
``timeout_s`` in total (connect, wait and stream; the read timeout alone would let a server that
trickles a byte a second go on for ever), before the load's total deadline (``deadline_s``; default
:func:`~specledger.probe.bounds.default_deadline_s`), and within the request's
:func:`~specledger.probe.bounds.stream_limits` (token chunks, characters and bytes, from its ``max_tokens``):
what a request keeps in memory and writes is bounded whatever the server sends. Anything else is a failure
whose ``error`` starts with its kind: ``HTTP 500: ...``, ``NotSSE: ...``, ``IncompleteStream: ...``,
``TotalTimeout: ...``, ``Deadline: ...``, ``TooLong: ...``, ``TooLarge: ...``, an in-stream error, or the
transport exception's name. ``LoadConfig.headers`` (``--header``, ``--api-key``, a URL's ``user:pass@``) ride on every
request and nowhere else: :meth:`LoadConfig.describe` (what files get) names them only, and every
``error`` has their values blanked (:func:`~specledger.probe.fetch.redact`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

import httpx

from specledger.errors import SpecLedgerError
from specledger.load_points import poisson_arrivals
from specledger.probe.bounds import StreamLimits, default_deadline_s, over_limits, stream_limits, warn_unsent
from specledger.probe.documents import LoadConfigDoc, RequestResultDoc
from specledger.probe.fetch import MAX_STREAM_BYTES, read_body, redact, secrets_of
from specledger.probe.sse import OpenAIStreamDecoder
from specledger.probe.wire import EngineSpecStats, LlamaTimings, RequestBody

Tokenizer = Callable[[str], Any]


@dataclass(frozen=True)
class PromptItem:
    """One request body source: a completion ``prompt`` or chat ``messages``."""

    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    id: str | None = None  # the workload item's id, carried into each RequestResult

    def as_prompt(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(str(m.get("content", "")) for m in self.messages or [])

    def as_messages(self) -> list[dict[str, Any]]:
        if self.messages is not None:
            return self.messages
        return [{"role": "user", "content": self.prompt or ""}]


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def to_prompt_item(item: Any, where: str = "workload item") -> PromptItem:
    """A str, a dict or an object with ``.prompt`` / ``.messages`` -> PromptItem."""
    if isinstance(item, PromptItem):
        return item
    if isinstance(item, str):
        return PromptItem(prompt=item)
    prompt, messages, max_tokens = (
        _field(item, "prompt"),
        _field(item, "messages"),
        _field(item, "max_tokens"),
    )
    if prompt is None and messages is None:
        raise SpecLedgerError(f"{where} has neither 'prompt' nor 'messages'; give one of them")
    if prompt is not None and not isinstance(prompt, str):
        raise SpecLedgerError(f"{where}: 'prompt' must be a string")
    if messages is not None and not (
        isinstance(messages, list) and all(isinstance(m, dict) and "role" in m for m in messages)
    ):
        raise SpecLedgerError(f"{where}: 'messages' must be a list of {{role, content}} objects")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
        max_tokens = None
    item_id = _field(item, "id")
    item_id = None if item_id is None or isinstance(item_id, bool) else str(item_id)
    return PromptItem(prompt=prompt, messages=messages, max_tokens=max_tokens, id=item_id)


def read_jsonl_objects(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for every non-blank line; unreadable file or a non-JSON line
    is a one-line :class:`SpecLedgerError` naming the place."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecLedgerError(f"cannot read workload {path}: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise SpecLedgerError(f"{path}:{number} is not JSON; the workload must be JSONL") from None
        yield number, obj


def load_prompt_items(source: str | Path | Iterable[Any]) -> list[PromptItem]:
    """Prompt items from a JSONL file path or an iterable of str/dict/objects (non-empty)."""
    if isinstance(source, (str, Path)):
        items = [to_prompt_item(obj, where=f"{source}:{n}") for n, obj in read_jsonl_objects(source)]
    else:
        items = [to_prompt_item(obj, where=f"workload item {i}") for i, obj in enumerate(source)]
    if not items:
        raise SpecLedgerError("the workload has no prompts; give at least one")
    return items


@dataclass
class LoadConfig:
    """What to send and how hard. Exactly one of ``concurrency`` / ``rate`` drives arrivals."""

    base_url: str
    model: str
    chat: bool = False
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0
    stop: list[str] | None = None
    concurrency: int | None = 4
    rate: float | None = None
    num_requests: int = 16
    duration_s: float | None = None
    arrival_seed: int = 0
    timeout_s: float = 120.0
    include_usage: bool = True
    deadline_s: float | None = None  # the whole load's wall-clock bound; None: default_deadline_s
    #: sent with every request, never written: :meth:`describe` keeps the names only
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    def describe(self) -> LoadConfigDoc:
        """The config as written to probe.json / run.json: every field, header values left out."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "headers"}
        out["stop"] = list(self.stop) if self.stop else self.stop
        out["header_names"] = sorted(self.headers)
        return cast(LoadConfigDoc, out)  # every field by name: LoadConfigDoc's keys

    def validate(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise SpecLedgerError("give exactly one of --concurrency or --rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise SpecLedgerError("--concurrency must be at least 1")
        if self.rate is not None and not self.rate > 0:
            raise SpecLedgerError("--rate must be a positive number of requests per second")
        if self.num_requests < 1:
            raise SpecLedgerError("--requests must be at least 1")
        if self.duration_s is not None and not self.duration_s > 0:
            raise SpecLedgerError("--duration must be positive seconds")
        if self.max_tokens < 1:
            raise SpecLedgerError("--max-tokens must be at least 1")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise SpecLedgerError("--deadline must be positive seconds")

    def total_deadline_s(self) -> float:
        """The load's deadline in seconds from its start: ``deadline_s``, else the default from the request
        count, the arrival mode and the timeout."""
        if self.deadline_s is not None:
            return self.deadline_s
        return default_deadline_s(self.num_requests, self.timeout_s, self.concurrency, self.rate, self.duration_s)

    @property
    def endpoint(self) -> str:
        return self.base_url.rstrip("/") + ("/v1/chat/completions" if self.chat else "/v1/completions")


@dataclass
class RequestResult:
    """One request, times in seconds. ``chunk_times`` are token-bearing chunks since send."""

    index: int
    ok: bool = False
    status: int | None = None
    error: str | None = None
    start_s: float = 0.0  # send time since the run started
    end_s: float = 0.0  # stream end since the run started
    ttft_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    chunk_chars: list[int] = field(default_factory=list)
    output_text: str = ""
    completion_tokens: int = 0
    usage_completion_tokens: int | None = None
    token_count_source: str = "chunks"  # "chunks", "tokenizer" or "usage-reconciled"
    saw_done: bool = False
    finish_reason: str | None = None
    prompt_id: str | None = None  # PromptItem.id of the item this request sent
    reasoning_text: str = ""  # delta.reasoning_content, timed and counted like the answer
    server_timings: LlamaTimings | None = None  # llama.cpp's per-response ``timings``, last seen
    server_spec: EngineSpecStats | None = None  # vLLM / SGLang per-request spec figures (StreamChunk.spec_stats)

    def to_dict(self) -> RequestResultDoc:
        """Every field; ``server_timings`` (server-supplied JSON) through the depth-bounded
        :func:`specledger.rundir.json_safe`, so a 500-level nested object cannot exhaust the stack."""
        from specledger.rundir import json_safe

        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("chunk_times", "chunk_tokens", "chunk_chars"):
            out[name] = list(out[name])
        out["server_timings"] = json_safe(self.server_timings)
        out["server_spec"] = json_safe(self.server_spec)
        return cast(RequestResultDoc, out)  # every field by name: RequestResultDoc's keys

    @classmethod
    def from_dict(cls, doc: RequestResultDoc) -> RequestResult:
        """A result as :meth:`to_dict` wrote it (a key it does not know is left out)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})  # type: ignore[arg-type]  # as written


@dataclass
class LoadRun:
    """All results of one run, ordered by request index, and the run's wall time."""

    results: list[RequestResult]
    wall_time_s: float
    config: LoadConfigDoc


def reconcile_chunk_tokens(counts: Sequence[int], weights: Sequence[float], total: int) -> list[int]:
    """Re-split ``total`` tokens over chunks so the counts sum to ``total``.

    Chunk i gets about total * w_i / sum(w) (largest remainders round up; equal weights when
    all are 0); when ``total >= len(counts)`` every chunk keeps at least one token, taken from
    the largest. Unchanged when the counts already sum to ``total``.
    """
    n = len(counts)
    if n == 0 or sum(counts) == total or total < 0:
        return list(counts)
    positive = [max(float(w), 0.0) for w in weights]
    if sum(positive) <= 0:
        positive = [1.0] * n
    ideal = [total * w / sum(positive) for w in positive]
    out = [int(x) for x in ideal]
    order = sorted(range(n), key=lambda i: (-(ideal[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    if total >= n:
        for i in range(n):
            if out[i] == 0:
                donor = max(range(n), key=lambda j: out[j])
                out[donor] -= 1
                out[i] = 1
    return out


def _count_tokens(tokenizer: Tokenizer | None, text: str) -> int:
    if tokenizer is None:
        return 1
    encoded = tokenizer(text)
    return encoded if isinstance(encoded, int) else len(encoded)


def build_payload(config: LoadConfig, item: PromptItem) -> RequestBody:
    """The JSON body of one streaming request."""
    payload: RequestBody = {
        "model": config.model,
        "max_tokens": item.max_tokens or config.max_tokens,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "stream": True,
    }
    if config.chat:
        payload["messages"] = item.as_messages()
    else:
        payload["prompt"] = item.as_prompt()
    if config.seed is not None:
        payload["seed"] = config.seed
    if config.stop:
        payload["stop"] = config.stop
    if config.include_usage:
        payload["stream_options"] = {"include_usage": True}
    return payload


async def send_one(
    client: httpx.AsyncClient,
    config: LoadConfig,
    item: PromptItem,
    index: int,
    run_start: float,
    tokenizer: Tokenizer | None = None,
    end_by: float | None = None,
) -> RequestResult:
    """Send one streaming request and time every token-bearing chunk; never raises. The whole
    exchange is bounded by ``config.timeout_s`` and, when given, ends by ``end_by`` (a
    ``time.perf_counter()`` value: the load's deadline)."""
    result = RequestResult(index=index, prompt_id=item.id)
    sent = time.perf_counter()
    result.start_s = sent - run_start
    texts: list[str] = []
    reasoning: list[str] = []
    left = config.timeout_s if end_by is None else min(config.timeout_s, max(0.0, end_by - sent))
    try:
        await asyncio.wait_for(
            _exchange(client, config, item, sent, result, (texts, reasoning), tokenizer), left
        )
    except asyncio.TimeoutError:
        got = f"after {len(result.chunk_times)} token chunks" if result.status == 200 else "before any answer"
        result.error = f"TotalTimeout: no complete answer within {config.timeout_s:g} s ({got})" \
            if left >= config.timeout_s else \
            f"Deadline: the load's deadline of {config.total_deadline_s():g} s passed ({got})"
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # keep the run going; the error is recorded per request
        result.error = f"{type(exc).__name__}: {exc}"
    if result.error is not None and config.headers:
        result.error = redact(result.error, secrets_of(config.headers))
    result.end_s = time.perf_counter() - run_start
    result.output_text = "".join(texts)
    result.reasoning_text = "".join(reasoning)
    _finish_counts(result, tokenizer)
    result.ok = result.error is None
    return result


#: how much of a non-SSE or error body is quoted in ``error``
QUOTED_BODY = 200


async def _head(response: httpx.Response, limit: int = 4096) -> str:
    """The first ``limit`` bytes of the body, one line (the rest is not read)."""
    data = await read_body(response, limit, truncate=True)
    return data.decode("utf-8", "replace").strip().replace("\n", " ")[:QUOTED_BODY]


async def _exchange(client: httpx.AsyncClient, config: LoadConfig, item: PromptItem, sent: float,
                    result: RequestResult, texts: tuple[list[str], list[str]],
                    tokenizer: Tokenizer | None) -> None:
    """The request itself: status, content type, every chunk; sets ``result.error`` for a failure."""
    decoder = OpenAIStreamDecoder()
    limits = stream_limits(item.max_tokens or config.max_tokens, MAX_STREAM_BYTES)
    async with client.stream("POST", config.endpoint, json=build_payload(config, item),
                             headers=config.headers or None) as response:
        result.status = response.status_code
        if response.status_code != 200:
            result.error = f"HTTP {response.status_code}: {await _head(response)}"
            return
        content_type = response.headers.get("content-type")
        if content_type is not None and not content_type.lower().startswith("text/event-stream"):
            result.error = f"NotSSE: the answer is {content_type!r}, not text/event-stream: {await _head(response)}"
            return
        received = 0
        async for raw in response.aiter_bytes():
            now = time.perf_counter() - sent
            received += len(raw)
            if received > limits.max_bytes:
                result.error = f"TooLarge: the stream passed {limits.max_bytes} bytes (what {limits.max_chunks} " \
                               "token chunks may take); stopped reading"
                return
            if _consume(decoder.feed(raw), now, result, texts, tokenizer, limits):
                break
        else:
            _consume(decoder.close(), time.perf_counter() - sent, result, texts, tokenizer, limits)
    if result.error is None and not result.saw_done:
        result.error = (f"IncompleteStream: the stream ended without `data: [DONE]` "
                        f"after {len(result.chunk_times)} token chunks")


def _consume(
    chunks, now: float, result: RequestResult, texts: tuple[list[str], list[str]], tokenizer: Tokenizer | None,
    limits: StreamLimits | None = None,
) -> bool:
    """Record decoded chunks into ``texts`` = (answer, reasoning); True once the stream is over ([DONE],
    an error, or past ``limits``: then nothing more is kept and the request has failed)."""
    for chunk in chunks:
        if chunk.kind == "error":
            result.error = chunk.error
            return True
        if chunk.kind == "done":
            result.saw_done = True
            return True
        if chunk.usage and isinstance(chunk.usage.get("completion_tokens"), int):
            result.usage_completion_tokens = chunk.usage["completion_tokens"]
        if chunk.finish_reason:
            result.finish_reason = chunk.finish_reason
        if chunk.timings is not None:
            result.server_timings = chunk.timings
        if chunk.spec_stats is not None:
            result.server_spec = chunk.spec_stats
        generated = chunk.generated
        if generated and limits is not None and over_limits(result, limits, len(generated)):
            return True
        if generated:
            if result.ttft_s is None:
                result.ttft_s = now
            result.chunk_times.append(now)
            result.chunk_tokens.append(_count_tokens(tokenizer, generated))
            result.chunk_chars.append(len(generated))
            texts[0].append(chunk.text)
            texts[1].append(chunk.reasoning)
    return False


def _finish_counts(result: RequestResult, tokenizer: Tokenizer | None) -> None:
    result.token_count_source = "tokenizer" if tokenizer is not None else "chunks"
    usage = result.usage_completion_tokens
    if usage is not None and result.chunk_tokens and usage != sum(result.chunk_tokens):
        weights = result.chunk_tokens if tokenizer is not None else result.chunk_chars
        result.chunk_tokens = reconcile_chunk_tokens(result.chunk_tokens, weights, usage)
        result.token_count_source = "usage-reconciled"
    result.completion_tokens = sum(result.chunk_tokens)


async def run_load(
    config: LoadConfig,
    items: Sequence[PromptItem],
    tokenizer: Tokenizer | None = None,
    client: httpx.AsyncClient | None = None,
) -> LoadRun:
    """Run the load; request i uses ``items[i % len(items)]``."""
    config.validate()
    if not items:
        raise SpecLedgerError("the workload has no prompts; give at least one")
    own_client = client is None
    if client is None:
        limit = config.concurrency or 256
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
        )
    start = time.perf_counter()
    end_by = start + config.total_deadline_s()  # the load's deadline: requests in flight end by it too
    deadline = min(start + config.duration_s if config.duration_s else float("inf"), end_by)
    results: list[RequestResult] = []
    try:
        if config.concurrency is not None:
            counter = iter(range(config.num_requests))

            async def worker() -> None:
                for index in counter:
                    if time.perf_counter() >= deadline:
                        return
                    item = items[index % len(items)]
                    results.append(await send_one(client, config, item, index, start, tokenizer, end_by))

            await asyncio.gather(*(worker() for _ in range(config.concurrency)))
        else:
            tasks = []
            for index, offset in enumerate(
                poisson_arrivals(config.rate, config.num_requests, config.arrival_seed)
            ):
                if start + offset >= deadline:
                    break
                await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
                item = items[index % len(items)]
                tasks.append(asyncio.create_task(send_one(client, config, item, index, start, tokenizer, end_by)))
            results = list(await asyncio.gather(*tasks))
    finally:
        if own_client:
            await client.aclose()
    wall = time.perf_counter() - start
    results.sort(key=lambda r: r.index)
    if time.perf_counter() >= end_by:
        warn_unsent(config.num_requests, len(results), config.total_deadline_s())
    return LoadRun(results=results, wall_time_s=wall, config=config.describe())
