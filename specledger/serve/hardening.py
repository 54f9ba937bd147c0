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
- a huge header block: uvicorn's ``h11_max_incomplete_event_size`` (431), and every other request the
  HTTP parser refuses (400): OpenAI-style JSON all the same (:func:`parser_refusal`);
- a connection flood: uvicorn's ``limit_concurrency`` (503 beyond it);
- a client that stops reading (its connection would hold a batch slot, then a connection, forever:
  asyncio flushes a closed transport's buffer before letting go): :func:`timed_h11` aborts a
  connection whose outgoing buffer has not shrunk for ``send_timeout_s`` (sampled every
  ``min(1, send_timeout_s / 4)`` s); the aborted stream's client is gone, so its job is released
  and its batch slot freed at the next step;
- a web page posting to the loopback server (a "simple" cross-origin request needs no CORS
  preflight for ``text/plain``) or reading it through DNS rebinding: :class:`RequestGate` answers
  415 to a POST whose Content-Type is not ``application/json`` and 421 to a Host header not in
  ``allowed_hosts`` (loopback names by default), before reading the body.

:class:`AccessLog` writes one line per request (logger ``specledger.serve.access``, INFO), every
client-supplied part passed through :func:`log_safe` (no newline or terminal escape reaches a log
line). :func:`uvicorn_config` puts the transport limits together; the CLI and
:class:`~specledger.serve.runner.ServerThread` both use it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp as AsgiApp
from starlette.types import Message as AsgiMessage
from starlette.types import Receive as AsgiReceive
from starlette.types import Scope as AsgiScope
from starlette.types import Send as AsgiSend
from uvicorn.protocols.http.h11_impl import H11Protocol

from specledger.serve.drain import DEFAULT_SHUTDOWN_GRACE_S, SHUTDOWN_BACKSTOP_S
from specledger.serve.protocol import RequestError, error_body

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: a full 8k-token context, JSON-escaped, fits many times over
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_KEEP_ALIVE_S = 5
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_LIMIT_CONCURRENCY = 1024
#: A client that reads nothing for this long while the server has bytes for it is dropped. Generous
#: for a live reader (its kernel socket buffer takes hundreds of KB before ours fills at all).
DEFAULT_SEND_TIMEOUT_S = 30.0
#: The Host names a loopback-bound server answers (any port): what a local client sends. A DNS
#: rebinding page sends its own domain name, which is not among them.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"
LOG_SAFE_LIMIT = 512

CLOSE = {"Connection": "close"}

access_log = logging.getLogger("specledger.serve.access")


@dataclass(frozen=True)
class Limits:
    """The transport limits of one server (see the module docstring)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keep_alive_s: int = DEFAULT_KEEP_ALIVE_S
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    limit_concurrency: int | None = DEFAULT_LIMIT_CONCURRENCY
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS  # "*" among them: any Host
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S  # requests in flight may run this long after SIGTERM


def host_name(value: str) -> str:
    """The name part of a Host header or an allow-list entry, normalised: ``[::1]:8000`` -> ``::1``,
    ``LocalHost.:80`` -> ``localhost``; a bare IPv6 address stays whole. Invariant: only a ``:port`` of
    digits is cut off; anything else after the name (``[::1]evil.example``, ``localhost:x.evil``) keeps the
    whole value, which names no allowed host."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end <= 0 or not _is_port_suffix(value[end + 1:]):
            return value
        value = value[1:end]
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
        if not port.isdigit() and port:
            return value
        value = name
    return value.rstrip(".")


def _is_port_suffix(rest: str) -> bool:
    """'' or ``:digits`` (what may follow a bracketed IPv6 address in a Host header)."""
    return rest == "" or rest == ":" or (rest.startswith(":") and rest[1:].isdigit())


def log_safe(text: str, limit: int = LOG_SAFE_LIMIT) -> str:
    r"""``text`` fit for one log line: every character that is not printable (controls such as a
    newline, a carriage return or ESC; line and paragraph separators; format characters) and the
    backslash itself written as a Python escape (``\n``, ``\x1b``, ``\u2028``, ``\\``), so the
    result is unambiguous; longer than ``limit`` characters: cut, with ``...``."""
    cut = len(text) > limit
    out = []
    for ch in text[:limit]:
        if ch == "\\":
            out.append("\\\\")
        elif ch == " " or ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out) + ("..." if cut else "")


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


def _header(scope: AsgiScope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


async def _send_error(send: AsgiSend, exc: RequestError) -> None:
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

    def __init__(self, app: AsgiApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: AsgiScope, receive: AsgiReceive, send: AsgiSend) -> None:
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

        async def limited_receive() -> AsgiMessage:
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

        async def tracked_send(message: AsgiMessage) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except (BodyTooLarge, BodyTimeout) as exc:  # a route that did not answer it itself
            if started:
                raise
            await _send_error(send, exc)


class RequestGate:
    """ASGI middleware: the Host allow-list (421) and, on POST, a JSON Content-Type (415), both
    answered before a byte of the body is read (and the connection closed after).

    Invariant: the app below sees only requests whose Host names an allowed host (``"*"`` among
    ``allowed_hosts``: any) and POSTs declaring ``application/json`` (parameters such as
    ``charset`` allowed).
    """

    def __init__(self, app: AsgiApp, allowed_hosts: Iterable[str] = LOOPBACK_HOSTS) -> None:
        self.app = app
        hosts = {host_name(h) for h in allowed_hosts}
        self.any_host = ANY_HOST in hosts
        self.hosts = frozenset(hosts - {ANY_HOST})

    async def __call__(self, scope: AsgiScope, receive: AsgiReceive, send: AsgiSend) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await _send_error(send, refusal)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: AsgiScope) -> RequestError | None:
        """The error this request gets at the gate, or None to let it through."""
        if not self.any_host:
            raw = _header(scope, b"host")
            if raw is None:
                return RequestError("the request has no Host header; send Host: localhost", headers=dict(CLOSE),
                                    code="host_missing")
            name = host_name(raw.decode("latin-1"))
            if name not in self.hosts:
                shown = ", ".join(sorted(self.hosts)) or "none"
                return RequestError(
                    f"this server does not answer for host {json.dumps(name[:100])} (allowed: {shown}; "
                    "start it with --allow-host NAME to add one)",
                    status=421, code="host_not_allowed", headers=dict(CLOSE),
                )
        if scope.get("method") == "POST":
            raw = _header(scope, b"content-type")
            media = (raw or b"").decode("latin-1").split(";", 1)[0].strip().lower()
            if media != "application/json":
                got = json.dumps(media[:100]) if raw is not None else "none"
                return RequestError(f"the request body must be JSON: send Content-Type: application/json "
                                    f"(got {got})", status=415, code="unsupported_media_type",
                                    headers=dict(CLOSE))
        return None


class AccessLog:
    """ASGI middleware: one INFO line per HTTP request on ``specledger.serve.access`` --
    ``client "METHOD path?query" status seconds`` -- with the path and query through
    :func:`log_safe` (the path is percent-decoded: ``%0A`` is a real newline by then). Costs
    nothing when that logger is not enabled for INFO."""

    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    async def __call__(self, scope: AsgiScope, receive: AsgiReceive, send: AsgiSend) -> None:
        if scope["type"] != "http" or not access_log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        status = [0]
        t0 = time.perf_counter()

        async def logged_send(message: AsgiMessage) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, logged_send)
        finally:
            access_log.info("%s", access_line(scope, status[0], time.perf_counter() - t0))


def access_line(scope: AsgiScope, status: int, seconds: float) -> str:
    """``127.0.0.1:5000 "GET /v1/models" 200 0.002s``; status 0: no response was started."""
    client = scope.get("client")
    who = f"{client[0]}:{client[1]}" if client else "-"
    target = scope.get("path", "")
    query = scope.get("query_string", b"")
    if query:
        target += "?" + query.decode("latin-1")
    return f'{who} "{log_safe(str(scope.get("method", "?")), 16)} {log_safe(target)}" {status} {seconds:.3f}s'


def timed_h11(header_timeout_s: float, send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a request-head timeout: a connection whose next request head
    is not complete ``header_timeout_s`` after it connected, or after its previous response
    ended, is closed. (uvicorn's keep-alive timer stops at the first byte, so a client that
    sends one byte and stalls would otherwise hold the connection forever.)

    And a send timeout: a connection whose outgoing buffer is non-empty and has not shrunk for
    ``send_timeout_s`` (checked every ``min(1, send_timeout_s / 4)`` s) is aborted -- its
    buffered bytes dropped, the app told the client is gone -- so a client that stops reading
    holds neither its batch slot nor its connection."""
    period = min(1.0, send_timeout_s / 4)

    class TimedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _armed_for: Any = None
        _send_timer: asyncio.TimerHandle | None = None
        _stalled_since: float | None = None
        _buffered = 0

        def _watch_send(self) -> None:
            """Abort the connection once its write buffer has stood without shrinking for send_timeout_s."""
            self._send_timer = None
            transport = self.transport
            size = transport.get_write_buffer_size()
            now = self.loop.time()
            if size == 0 or size < self._buffered:
                self._stalled_since = None if size == 0 else now
            elif self._stalled_since is None:
                self._stalled_since = now
            elif now - self._stalled_since >= send_timeout_s:
                transport.abort()  # connection_lost follows: the app hears http.disconnect
                return
            self._buffered = size
            self._send_timer = self.loop.call_later(period, self._watch_send)

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
            self._send_timer = self.loop.call_later(period, self._watch_send)

        def handle_events(self) -> None:
            super().handle_events()
            if self._head_timer is not None and self.cycle is not self._armed_for:
                self._disarm()  # a new request head arrived in time

        def on_response_complete(self) -> None:
            self._arm()  # before super(): it may parse a pipelined request head at once
            super().on_response_complete()

        def send_400_response(self, msg: str) -> None:
            """A request h11 itself refused (bad syntax, ``Content-Length: -1``, a header block over the
            limit): OpenAI-style JSON, 431 for the too-large header block, 400 otherwise; then close."""
            status, body = parser_refusal(self.conn)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            try:
                for event in (h11.Response(status_code=status, headers=headers), h11.Data(data=body),
                              h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event))
            except h11.LocalProtocolError:  # the connection cannot take a response any more
                pass
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None
            super().connection_lost(exc)

    return TimedH11Protocol


def parser_refusal(conn: Any) -> tuple[int, bytes]:
    """(status, JSON body) for a request the HTTP parser refused: 431 when its unparsed head passed the
    parser's size limit, 400 otherwise (the message never quotes the request)."""
    limit = getattr(conn, "_max_incomplete_event_size", None)
    buffered = len(getattr(conn, "_receive_buffer", b"") or b"")
    if isinstance(limit, int) and buffered > limit:
        status, message, code = 431, f"the request head is larger than this server accepts ({limit} bytes)", \
            "request_header_fields_too_large"
    else:
        status, message, code = 400, "the request is not valid HTTP/1.1 (malformed request line or headers, " \
            "a bad Content-Length, or a repeated Host)", "invalid_http_request"
    return status, json.dumps(error_body(message, code=code)).encode()


def uvicorn_config(app: Any, host: str = "127.0.0.1", port: int = 0, limits: Limits | None = None,
                   **kwargs: Any) -> uvicorn.Config:
    """A uvicorn Config for ``app`` with ``limits`` (the body limit itself is the app's middleware)."""
    limits = limits or Limits()
    return uvicorn.Config(
        app, host=host, port=port, http=timed_h11(limits.header_timeout_s, limits.send_timeout_s),
        log_level="warning",
        access_log=False, timeout_keep_alive=limits.keep_alive_s, limit_concurrency=limits.limit_concurrency,
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_graceful_shutdown=limits.shutdown_grace_s + SHUTDOWN_BACKSTOP_S, **kwargs,
    )
