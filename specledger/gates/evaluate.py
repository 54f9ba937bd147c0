"""All four gates of one scenario at load 1 (the main job decodes one request at a time); the load
points' gates are :mod:`specledger.gates.load_verdicts`'."""

from __future__ import annotations

from collections.abc import Sequence

from specledger.gates.candidates import Candidate
from specledger.gates.capacity import capacity_gate
from specledger.gates.correctness import correctness_gate
from specledger.gates.latency import LatencyFigures, latency_gate
from specledger.gates.quality import quality_gate
from specledger.gates.result import GateResult
from specledger.gates.slo import SLO
from specledger.records import RequestRecord


def evaluate_gates(
    scenario: Candidate, spec: Sequence[RequestRecord], base: Sequence[RequestRecord], slo: SLO = SLO(),
    plain_latency: LatencyFigures | None = None,
) -> dict[str, GateResult]:
    """All four gates of one scenario (``scenario`` is an :func:`~specledger.analysis.analyze_scenario` dict);
    ``plain_latency``: plain decoding's latency dict on the same prompts, against which a latency limit that
    plain misses too is judged (:func:`specledger.gates.latency.latency_gate`)."""
    return {
        "correctness": correctness_gate(spec, base, float(scenario["temperature"]), slo),
        "quality": quality_gate(spec, base, slo.quality_tolerance),
        "latency": latency_gate(scenario["latency"], slo, plain_latency, scenario.get("drafter")),
        "capacity": capacity_gate(
            scenario.get("paired_tokens_per_s"),
            scenario.get("baseline_tokens_per_s"),
            scenario.get("memory_bytes"),
            slo,
        ),
    }
