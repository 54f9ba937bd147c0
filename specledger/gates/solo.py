"""The decisions at load 1 (the main job decodes one request at a time): gates then verdicts, one path
shared by the summary and by the main job's racing (which asks after every batch of prompts which
decisions are still open, without building the whole summary)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specledger.analysis.scenario import ScenarioKey, baseline_key, group_scenarios
from specledger.gates.candidates import Baseline, Candidate
from specledger.gates.decision import VerdictDict
from specledger.gates.evaluate import evaluate_gates
from specledger.gates.latency import LatencyFigures, latency_gate, pool_prefill_ttft
from specledger.gates.result import GATES, GateResult
from specledger.gates.slo import SLO
from specledger.gates.verdicts import control_repetition, verdicts
from specledger.records import RequestRecord, main_records


def plain_latency_figures(baselines: Sequence[Baseline]) -> dict[tuple[str, float], LatencyFigures]:
    """Plain decoding's latency dict per (category, temperature) from analysed baselines."""
    return {(b["category"], float(b["temperature"])): b["latency"] for b in baselines if b.get("latency")}


def gate_scenarios(scenarios: Sequence[Candidate], groups: Mapping[ScenarioKey, list[RequestRecord]],
                   baselines: Sequence[Baseline], slo: SLO) -> dict[tuple[str, float], GateResult]:
    """Adds ``gates`` (as dicts) to every analysed load-1 scenario, each latency limit that plain decoding
    misses too judged against plain's figure; returns plain's own latency gate per (category, temperature).
    Plain's TTFT is pooled over its whole same-prefill family (:func:`~specledger.gates.latency.pool_prefill_ttft`)."""
    plain = plain_latency_figures(baselines)
    family: dict[tuple[str, float], list[RequestRecord]] = {}
    for k, rs in groups.items():
        family.setdefault(k.group, []).extend(rs)
    plain = {g: pool_prefill_ttft(v, family.get(g, [])) for g, v in plain.items()}
    by_label = {k.label: k for k in groups}
    for s in scenarios:
        key = by_label[s["label"]]
        gates = evaluate_gates(s, groups[key], groups.get(baseline_key(key), []), slo, plain.get(key.group))
        s["gates"] = {name: gates[name].to_dict() for name in GATES}
    return {k: latency_gate(v, slo) for k, v in plain.items()}


def solo_decisions(records: Sequence[RequestRecord], slo: SLO = SLO(), load: int = 1) -> list[VerdictDict]:
    """The verdicts of the main job's records as they stand (no forecasts, no load points): what racing
    reads to know which categories are open and which settings are out."""
    from specledger.analysis.run import analyze_baseline, analyze_scenario

    records = main_records(records)
    groups = group_scenarios(records)
    baselines = [analyze_baseline(k, rs) for k, rs in groups.items() if k.is_baseline]
    scenarios = [analyze_scenario(k, rs, groups.get(baseline_key(k), []), alpha=slo.decision_alpha)
                 for k, rs in groups.items() if not k.is_baseline]
    plain_gates = gate_scenarios(scenarios, groups, baselines, slo)
    return verdicts(scenarios, slo, control_repetition(records), plain_gates, load)


__all__ = ["gate_scenarios", "plain_latency_figures", "solo_decisions"]
