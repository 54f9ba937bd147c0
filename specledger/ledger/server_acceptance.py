"""What a server's spec-decode figures say about acceptance, and what a measurement from outside
the server cannot say.

The per-position rates a server exposes are unconditional, r_i = Pr(K >= i); the ledger's
conditional chain is a_i = r_i / r_{i-1} (r_0 = 1) and the expected tokens per round, bonus token
counted, is E[L] = 1 + sum_i r_i (:mod:`specledger.ledger.acceptance`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from specledger.errors import SpecLedgerError
from specledger.ledger.acceptance import conditional_from_survival, expected_length_from_chain

NO_ROUNDS_NOTE = (
    "measured from outside the server: no per-round ledger (E[L] per request, round times, reconciliation "
    "are n/a); acceptance figures come from the server's /metrics counters, which are server-wide"
)
VLLM_BENCH_NOTE = "vllm bench serve reports aggregates only: no per-request rounds, so no round-level ledger"


class AcceptanceLedgerDict(TypedDict):
    """A server's per-position rates read as the ledger reads acceptance (:func:`acceptance_ledger`); E[L] in
    tokens per round, the bonus token counted."""

    gamma: int | None  # positions the server reported; None without rates
    per_position_rates: list[float]  # Pr(K >= i), i = 1..gamma
    conditional_a: list[float]  # a_i = Pr(K >= i) / Pr(K >= i - 1)
    el_from_per_position: float | None  # 1 + sum of the rates
    el_reported: float | None  # the server's mean acceptance length (1 + accepted / drafts)
    mean_accepted_per_draft: float | None
    error: str | None  # why the rates could not be read, else None


def per_position_mismatch(
    mean_length: float | None, rates: Sequence[float], tolerance: float = 1e-3
) -> str | None:
    """The consistency check every server figure must pass: 1 + Σ_i Pr(K ≥ i) = 1 + accepted / drafts
    (each accepted token sits at exactly one position). A message when they differ by more than
    ``tolerance`` (counters: half a token per draft round; a saved file: rounding), else None.
    Figures that are not finite floats (NaN, ±inf, an integer past the float range, a sum of rates that
    overflows) cannot be checked: None, as for absent ones."""
    mean_length = _finite(mean_length)
    values = [_finite(r) for r in rates]
    if mean_length is None or not values or any(v is None for v in values):
        return None
    try:
        from_positions = 1.0 + math.fsum(values)
    except OverflowError:  # partial sums past the float range (rates near 1e308)
        return None
    if not math.isfinite(from_positions) or abs(from_positions - mean_length) <= tolerance:
        return None
    return (
        f"inconsistent spec-decode figures: 1 + Σ per-position rates = {from_positions:.4f} but "
        f"1 + accepted/drafts = {mean_length:.4f} (positions missing, or a data-parallel deployment "
        "undercounting); the per-position rates are not the whole acceptance"
    )


def _finite(value: Any) -> float | None:
    """``value`` as a finite float; None for a bool, a non-number, NaN, ±inf or an int past the float range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def acceptance_ledger(spec: Mapping[str, Any] | None) -> AcceptanceLedgerDict:
    """Per-position rates Pr(K ≥ i) -> conditional a_i and E[L] = 1 + Σ Pr(K ≥ i) (bonus token counted),
    next to the reported mean acceptance length (1 + accepted/drafts). Every figure None (no rates)
    without spec-decode figures."""
    spec = spec or {}
    numbers = [r for r in spec.get("per_position_rates") or [] if isinstance(r, (int, float))
               and not isinstance(r, bool)]
    rates = [v for v in map(_finite, numbers) if v is not None]
    reported = spec.get("mean_acceptance_length")
    reported = _finite(reported) if reported is not None else None
    out: AcceptanceLedgerDict = {
        "gamma": len(rates) or None,
        "per_position_rates": rates,
        "conditional_a": [],
        "el_from_per_position": None,
        "el_reported": reported,
        "mean_accepted_per_draft": reported - 1.0 if reported is not None else None,
        "error": None,
    }
    if len(rates) < len(numbers):
        out["error"] = "a per-position rate is not a finite number (NaN, ±inf or past the float range)"
    elif rates:
        try:
            chain = conditional_from_survival(rates)
            out["conditional_a"] = chain
            out["el_from_per_position"] = expected_length_from_chain(chain)
        except SpecLedgerError as exc:
            out["error"] = str(exc)
    return out


__all__ = ["NO_ROUNDS_NOTE", "VLLM_BENCH_NOTE", "AcceptanceLedgerDict", "acceptance_ledger", "per_position_mismatch"]
