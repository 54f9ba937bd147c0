"""The latency gate: TTFT P99, TPOT P50, chunk ITL P99 and the longest stall within the SLO at load 1;
at a load > 1 also TPOT P99, and token ITL P99 in place of chunk ITL."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import TypedDict

from specledger.engine.drafters.catalog import PLAIN, model_free_names
from specledger.gates.result import FAIL, NOT_ASSESSED, PASS, GateResult
from specledger.gates.slo import SLO
from specledger.records import RequestRecord

#: one sample's figures (:func:`specledger.analysis.stats.distribution`): n, mean, p50, p95, p99, max; None: no sample
Distribution = dict[str, float | int | None]


class LatencyFigures(TypedDict, total=False):
    """The latency figures a gate reads, in ms (:func:`specledger.analysis.metrics.latency_stats`; a simulated
    load gives only the ones it models)."""

    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_token_ms: Distribution  # per token (zero gaps inside a chunk count)
    itl_chunk_ms: Distribution  # per chunk: what a streaming client waits between updates
    longest_stall_ms: float | None
    ttft_pooled: int  # plain's TTFT taken over its whole same-prefill family: requests (:func:`pool_prefill_ttft`)


def _judge(checks: list[tuple[str, float | None, float]], margin: float = 0.0,
           plain: dict[str, float | None] | None = None) -> GateResult:
    """Pass iff every known (name, ms, limit) is within its limit; "not assessed" when none is known.
    A check is *marginal* when |ms − limit| ≤ margin · limit: its outcome is inside the machine's
    run-to-run drift (:attr:`SLO.margin`). The result's ``marginal`` names the checks whose drift could
    flip the gate: for a pass, every marginal check; for a fail, the checks over their limit when all of
    them are marginal (else none: it fails whatever the drift).

    ``plain``: plain decoding's figure per check at the same load. Where plain itself misses a limit, that
    limit is out of reach whatever runs, so speculation is judged on what it changes: the check's limit
    becomes plain's figure · (1 + margin) ("vs plain"), and the evidence says plain misses it too."""
    plain = plain or {}
    judged = []
    for n, v, lim in checks:
        p = plain.get(n)
        if v is not None and p is not None and p > lim:
            judged.append((n, v, p * (1 + margin), f" vs plain {p:.1f} (plain misses {lim:g} too)"))
        else:
            judged.append((n, v, lim, ""))
    known = [(n, v, lim, note) for n, v, lim, note in judged if v is not None]
    if not known:
        return GateResult("latency", NOT_ASSESSED, "no latency samples")
    over = [n for n, v, lim, _ in known if v > lim]
    close = tuple(n for n, v, lim, note in known if not note and abs(v - lim) <= margin * lim)
    flips = close if not over else tuple(over) if set(over) <= set(close) else ()
    parts = [(f"{n} {v:.1f}{note}" if note else f"{n} {v:.1f}{'>' if v > lim else '≤'}{lim:g} ms")
             + (" (marginal)" if n in close else "") + (" (worse than plain)" if note and v > lim else "")
             for n, v, lim, note in known]
    return GateResult("latency", FAIL if over else PASS, ", ".join(parts), flips)


def _figures(latency: LatencyFigures, load_point: bool) -> list[tuple[str, float | None]]:
    """(check name, ms) of a latency dict (:func:`specledger.analysis.metrics.latency_stats`)."""
    out = [("TTFT P99", latency["ttft_ms"]["p99"]), ("TPOT P50", latency["tpot_ms"]["p50"])]
    if load_point:
        out += [("TPOT P99", latency["tpot_ms"]["p99"]), ("token-ITL P99", latency["itl_token_ms"]["p99"])]
    else:
        out += [("ITL P99", latency["itl_chunk_ms"]["p99"])]
    return out + [("stall", latency["longest_stall_ms"])]


def _limits(slo: SLO) -> dict[str, float]:
    return {"TTFT P99": slo.ttft_p99_ms, "TPOT P50": slo.tpot_p50_ms, "TPOT P99": slo.tpot_p99_ms,
            "ITL P99": slo.itl_p99_ms, "token-ITL P99": slo.itl_p99_ms, "stall": slo.stall_ms}


def _gate(latency: LatencyFigures, slo: SLO, plain: LatencyFigures | None, load_point: bool,
          same_prefill: bool = False) -> GateResult:
    """``same_prefill``: the setting prefills exactly as plain does (:data:`SAME_PREFILL_DRAFTERS`), so its TTFT
    is plain's prefill plus the machine's noise. It is judged on plain's figure where plain misses the TTFT limit
    (out of reach either way), and always where ``plain`` carries ``ttft_pooled`` (:func:`pool_prefill_ttft`:
    plain's TTFT is then the whole same-prefill family's, over every prompt any of them ran), never on a few
    samples of that noise."""
    lim = _limits(slo)
    base = dict(_figures(plain, load_point)) if plain else None
    figures = _figures(latency, load_point)
    if same_prefill and base and base.get("TTFT P99") is not None and (
            base["TTFT P99"] > lim["TTFT P99"] or plain.get("ttft_pooled")):
        figures = [(n, base[n] if n == "TTFT P99" else v) for n, v in figures]
    return _judge([(n, v, lim[n]) for n, v in figures], slo.margin, base)


def latency_gate(latency: LatencyFigures, slo: SLO = SLO(), plain: LatencyFigures | None = None,
                 drafter: str | None = None) -> GateResult:
    """TTFT P99, TPOT P50, chunk ITL P99 and longest stall (ms) against the SLO; where ``plain`` (plain
    decoding's latency dict at the same load) misses a limit too, against plain's figure (:func:`_judge`)."""
    return _gate(latency, slo, plain, False, drafter is not None and drafter in SAME_PREFILL_DRAFTERS)


def load_latency_gate(latency: LatencyFigures, slo: SLO = SLO(), plain: LatencyFigures | None = None,
                      drafter: str | None = None) -> GateResult:
    """At a load > 1: TTFT P99, TPOT P50 and P99, token-ITL P99 and the longest stall (ms) against the SLO
    (against plain's figure where plain misses a limit too)."""
    return _gate(latency, slo, plain, True, False)  # batched with others, a request's TTFT is not its own


#: drafters whose requests prefill exactly as plain decoding does (no draft model or draft KV to fill)
SAME_PREFILL_DRAFTERS = frozenset({PLAIN.name, *model_free_names()})


def pool_prefill_ttft(plain: LatencyFigures, records: Sequence[RequestRecord]) -> LatencyFigures:
    """Plain's load-1 latency dict with its TTFT distribution taken over every request of ``records`` (one
    category and temperature) whose drafter prefills as plain does (:data:`SAME_PREFILL_DRAFTERS`), marked
    ``ttft_pooled``. Their first token is plain's first token after plain's prefill, so each of them is a sample
    of plain's TTFT on its prompt: pooled, plain's TTFT P99 covers the prompts a race ran without plain too,
    and it is one figure for the whole family (what speculation does not change, it cannot decide)."""
    from specledger.analysis.metrics import MS
    from specledger.analysis.stats import distribution

    ttft = [r.ttft for r in records if (r.drafter or PLAIN.name) in SAME_PREFILL_DRAFTERS and r.ttft and r.ttft > 0]
    if not ttft or not plain:
        return plain
    return {**plain, "ttft_ms": distribution(ttft, MS), "ttft_pooled": len(ttft)}


def ttft_drift(records: Sequence[RequestRecord], quantile: float = 0.9) -> float | None:
    """The run's own TTFT drift: the ``quantile`` of |TTFT / median − 1| over every prompt decoded by
    several settings whose prefill is the same forward (:data:`SAME_PREFILL_DRAFTERS`, same temperature).
    What differs between them is the machine, so this is how far a latency figure moves on a rerun.
    None when no prompt was decoded three times or more."""
    by_prompt: dict[tuple[str, float], list[float]] = defaultdict(list)
    for r in records:
        if (r.drafter or PLAIN.name) in SAME_PREFILL_DRAFTERS and r.ttft and r.ttft > 0:
            by_prompt[(r.prompt_id, float(r.temperature))].append(r.ttft)
    dev = []
    for times in by_prompt.values():
        if len(times) >= 3:
            m = statistics.median(times)
            dev += [abs(t / m - 1.0) for t in times]
    if not dev:
        return None
    dev.sort()
    return dev[min(int(quantile * len(dev)), len(dev) - 1)]


def with_measured_margin(slo: SLO, records: Sequence[RequestRecord]) -> SLO:
    """``slo`` with ``margin`` raised to the run's measured TTFT drift (:func:`ttft_drift`) when larger:
    a gate outcome inside what this machine moves by on a rerun is marginal."""
    drift = ttft_drift(records)
    return replace(slo, margin=drift) if drift is not None and drift > slo.margin else slo
