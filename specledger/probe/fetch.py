"""The one bounded reader of server responses, and the credentials the probe sends.

Every request the probe makes (model discovery, ``/metrics`` scrapes, the streamed completions of
:mod:`specledger.probe.loadgen`) is bounded twice:

* in time: the whole exchange (connect, headers, every body byte) must end within ``timeout_s`` seconds
  of wall time (``asyncio.wait_for`` over all of it). httpx's own timeouts are per operation, so a server
  that trickles one byte a second would otherwise go on for ever;
* in size: at most ``max_bytes`` bytes of body are read (:func:`read_body`); past that the answer is
  refused (:class:`ResponseTooLarge`) or, for an error body that is only quoted, cut (``truncate``).

Credentials never reach a file or a message: :func:`split_credentials` takes ``user:pass@`` out of a URL
(it becomes an ``Authorization: Basic`` header, as httpx would send it) and every URL the probe stores or
prints is the one without them; header values (``--header``, ``--api-key``) live only in the headers the
requests carry, never in a config that is written, and :func:`redact` blanks them out of any text
(a server may echo a header into an error body).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from specledger.errors import SpecLedgerError

#: a /models answer or a /metrics dump larger than this is refused (a vLLM dump with every histogram is ~1 MB)
MAX_BODY_BYTES = 16 * 1024 * 1024
#: one streamed completion larger than this fails as ``TooLarge`` (a 1M-token answer is ~10-100 MB of SSE)
MAX_STREAM_BYTES = 256 * 1024 * 1024
REDACTED = "***"


class ResponseTooLarge(Exception):
    """A body passed its byte bound."""


@dataclass(frozen=True)
class Fetched:
    """A bounded answer: status, content type and at most ``max_bytes`` of body."""

    status: int
    content_type: str | None
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


async def read_body(response: httpx.Response, max_bytes: int, truncate: bool = False) -> bytes:
    """At most ``max_bytes`` of the body; more raises :class:`ResponseTooLarge` (or, with ``truncate``,
    the first ``max_bytes`` are returned and the rest is not read)."""
    parts: list[bytes] = []
    size = 0
    async for raw in response.aiter_bytes():
        parts.append(raw)
        size += len(raw)
        if size > max_bytes:
            if truncate:
                break
            raise ResponseTooLarge(f"the answer passed {max_bytes} bytes")
    return b"".join(parts)[:max_bytes]


async def fetch_async(client: httpx.AsyncClient, url: str, *, timeout_s: float,
                      max_bytes: int = MAX_BODY_BYTES) -> Fetched:
    """GET ``url`` within ``timeout_s`` in total and ``max_bytes`` of body (see the module docstring).
    Raises ``asyncio.TimeoutError``, :class:`ResponseTooLarge` or an ``httpx.HTTPError``."""

    async def exchange() -> Fetched:
        async with client.stream("GET", url) as response:
            body = await read_body(response, max_bytes)
            return Fetched(response.status_code, response.headers.get("content-type"), body)

    return await asyncio.wait_for(exchange(), timeout_s)


def fetch(url: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = 10.0,
          max_bytes: int = MAX_BODY_BYTES) -> Fetched:
    """:func:`fetch_async` from synchronous code (its own event loop and client); every failure -- the
    total timeout, the size bound, the transport -- is an :class:`httpx.TransportError` subclass whose
    message says which, so callers handle one exception type."""

    async def run() -> Fetched:
        timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        async with httpx.AsyncClient(timeout=timeout, headers=dict(headers or {})) as client:
            return await fetch_async(client, url, timeout_s=timeout_s, max_bytes=max_bytes)

    try:
        return asyncio.run(run())
    except asyncio.TimeoutError:
        raise BoundExceeded(f"TotalTimeout: no complete answer within {timeout_s:g} s") from None
    except ResponseTooLarge as exc:
        raise BoundExceeded(f"TooLarge: {exc}") from None


class BoundExceeded(httpx.TransportError):
    """The total timeout or the size bound of :func:`fetch` was passed."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


# ----------------------------------------------------------------------------- credentials


def split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """``http://user:pass@host:port/path`` -> (``http://host:port/path``, ``{"Authorization": "Basic ..."}``);
    a URL without user info comes back unchanged with no header."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, {}
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    return urlunsplit(parts._replace(netloc=hostport)), {"Authorization": f"Basic {token}"}


def redact_url(url: str) -> str:
    """``url`` with any ``user:pass@`` replaced by ``***@`` (for messages about a URL not yet split)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url if "@" not in url else REDACTED
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=f"{REDACTED}@{parts.netloc.rpartition('@')[2]}"))


def parse_headers(values: list[str] | None, api_key: str | None = None) -> dict[str, str]:
    """``--header 'Name: value'`` (repeatable) and ``--api-key KEY`` (``Authorization: Bearer KEY`` unless a
    ``--header Authorization`` is given) -> the headers every request carries. A malformed header is a
    one-line SpecLedgerError that quotes its name only, never its value."""
    out: dict[str, str] = {}
    for raw in values or []:
        name, sep, value = raw.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or any(c in name for c in " \t\r\n") or any(c in value for c in "\r\n"):
            shown = name if sep and name else "<no name>"
            raise SpecLedgerError(f"--header {shown!r}... is not 'Name: value' (one line); e.g. --header "
                                  "'Authorization: Bearer KEY'")
        out[name] = value
    if api_key and not any(k.lower() == "authorization" for k in out):
        if any(c in api_key for c in "\r\n"):
            raise SpecLedgerError("--api-key holds a line break; give the key alone")
        out["Authorization"] = f"Bearer {api_key.strip()}"
    return out


def secrets_of(headers: Mapping[str, str]) -> list[str]:
    """The values to keep out of any text: every header value and, for ``Bearer``/``Basic`` schemes, the
    token alone (longest first, so a token inside its header value is blanked whole)."""
    found: set[str] = set()
    for value in headers.values():
        if value:
            found.add(value)
            scheme, _, token = value.partition(" ")
            if token.strip() and scheme.lower() in ("bearer", "basic", "token"):
                found.add(token.strip())
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    """``text`` with every secret (:func:`secrets_of`) replaced by ``***``."""
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


__all__ = [
    "MAX_BODY_BYTES", "MAX_STREAM_BYTES", "BoundExceeded", "Fetched", "ResponseTooLarge", "fetch", "fetch_async",
    "parse_headers", "read_body", "redact", "redact_url", "secrets_of", "split_credentials",
]
