"""A gate's outcome: ``pass``, ``fail`` or ``not assessed`` (shown honestly, never guessed), with its evidence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

PASS, FAIL, NOT_ASSESSED = "pass", "fail", "not assessed"
GATES = ("correctness", "quality", "latency", "capacity")


class GateOutcome(TypedDict, total=False):
    """One gate's outcome as a dict (:meth:`GateResult.to_dict`; a hand-built one may leave keys out)."""

    name: str
    status: str  # PASS | FAIL | NOT_ASSESSED
    evidence: str
    marginal: list[str]  # the checks within the SLO's margin of their limit


@dataclass(frozen=True)
class GateResult:
    name: str
    status: str  # PASS | FAIL | NOT_ASSESSED
    evidence: str
    #: the checks whose figure lies within ``SLO.margin`` of its limit and could flip the outcome on a rerun
    marginal: tuple[str, ...] = ()

    def to_dict(self) -> GateOutcome:
        return {"name": self.name, "status": self.status, "evidence": self.evidence, "marginal": list(self.marginal)}
