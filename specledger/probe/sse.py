"""Incremental Server-Sent Events parser and OpenAI streaming-chunk interpretation.

:class:`SSEParser` turns bytes (split anywhere, even inside a UTF-8 character or between
CR and LF) into events, following the WHATWG event-stream rules: lines end in LF, CRLF or
CR; a blank line dispatches the event; ``:`` starts a comment; ``data`` fields of one event
are joined with newlines; one leading space after the colon is dropped.

Invariant: for any byte string and any way of splitting it into chunks, the events returned
by ``feed`` over the chunks followed by ``close`` are the same. Cost: linear in the input, however it
is split and whatever its line endings (one regex scan per fed chunk; an unfinished line is kept as a
list of pieces and joined once, when its end arrives).

:func:`interpret_event` maps one event of an OpenAI-compatible stream to a
:class:`StreamChunk`: text delta (``choices[0].text`` for /v1/completions,
``choices[0].delta.content`` for /v1/chat/completions), ``usage`` when present, ``[DONE]``,
or an error object for malformed JSON -- never an exception. Engine additions read too:

* reasoning text, ``choices[0].delta.reasoning_content`` (llama.cpp with ``--reasoning-format``,
  vLLM and SGLang reasoning parsers) or ``delta.reasoning`` (vLLM >= 0.10): generated tokens, so a
  chunk that carries only reasoning is still a token-bearing chunk;
* llama.cpp's ``timings`` object (``tools/server/server-common.cpp``, ``server_slot_stats::to_json``:
  ``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms`` ..., and ``draft_n`` / ``draft_n_accepted``
  once the slot has drafted a token). It rides on the last chunk of a response, and on every chunk with
  ``"timings_per_token": true``; each is a *cumulative snapshot* of the response so far (``draft_n`` 25 then
  60 in one response), so a reader keeps the last one per response and never adds them;
* the per-request speculation figures vLLM and SGLang attach to a response, as ``spec_stats``
  (``{"source": ..., "details": ...}``, read by :func:`specledger.probe.counters.request_counts`):
  vLLM >= 0.29 started with ``--per-request-spec-decode-metrics summary`` puts
  ``metrics.speculative_decoding`` (``num_spec_steps``, ``num_draft_tokens``,
  ``num_accepted_draft_tokens`` ...) on the final usage chunk (``vllm/entrypoints/generate/base/protocol.py``);
  SGLang >= 0.5.19 asked with ``"return_spec_tokens_details": true`` sends ``sglext.spec_tokens_details``
  (``spec_verify_ct``, ``spec_num_proposed_drafts``, ``spec_num_correct_drafts``; a list when n > 1) in a
  chunk of its own (``python/sglang/srt/entrypoints/openai/protocol.py``, ``SpecTokensDetails``);
* the response ``id`` (``chatcmpl-...``), so a capture of several responses splits into responses;
* TGI's native ``/generate_stream`` events, ``{"token": {"text": ...}, "details": ...}``
  (``router/src/lib.rs``, ``StreamResponse``), the last one's ``details.generated_tokens`` as the usage;
* a non-streamed reply (``stream: false``) read as one chunk: ``choices[0].message`` in place of the delta
  (content, reasoning), with the same ``usage``, ``timings`` and per-request figures.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, cast

from specledger.errors import SpecLedgerError
from specledger.probe.wire import (
    ChatDelta,
    EngineSpecStats,
    LlamaTimings,
    StreamChunkJson,
    StreamUsage,
    TgiDetails,
    TgiToken,
)

_LINE_END = re.compile(r"\r\n|\r|\n")
_HAS_END = re.compile(r"[\r\n]")


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event: joined data, event type and last event id."""

    data: str
    event: str = "message"
    id: str | None = None


class SSEParser:
    """Feed bytes or str, get complete events back; ``close`` flushes an unterminated event.

    At end of stream an event whose blank line never came is still dispatched (lenient: some
    servers close right after the last ``data:`` line).
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending: list[str] = []  # the unfinished line, in pieces (no line end, but maybe a last CR)
        self._data: list[str] = []
        self._event = ""
        self._last_id: str | None = None
        self._started = False
        self.comments = 0

    def feed(self, chunk: bytes | str) -> list[SSEEvent]:
        text = self._decoder.decode(chunk) if isinstance(chunk, (bytes, bytearray)) else chunk
        if not isinstance(text, str):
            raise SpecLedgerError("SSE input must be bytes or str")
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        if not text:
            return []
        if not _HAS_END.search(text) and not (self._pending and self._pending[-1].endswith("\r")):
            self._pending.append(text)  # still inside one line: nothing to scan again
            return []
        return self._drain(text, final=False)

    def close(self) -> list[SSEEvent]:
        """Flush: decode the remaining bytes, take the last line and dispatch a pending event."""
        events = self._drain(self._decoder.decode(b"", final=True), final=True)
        if self._pending:
            events.extend(self._line("".join(self._pending)))
            self._pending = []
        if self._data:
            events.append(self._dispatch())
        return events

    def _drain(self, text: str, final: bool) -> list[SSEEvent]:
        """Split the pending line plus ``text`` at every line end; what follows the last one stays pending."""
        buffer = "".join(self._pending) + text
        self._pending = []
        events: list[SSEEvent] = []
        start = 0
        for match in _LINE_END.finditer(buffer):
            if match.group() == "\r" and match.end() == len(buffer) and not final:
                break  # CR at the end: the LF of a CRLF may still come
            events.extend(self._line(buffer[start:match.start()]))
            start = match.end()
        if start < len(buffer):
            self._pending = [buffer[start:]]
        return events

    def _line(self, line: str) -> list[SSEEvent]:
        if line == "":
            return [self._dispatch()] if self._data else self._reset()
        if line.startswith(":"):
            self.comments += 1
            return []
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self._last_id = value
        return []

    def _reset(self) -> list[SSEEvent]:
        self._data, self._event = [], ""
        return []

    def _dispatch(self) -> SSEEvent:
        event = SSEEvent(data="\n".join(self._data), event=self._event or "message", id=self._last_id)
        self._reset()
        return event


def parse_sse(data: bytes | str) -> list[SSEEvent]:
    """All events of a complete stream."""
    parser = SSEParser()
    return parser.feed(data) + parser.close()


@dataclass(frozen=True)
class StreamChunk:
    """One interpreted OpenAI stream event.

    kind: "delta" (a choices chunk; ``text`` may be empty, e.g. the role-only first chat chunk),
    "usage" (no choices, only usage), "done" (``data: [DONE]``), "error" (malformed data or
    an in-stream error object; ``error`` says which).
    """

    kind: Literal["delta", "usage", "done", "error"]
    text: str = ""
    usage: StreamUsage | None = None
    finish_reason: str | None = None
    error: str | None = None
    reasoning: str = ""  # delta.reasoning_content / delta.reasoning
    timings: LlamaTimings | None = None  # llama.cpp's per-response timings
    model: str | None = None
    system_fingerprint: str | None = None  # llama.cpp: its build, e.g. "b6100-..."
    response_id: str | None = None  # the chunk's "id": every chunk of one response carries the same
    spec_stats: EngineSpecStats | None = None  # vLLM / SGLang per-request speculation figures (module docstring)

    @property
    def generated(self) -> str:
        """Every generated character of the chunk: reasoning then content."""
        return self.reasoning + self.text


class _ChunkExtras(TypedDict):
    """What every chunk of an object carries besides its text (the :class:`StreamChunk` fields of that name)."""

    timings: LlamaTimings | None
    model: str | None
    system_fingerprint: str | None
    response_id: str | None
    spec_stats: EngineSpecStats | None


def _error(message: str) -> StreamChunk:
    return StreamChunk(kind="error", error=message)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def interpret_event(event: SSEEvent) -> StreamChunk:
    """Map an SSE event of an OpenAI-compatible stream to a StreamChunk (never raises)."""
    payload = event.data.strip()
    if payload == "[DONE]":
        return StreamChunk(kind="done")
    try:
        decoded = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        return _error(f"malformed JSON in SSE data ({type(exc).__name__}): {_clip(payload)!r}")
    if not isinstance(decoded, dict):
        return _error(f"SSE data is JSON but not an object: {_clip(payload)!r}")
    obj = cast(StreamChunkJson, decoded)  # its values are checked one by one below
    if "error" in obj and obj.get("error"):
        err = obj["error"]
        message = err.get("message") if isinstance(err, dict) else err
        return _error(f"server error in stream: {_clip(str(message))}")
    usage = obj.get("usage")
    if usage is not None and not isinstance(usage, dict):
        return _error("'usage' in stream chunk is not an object")
    timings = obj.get("timings")
    if timings is not None and not isinstance(timings, dict):
        return _error("'timings' in stream chunk is not an object")
    extras: _ChunkExtras = {
        "timings": timings,
        "model": obj.get("model") if isinstance(obj.get("model"), str) else None,
        "system_fingerprint": fp if isinstance(fp := obj.get("system_fingerprint"), str) else None,
        "response_id": rid if isinstance(rid := obj.get("id"), str) else None,
        "spec_stats": engine_spec_stats(obj),
    }
    choices = obj.get("choices")
    if choices is None and isinstance(obj.get("token"), dict):
        return _tgi_token(obj["token"], usage, extras, obj.get("details"))
    if choices is None or choices == []:
        if usage:
            return StreamChunk(kind="usage", usage=usage, **extras)
        return StreamChunk(kind="delta", usage=None, **extras)
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        return _error("'choices' in stream chunk is not a list of objects")
    choice = choices[0]
    text = choice.get("text")
    reasoning: Any = ""
    if text is None:
        # "message": a whole (non-streamed) reply
        key: Literal["delta", "message"] = "delta" if "delta" in choice or "message" not in choice else "message"
        delta = choice.get(key)
        if delta is not None and not isinstance(delta, dict):
            return _error(f"'choices[0].{key}' in stream chunk is not an object")
        said: ChatDelta = delta or {}
        text = said.get("content")
        reasoning = _reasoning(said)
    text = "" if text is None else text
    reasoning = "" if reasoning is None else reasoning
    if not isinstance(text, str) or not isinstance(reasoning, str):
        return _error("stream chunk text/content/reasoning_content is not a string")
    finish = choice.get("finish_reason")
    return StreamChunk(
        kind="delta", text=text, usage=usage, finish_reason=finish if isinstance(finish, str) else None,
        reasoning=reasoning, **extras,
    )


def _reasoning(delta: ChatDelta) -> Any:
    """The reasoning text of a chat delta: ``reasoning_content`` (llama.cpp, SGLang, vLLM < 0.10) or
    ``reasoning`` (vLLM >= 0.10), whichever is a non-empty string; else whichever is present (None when
    neither: an empty or non-string value is then reported by the caller as it is)."""
    first, second = delta.get("reasoning_content"), delta.get("reasoning")
    for value in (first, second):
        if isinstance(value, str) and value:
            return value
    return first if first is not None else second


def engine_spec_stats(obj: StreamChunkJson) -> EngineSpecStats | None:
    """The per-request speculation object an engine attached to a stream chunk, tagged with its source:
    ``{"source": "vllm", "details": metrics.speculative_decoding}`` or ``{"source": "sglang", "details":
    sglext.spec_tokens_details}`` (an object, or a list of them when n > 1); None when neither is there
    or it is not an object (never raises)."""
    metrics = obj.get("metrics")
    if isinstance(metrics, dict) and isinstance(spec := metrics.get("speculative_decoding"), dict):
        return {"source": "vllm", "details": spec}
    sglext = obj.get("sglext")
    if isinstance(sglext, dict):
        details = sglext.get("spec_tokens_details")
        if isinstance(details, dict) or (isinstance(details, list) and all(isinstance(d, dict) for d in details)):
            return {"source": "sglang", "details": details}
    return None


def _tgi_token(token: TgiToken, usage: StreamUsage | None, extras: _ChunkExtras,
               details: TgiDetails | None = None) -> StreamChunk:
    """TGI ``/generate_stream``: one token per event; special tokens carry no text; the last event's
    ``details`` (``StreamDetails``) gives the finish reason and the response's ``generated_tokens``, read as
    ``usage.completion_tokens`` (TGI sends no usage), so tokens per chunk and the token count are TGI's own."""
    text = token.get("text")
    if not isinstance(text, str):
        return _error("TGI stream 'token.text' is not a string")
    details = details if isinstance(details, dict) else {}
    count, finish = details.get("generated_tokens"), details.get("finish_reason")
    if usage is None and isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        usage = {"completion_tokens": count}
    return StreamChunk(kind="delta", text="" if token.get("special") is True else text, usage=usage,
                       finish_reason=finish if isinstance(finish, str) else None, **extras)


class OpenAIStreamDecoder:
    """Bytes of an OpenAI streaming response -> StreamChunks (SSEParser + interpret_event)."""

    def __init__(self) -> None:
        self._parser = SSEParser()

    def feed(self, chunk: bytes | str) -> list[StreamChunk]:
        return [interpret_event(e) for e in self._parser.feed(chunk)]

    def close(self) -> list[StreamChunk]:
        return [interpret_event(e) for e in self._parser.close()]
