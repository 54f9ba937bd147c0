"""Transport-level limits for ``specledger serve``: request body size, slow clients, connections.

What a hostile but fair client can no longer do, and the knob that stops it:

- a huge body: :class:`BodyLimit` (ASGI middleware) answers 413 from ``Content-Length`` before
  reading a byte, and stops reading a chunked body once it passes ``max_body_bytes`` (the
  handler gets a 413 :class:`BodyTooLarge`); either way the connection is closed after the 413;
- a body trickled forever: the same middleware gives the body ``body_timeout_s`` in all (408);
- a request head trickled forever (slowloris) or a connection opened and left idle:
  :func:`timed_h11` closes a connection whose request head is not complete within
  ``header_timeout_s`` of connecting or of its previous response (uvicorn has no knob for this);
- an idle keep-alive connection: uvicorn's ``timeout_keep_alive``;
- a huge header block: uvicorn's ``h11_max_incomplete_event_size`` (h11 answers 400);
- a connection flood: uvicorn's ``limit_concurrency`` (503 beyond it).

:func:`uvicorn_config` puts them together; the CLI and :class:`~specledger.serve.runner.ServerThread`
both use it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from specledger.serve.protocol import RequestError

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: a full 8k-token context, JSON-escaped, fits many times over
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_KEEP_ALIVE_S = 5
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_LIMIT_CONCURRENCY = 1024

CLOSE = {"Connection": "close"}


@dataclass(frozen=True)
class Limits:
    """The transport limits of one server (see the module docstring)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keep_alive_s: int = DEFAULT_KEEP_ALIVE_S
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    limit_concurrency: int | None = DEFAULT_LIMIT_CONCURRENCY


class BodyTooLarge(RequestError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the request body is larger than this server accepts ({limit} bytes); send a smaller request",
            status=413, code="request_too_large", headers=dict(CLOSE),
        )


class BodyTimeout(RequestError):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            f"the request body did not arrive within {timeout_s:g} s; send it at once",
            status=408, code="request_timeout", headers=dict(CLOSE),
        )


def _header(scope: dict[str, Any], name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


async def _send_error(send: Any, exc: RequestError) -> None:
    body = json.dumps(exc.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: at most ``max_bytes`` of request body, all of it within ``timeout_s``.

    Invariant: no request body larger than ``max_bytes`` is ever buffered by the app: a declared
    ``Content-Length`` above it is refused before reading; an undeclared (chunked) body raises
    :class:`BodyTooLarge` from ``receive`` as soon as the running total passes it.
    """

    def __init__(self, app: Any, max_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None:
            text = declared.decode("latin-1").strip()
            if not text.isdigit():
                await _send_error(send, RequestError("the Content-Length header is not a number",
                                                     headers=dict(CLOSE)))
                return
            if int(text) > self.max_bytes:
                await _send_error(send, BodyTooLarge(self.max_bytes))
                return
        received, complete = 0, False
        deadline = time.monotonic() + self.timeout_s
        max_bytes, timeout_s = self.max_bytes, self.timeout_s

        async def limited_receive() -> dict[str, Any]:
            nonlocal received, complete
            if complete:  # the body is in; later receives wait for the disconnect, unbounded
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise BodyTimeout(timeout_s) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    raise BodyTooLarge(max_bytes)
                complete = not message.get("more_body", False)
            else:
                complete = True
            return message

        started = False

        async def tracked_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except (BodyTooLarge, BodyTimeout) as exc:  # a route that did not answer it itself
            if started:
                raise
            await _send_error(send, exc)


def timed_h11(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a request-head timeout: a connection whose next request head
    is not complete ``header_timeout_s`` after it connected, or after its previous response
    ended, is closed. (uvicorn's keep-alive timer stops at the first byte, so a client that
    sends one byte and stalls would otherwise hold the connection forever.)"""

    class TimedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _armed_for: Any = None

        def _arm(self) -> None:
            self._disarm()
            self._armed_for = self.cycle
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self.cycle is self._armed_for and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self._head_timer is not None and self.cycle is not self._armed_for:
                self._disarm()  # a new request head arrived in time

        def on_response_complete(self) -> None:
            self._arm()  # before super(): it may parse a pipelined request head at once
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return TimedH11Protocol


def uvicorn_config(app: Any, host: str = "127.0.0.1", port: int = 0, limits: Limits | None = None,
                   **kwargs: Any) -> uvicorn.Config:
    """A uvicorn Config for ``app`` with ``limits`` (the body limit itself is the app's middleware)."""
    limits = limits or Limits()
    return uvicorn.Config(
        app, host=host, port=port, http=timed_h11(limits.header_timeout_s), log_level="warning",
        access_log=False, timeout_keep_alive=limits.keep_alive_s, limit_concurrency=limits.limit_concurrency,
        h11_max_incomplete_event_size=limits.max_header_bytes, **kwargs,
    )
