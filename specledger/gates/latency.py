"""The latency gate: TTFT P99, TPOT P50, chunk ITL P99 and the longest stall within the SLO at load 1;
at a load > 1 also TPOT P99, and token ITL P99 in place of chunk ITL."""

from __future__ import annotations

from typing import Any

from specledger.gates.result import FAIL, NOT_ASSESSED, PASS, GateResult
from specledger.gates.slo import SLO


def _judge(checks: list[tuple[str, float | None, float]]) -> GateResult:
    """Pass iff every known (name, ms, limit) is within its limit; "not assessed" when none is known."""
    known = [(n, v, lim) for n, v, lim in checks if v is not None]
    if not known:
        return GateResult("latency", NOT_ASSESSED, "no latency samples")
    over = [n for n, v, lim in known if v > lim]
    parts = [f"{n} {v:.1f}{'>' if v > lim else '≤'}{lim:g} ms" for n, v, lim in known]
    return GateResult("latency", FAIL if over else PASS, ", ".join(parts))


def latency_gate(latency: dict[str, Any], slo: SLO = SLO()) -> GateResult:
    """TTFT P99, TPOT P50, chunk ITL P99 and longest stall (ms) against the SLO."""
    return _judge([
        ("TTFT P99", latency["ttft_ms"]["p99"], slo.ttft_p99_ms),
        ("TPOT P50", latency["tpot_ms"]["p50"], slo.tpot_p50_ms),
        ("ITL P99", latency["itl_chunk_ms"]["p99"], slo.itl_p99_ms),
        ("stall", latency["longest_stall_ms"], slo.stall_ms),
    ])


def load_latency_gate(latency: dict[str, Any], slo: SLO = SLO()) -> GateResult:
    """At a load > 1: TTFT P99, TPOT P50 and P99, token-ITL P99 and the longest stall (ms) against the SLO."""
    return _judge([
        ("TTFT P99", latency["ttft_ms"]["p99"], slo.ttft_p99_ms),
        ("TPOT P50", latency["tpot_ms"]["p50"], slo.tpot_p50_ms),
        ("TPOT P99", latency["tpot_ms"]["p99"], slo.tpot_p99_ms),
        ("token-ITL P99", latency["itl_token_ms"]["p99"], slo.itl_p99_ms),
        ("stall", latency["longest_stall_ms"], slo.stall_ms),
    ])
