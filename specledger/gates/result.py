"""A gate's outcome: ``pass``, ``fail`` or ``not assessed`` (shown honestly, never guessed), with its evidence."""

from __future__ import annotations

from dataclasses import asdict, dataclass

PASS, FAIL, NOT_ASSESSED = "pass", "fail", "not assessed"
GATES = ("correctness", "quality", "latency", "capacity")


@dataclass(frozen=True)
class GateResult:
    name: str
    status: str  # PASS | FAIL | NOT_ASSESSED
    evidence: str
    #: the checks whose figure lies within ``SLO.margin`` of its limit and could flip the outcome on a rerun
    marginal: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["marginal"] = list(self.marginal)
        return d
