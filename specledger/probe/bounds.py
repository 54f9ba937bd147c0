"""What one probe may cost, whatever the server does: per-request memory and bytes, and the total time.

A hostile or broken server can stream for ever, send one endless line, or trickle a byte a second. The probe
keeps only what the ledger needs from each request and stops reading past it:

* :func:`stream_limits`: a request asked for ``max_tokens`` tokens keeps at most ``max_tokens`` plus a margin
  of token-bearing chunks (each chunk is at least one token, so a server that honours ``max_tokens`` never
  reaches it), at most :data:`MAX_CHARS_PER_TOKEN` characters of text per allowed chunk, and reads at most
  :data:`BASE_STREAM_BYTES` plus :data:`BYTES_PER_TOKEN` per token of SSE; past any of them the request fails
  (``TooLong:`` / ``TooLarge:``) and what it kept so far -- bounded -- is all that is written;
* :func:`default_deadline_s`: the whole load (every request of one endpoint at one load) ends by a deadline,
  by default the longest a probe could take whose every request used its whole ``--timeout``;
* :func:`check_some_succeeded`: the rule for failures -- an endpoint whose every request failed ends the probe
  with one ``error:`` line (exit 2); some failures are counted in the report and warned about, and the probe
  goes on with the requests that succeeded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specledger.errors import SpecLedgerError, SpecLedgerWarning

#: token-bearing chunks a request may stream beyond its max_tokens (servers that count a last empty or
#: reasoning chunk apart), at least this many, else a quarter of max_tokens
MIN_CHUNK_MARGIN = 64
#: characters of generated text kept per allowed chunk (a token is rarely over 16 characters)
MAX_CHARS_PER_TOKEN = 256
#: SSE bytes read per request: this much for the head of the stream and its last events ...
BASE_STREAM_BYTES = 1 << 20
#: ... plus this much per token asked for (a chunk with usage, timings and logprobs is under 2 KiB)
BYTES_PER_TOKEN = 8 * 1024
#: added to the default deadline: connection set-up, scheduling, the last request's bookkeeping
DEADLINE_SLACK_S = 10.0


@dataclass(frozen=True)
class StreamLimits:
    """The bounds of one streamed request (see the module docstring)."""

    max_tokens: int
    max_chunks: int
    max_chars: int
    max_bytes: int


def stream_limits(max_tokens: int, hard_max_bytes: int) -> StreamLimits:
    """The bounds for a request asked for ``max_tokens`` tokens; ``hard_max_bytes`` caps the bytes whatever
    ``max_tokens`` says. Invariant: every bound grows with ``max_tokens`` and none is below what a server that
    honours ``max_tokens`` sends."""
    tokens = max(1, int(max_tokens))
    chunks = tokens + max(MIN_CHUNK_MARGIN, tokens // 4)
    return StreamLimits(max_tokens=tokens, max_chunks=chunks, max_chars=chunks * MAX_CHARS_PER_TOKEN,
                        max_bytes=min(hard_max_bytes, BASE_STREAM_BYTES + tokens * BYTES_PER_TOKEN))


def default_deadline_s(num_requests: int, timeout_s: float, concurrency: int | None = None,
                       rate: float | None = None, duration_s: float | None = None) -> float:
    """The default total deadline of one load: closed loop, ``ceil(requests / concurrency)`` waves of
    ``timeout_s``; open loop, the arrivals' span (``requests / rate``, at most ``duration_s``) plus one
    ``timeout_s``; plus :data:`DEADLINE_SLACK_S`. A probe whose every request ends within ``--timeout`` never
    meets it; ``--deadline`` sets a tighter one."""
    if rate:
        total = num_requests / rate + timeout_s
    else:
        total = math.ceil(num_requests / max(1, concurrency or 1)) * timeout_s
    if duration_s:
        total = min(total, duration_s + timeout_s)
    return total + DEADLINE_SLACK_S


def check_some_succeeded(results: Sequence[Any], url: str) -> None:
    """Raise a one-line :class:`SpecLedgerError` (exit 2) when there were requests and every one failed,
    quoting the first failure (``url`` shown without credentials); fine when any succeeded (the failures are
    counted and warned about)."""
    from specledger.probe.fetch import redact_url

    if not results or any(getattr(r, "ok", False) for r in results):
        return
    first = next((r.error for r in results if getattr(r, "error", None)), "unknown")
    kinds = sorted({str(r.error or "unknown").split(":", 1)[0] for r in results})
    sent = f"the {len(results)} requests" if len(results) > 1 else "the one request"
    raise SpecLedgerError(f"every one of {sent} sent to {redact_url(url)} failed ({', '.join(kinds[:4])}); "
                          f"the first: {first[:200]}")


def over_limits(result: Any, limits: StreamLimits, chars: int) -> bool:
    """Would one more token chunk of ``chars`` characters take the request ``result`` (a RequestResult) past
    ``limits``? If so, set its ``error`` (the caller then stops reading). The running character count rides
    on the result as ``_kept_chars``, which is not a field, so it is never written."""
    kept = getattr(result, "_kept_chars", 0) + chars
    result._kept_chars = kept
    if len(result.chunk_times) >= limits.max_chunks:
        result.error = f"TooLong: more than {limits.max_chunks} token chunks for max_tokens {limits.max_tokens} " \
                       "(plus a margin); stopped reading: does the server ignore max_tokens?"
    elif kept > limits.max_chars:
        result.error = f"TooLarge: more than {limits.max_chars} characters of text; stopped reading"
    return result.error is not None


def warn_unsent(num_requests: int, sent: int, deadline_s: float) -> None:
    """One :class:`SpecLedgerWarning` when the load's deadline left requests unsent."""
    if sent < num_requests:
        import warnings

        warnings.warn(SpecLedgerWarning(
            f"the load's deadline of {deadline_s:g} s passed: {num_requests - sent} of {num_requests} requests "
            "were not sent (--deadline sets it)"), stacklevel=3)
