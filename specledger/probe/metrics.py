"""Latency and throughput figures from per-request probe results (pure functions).

Conventions (times in seconds inside, reported in ms):

* TTFT: send -> first chunk with non-empty text.
* TPOT of a request: (t_last_token_chunk - t_first_token_chunk) / (tokens - 1); undefined
  for requests with fewer than 2 tokens. ``tpot_ms`` gives the per-request distribution;
  ``pooled_tpot_ms`` = sum(t_last - t_first) / sum(tokens - 1), the long-run figure.
* Token-level ITL: a chunk of n tokens arriving g after the previous chunk contributes
  [g, 0, ..., 0] (n-1 zeros); the first chunk contributes n-1 zeros. So a request with N
  tokens yields N-1 gaps that sum to t_last - t_first, and their mean is the pooled TPOT.
  With speculative decoding, several tokens per chunk show up as zeros, not as a smaller
  spread-out gap.
* Chunk-level ITL: the gaps between consecutive token chunks, one per chunk after the first
  (what ``vllm bench serve`` reports as ITL).
* Longest stall: the largest chunk-level gap over all successful requests.
* Output throughput: output tokens of successful requests / run wall time. Never a mean of
  per-request speeds.
* The per-request formulas are the run report's (:mod:`specledger.analysis.metrics`: ``tpot``,
  ``token_gaps``, ``chunk_gaps``) over the emission times of :func:`specledger.probe.records.emission_times`
  (each chunk's arrival time once per token in it, chunks without tokens dropped); distributions
  are :func:`specledger.analysis.stats.distribution` (n, mean, P50/P95/P99, max; ms).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Literal, cast

from specledger.analysis.metrics import chunk_gaps, token_gaps, tpot
from specledger.analysis.stats import distribution
from specledger.probe.documents import (
    EndpointSummary,
    LatencyFigures,
    ResponseTimingsFigures,
    ResponseTimingsTotals,
    Speedup,
)
from specledger.probe.loadgen import RequestResult
from specledger.probe.records import emission_times
from specledger.probe.wire import LlamaTimings

MS = 1e3


def _emission(result: RequestResult) -> tuple[list[float], list[int]]:
    return emission_times(result.chunk_times, result.chunk_tokens)


def request_tpot(result: RequestResult) -> float | None:
    """(t_last - t_first) / (tokens - 1) over token-bearing chunks; None below 2 tokens."""
    times, _ = _emission(result)
    return tpot(times[0], times[-1], len(times)) if times else None


def token_itls(result: RequestResult) -> list[float]:
    """Token-level gaps: first chunk -> n-1 zeros; later chunk after gap g -> g then n-1 zeros."""
    return token_gaps(_emission(result)[0])


def chunk_itls(result: RequestResult) -> list[float]:
    """Gaps between consecutive token-bearing chunks (vLLM bench's ITL)."""
    return chunk_gaps(*_emission(result))


def error_counts(results: Sequence[RequestResult]) -> dict[str, int]:
    """Failed requests grouped by kind: 'HTTP 500', 'ConnectError', 'stream' ..."""
    kinds: Counter[str] = Counter()
    for r in results:
        if r.ok:
            continue
        message = r.error or "unknown"
        if message.startswith("HTTP "):
            kinds[message.split(":", 1)[0]] += 1
        elif ":" in message and message.split(":", 1)[0].isidentifier():
            kinds[message.split(":", 1)[0]] += 1
        else:
            kinds["stream"] += 1
    return dict(kinds)


def _count(timings: LlamaTimings, key: str) -> float | None:
    """A finite, non-negative count of a server's ``timings``; None otherwise (an int past the float range too)."""
    value = timings.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def response_timings_figures(timings: Sequence[LlamaTimings]) -> ResponseTimingsFigures | None:
    """llama.cpp's per-response ``timings`` pooled over responses; None when no response has ``draft_n``.

    ``draft_acceptance_rate`` = Σ draft_n_accepted / Σ draft_n (pooled: every proposed token weighs the
    same); ``mean_request_acceptance_rate`` = mean over responses of draft_n_accepted / draft_n (every
    response weighs the same). llama.cpp does not report draft rounds per response, so no acceptance
    length. These are this client's requests only, unlike the server-wide /metrics counters.
    """
    pairs = [(_count(t, "draft_n"), _count(t, "draft_n_accepted")) for t in timings]
    pairs = [(n, a) for n, a in pairs if n is not None and a is not None and a <= n]
    if not pairs:
        return None
    drafted, accepted = sum(n for n, _ in pairs), sum(a for _, a in pairs)
    rates = [a / n for n, a in pairs if n > 0]
    return {
        "source": "llama.cpp response timings",
        "responses": len(pairs),
        "num_draft_tokens": drafted,
        "num_accepted_tokens": accepted,
        "draft_acceptance_rate": accepted / drafted if drafted > 0 else None,
        "mean_request_acceptance_rate": sum(rates) / len(rates) if rates else None,
    }


def _total(values: Sequence[float]) -> float:
    try:
        return math.fsum(values)
    except (OverflowError, ValueError):  # partial sums past the float range: the plain sum is inf
        return float(sum(values))


TimingsTotal = Literal["cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "draft_n", "draft_n_accepted"]
#: llama.cpp ``timings`` fields that add up over responses (counts and milliseconds)
TIMINGS_TOTALS: tuple[TimingsTotal, ...] = ("cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms",
                                             "draft_n", "draft_n_accepted")


def response_timings_totals(timings: Sequence[LlamaTimings]) -> ResponseTimingsTotals | None:
    """llama.cpp's ``timings``, one (the last snapshot) per response, added up field by field over
    :data:`TIMINGS_TOTALS`, whether or not the server drafted; None when no response has one.

    A field no response carries is None; a response that lacks a field others carry counts as 0 for it
    (llama.cpp leaves out ``draft_n`` when nothing was drafted). No rate is derived: llama.cpp's own
    ``predicted_per_second`` divides by the generation steps after the first token (41 tokens in 758.6 ms
    is 52.7 tok/s there, not 54.0), and its per-response rates do not add up.
    """
    if not timings:
        return None
    out: ResponseTimingsTotals = {"responses": len(timings)}
    for key in TIMINGS_TOTALS:
        values = [v for v in (_count(t, key) for t in timings if key in t) if v is not None]
        total = _total(values) if any(key in t for t in timings) else None
        out[key] = int(total) if total is not None and total.is_integer() and not key.endswith("_ms") else total
    return out


def _ms(values: Sequence[float]) -> LatencyFigures:
    """The distribution of ``values`` (seconds) in ms."""
    return cast(LatencyFigures, distribution(values, MS))  # n, mean, p50, p95, p99, max


def summarize(results: Sequence[RequestResult], wall_time_s: float) -> EndpointSummary:
    """The probe summary: counts, throughput, TTFT/TPOT/ITL percentiles (ms), stalls, chunking."""
    ok = [r for r in results if r.ok]
    total_tokens = sum(r.completion_tokens for r in ok)
    total_chunks = sum(len(r.chunk_times) for r in ok)
    tpots = [t for t in (request_tpot(r) for r in ok) if t is not None]
    spans = [
        (r.chunk_times[-1] - r.chunk_times[0], sum(r.chunk_tokens) - 1)
        for r in ok
        if sum(r.chunk_tokens) >= 2
    ]
    pooled_den = sum(n for _, n in spans)
    tok_itl = [g for r in ok for g in token_itls(r)]
    chk_itl = [g for r in ok for g in chunk_itls(r)]
    return {
        "requests_total": len(results),
        "requests_ok": len(ok),
        "requests_failed": len(results) - len(ok),
        "errors": error_counts(results),
        "wall_time_s": wall_time_s,
        "total_output_tokens": total_tokens,
        "output_throughput_tok_s": total_tokens / wall_time_s if wall_time_s > 0 else None,
        "request_throughput_req_s": len(ok) / wall_time_s if wall_time_s > 0 else None,
        "ttft_ms": _ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": _ms(tpots),
        "pooled_tpot_ms": 1000.0 * sum(s for s, _ in spans) / pooled_den if pooled_den else None,
        "token_itl_ms": _ms(tok_itl),
        "chunk_itl_ms": _ms(chk_itl),
        "longest_stall_ms": 1000.0 * max(chk_itl) if chk_itl else None,
        "mean_tokens_per_chunk": total_tokens / total_chunks if total_chunks else None,
        "requests_without_done": sum(1 for r in ok if not r.saw_done),
        "response_timings": response_timings_figures([r.server_timings for r in ok if r.server_timings]),
        "conventions": {
            "token_itl": "a chunk of n tokens after gap g contributes g then n-1 zeros",
            "chunk_itl": "one gap per token-bearing chunk after the first (vllm bench serve's ITL)",
            "tpot": "(last token chunk - first token chunk) / (tokens - 1), per request",
            "throughput": "output tokens of successful requests / run wall time",
        },
    }


def speedup(candidate: EndpointSummary, baseline: EndpointSummary) -> Speedup:
    """Candidate vs baseline: throughput ratio (cand/base) and TPOT ratio (base/cand); >1 = faster."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b is not None and b > 0 else None

    return {
        "throughput_ratio": ratio(
            candidate.get("output_throughput_tok_s"), baseline.get("output_throughput_tok_s")
        ),
        "tpot_ratio": ratio(baseline.get("pooled_tpot_ms"), candidate.get("pooled_tpot_ms")),
        "ttft_p50_ratio": ratio(
            (baseline.get("ttft_ms") or {}).get("p50"), (candidate.get("ttft_ms") or {}).get("p50")
        ),
    }
