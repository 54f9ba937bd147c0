"""The verdict at loads > 1: the load points' scenarios, gates and decisions per (category, temperature, load).

Input: the records of ``specledger run --loads`` (``extra.experiment == "load"``,
:mod:`specledger.mainjob.measured_loads`). Per load, each speculative setting is paired with plain decoding at
the same load on the same prompts (:func:`~specledger.analysis.run.analyze_scenario`: speed-up =
paired per-prompt tokens/s of the request under that load, with the decisions' interval), then:

- correctness and quality as at load 1 (greedy token identity with plain at the same load; task score);
- latency: :func:`specledger.gates.latency.load_latency_gate` (TTFT P99, TPOT P50/P99, token-ITL P99, stall);
- capacity: :func:`specledger.gates.capacity.load_capacity_gate` (goodput vs plain's, KV capacity vs the
  load, CPU-seconds per 1k committed tokens).

The decisions come from :func:`specledger.gates.verdicts.verdicts`, each entry labelled with its ``load``
and ``simulated: false``. :func:`decision_keys` reads them as what the load bisection
(:mod:`specledger.load_bisect`) compares between adjacent loads.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any, TypedDict

from specledger.analysis.run import analyze_baseline, analyze_scenario
from specledger.analysis.scenario import baseline_key, group_scenarios
from specledger.gates.candidates import Candidate
from specledger.gates.capacity import load_capacity_gate
from specledger.gates.correctness import correctness_gate
from specledger.gates.decision import Verdict, VerdictDict, as_verdict
from specledger.gates.latency import load_latency_gate
from specledger.gates.quality import quality_gate
from specledger.gates.result import GATES, GateResult
from specledger.gates.slo import SLO
from specledger.gates.verdicts import decide
from specledger.records import RequestRecord, load_records


class LoadsAnalysis(TypedDict):
    """The load points of a run: what :func:`analyze_loads` returns."""

    loads: list[int]  # the measured loads > 1, ascending
    scenarios: list[Candidate]  # every speculative setting at every load, with its gates
    baselines: list[dict[str, object]]  # plain decoding at every load (analysis.run.analyze_baseline)
    verdicts: list[VerdictDict]  # the decisions, each with ``load`` and ``simulated: false``


def analyze_loads(
    records: Sequence[RequestRecord],
    meta: dict[str, Any] | None = None,
    slo: SLO = SLO(),
    controls: dict[tuple[str, float], float] | None = None,
) -> LoadsAnalysis:
    """The loads, scenarios, baselines and verdicts of the load points among ``records`` (other records are
    ignored)."""
    meta = meta or {}
    by_load: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in load_records(records):
        by_load[int(r.extra["load"])].append(r)
    scenarios: list[Candidate] = []
    baselines: list[dict[str, object]] = []
    decided: list[VerdictDict] = []
    for load in sorted(by_load):
        groups = group_scenarios(by_load[load])
        at_load: list[Candidate] = []
        plain_latency: dict[tuple[str, float], GateResult] = {}
        plain_figures: dict[tuple[str, float], Any] = {}
        for key, recs in groups.items():  # plain first: every setting's latency is read against it
            if key.is_baseline:
                b = {**analyze_baseline(key, recs), "load": load}
                plain_latency[key.group] = load_latency_gate(b["latency"], slo)
                plain_figures[key.group] = b["latency"]
                b["latency_gate"] = plain_latency[key.group].to_dict()
                baselines.append(b)
        for key, recs in groups.items():
            if key.is_baseline:
                continue
            base = groups.get(baseline_key(key), [])
            s = analyze_scenario(key, recs, base, alpha=slo.decision_alpha)
            gamma = key.gamma if isinstance(key.gamma, int) else 0
            gates = {
                "correctness": correctness_gate(recs, base, float(key.temperature), slo),
                "quality": quality_gate(recs, base, slo.quality_tolerance),
                "latency": load_latency_gate(s["latency"], slo, plain_figures.get(baseline_key(key).group)),
                "capacity": load_capacity_gate(recs, base, gamma, load, meta, slo),
            }
            s["gates"] = {name: gates[name].to_dict() for name in GATES}
            s["load"] = load
            s["label"] = f"{s['label']} @ load {load}"
            at_load.append(s)
        scenarios += at_load
        for v in decide(at_load, slo, controls, plain_latency, load):
            v.load, v.simulated = load, False
            decided.append(v.to_dict())
    return {"loads": sorted(by_load), "scenarios": scenarios, "baselines": baselines, "verdicts": decided}


def decision_label(v: Verdict | VerdictDict) -> str:
    """What a verdict decided, as the load bisection compares it: the setting where it deploys ("ngram γ=2"),
    "off" where speculation is decisively off, "open" otherwise (open, no decision)."""
    v = as_verdict(v)
    if v.deploys:
        return f"{v.drafter} γ={v.gamma}"
    return "off" if v.is_off else "open"


def decision_keys(verdicts: Sequence[Verdict | VerdictDict]) -> dict[int, Hashable]:
    """``{load: key}`` of the measured verdicts (simulated ones and controls left out): per (category,
    temperature), the :func:`decision_label` and whether the speed-up it reports (the chosen setting's, or the
    leading one's) is above 1. Two loads with equal keys decided alike everywhere; a change of decision or of
    S against 1 in any category makes them differ."""
    by_load: dict[int, list[tuple[str, float, str, bool | None]]] = defaultdict(list)
    for v in map(as_verdict, verdicts):
        if v.simulated or v.is_control:
            continue
        s = v.speedup
        pays = None if not isinstance(s, (int, float)) else bool(s > 1.0)
        by_load[v.load_or_solo].append((v.category, float(v.temperature or 0.0), decision_label(v), pays))
    return {load: tuple(sorted(rows, key=str)) for load, rows in by_load.items()}
