"""The ASGI objects the server's middlewares read and write (:mod:`specledger.serve.hardening`), by the keys they
use (ASGI 3.0, HTTP connections: https://asgi.readthedocs.io/en/latest/specs/www.html). A server passes more keys
than these; the middlewares pass every object on as it came."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TypedDict


class _ScopeKeys(TypedDict):
    type: str  # "http", "websocket" or "lifespan"


class AsgiScope(_ScopeKeys, total=False):
    """A connection's scope; the keys past ``type`` are an HTTP connection's."""

    method: str  # "GET", "POST", ...
    path: str  # percent-decoded
    query_string: bytes  # as sent, still percent-encoded
    headers: Iterable[tuple[bytes, bytes]]  # (name, value) pairs as sent
    client: tuple[str, int] | None  # (host, port) of the peer, when known


class _MessageKeys(TypedDict):
    type: str  # "http.request", "http.disconnect", "http.response.start", "http.response.body"


class AsgiMessage(_MessageKeys, total=False):
    """An event received from the client or sent to it."""

    body: bytes  # http.request / http.response.body: a chunk of the body
    more_body: bool  # another chunk follows
    status: int  # http.response.start: the HTTP status
    headers: Iterable[tuple[bytes, bytes]]  # http.response.start


#: awaits the next event from the client
AsgiReceive = Callable[[], Awaitable[AsgiMessage]]
#: sends one event to the client
AsgiSend = Callable[[AsgiMessage], Awaitable[None]]
#: an ASGI application (or middleware) called once per connection
AsgiApp = Callable[[AsgiScope, AsgiReceive, AsgiSend], Awaitable[None]]
