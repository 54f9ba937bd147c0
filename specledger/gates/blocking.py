"""Which of a setting's gates keep it from being deployed (:func:`blocking_gates`), and which of its outcomes a
rerun could flip because the figure lies within the SLO's margin of its limit (:func:`marginal_gates`,
:func:`marginally_blocked`)."""

from __future__ import annotations

from collections.abc import Sequence

from specledger.gates.candidates import Candidate, Gates
from specledger.gates.result import FAIL, GATES, NOT_ASSESSED
from specledger.gates.slo import SLO


def blocking_gates(gates: Gates, slo: SLO) -> list[str]:
    """The gates that fail (or, with ``require_assessed``, are not assessed), in :data:`GATES` order."""
    bad = {FAIL, NOT_ASSESSED} if slo.require_assessed else {FAIL}
    return [name for name in GATES if gates.get(name, {}).get("status", NOT_ASSESSED) in bad]


def marginal_gates(s: Candidate, names: Sequence[str]) -> list[str]:
    """'latency (TTFT P99)' for each gate in ``names`` whose outcome a rerun could flip."""
    out = []
    for name in names:
        checks = s["gates"].get(name, {}).get("marginal") or []
        if checks:
            out.append(f"{name} ({', '.join(checks)})")
    return out


def marginally_blocked(s: Candidate, slo: SLO) -> list[str]:
    """The blocking gates of ``s`` when every one of them fails only within the SLO's margin (else [])."""
    blocked = blocking_gates(s["gates"], slo)
    flips = marginal_gates(s, blocked)
    return flips if blocked and len(flips) == len(blocked) else []


def not_assessed(s: Candidate) -> list[str]:
    """The gates of ``s`` that are not assessed, in :data:`GATES` order."""
    return [n for n in GATES if s["gates"].get(n, {}).get("status") == NOT_ASSESSED]


__all__ = ["blocking_gates", "marginal_gates", "marginally_blocked", "not_assessed"]
