"""The decision per (category, temperature) at one load: which setting to deploy, or off -- resolved or open.

Contenders are compared *paired*, on the prompts both ran (:mod:`specledger.analysis.paired`: the ratio
of their speed-ups, the ratio estimator's ``1 − slo.decision_alpha`` confidence sequence, which holds at every
look of a race at once: :mod:`specledger.analysis.sequential`).
A decision is **resolved** when

- *winner*: the leader (highest S among the settings that pass every gate) pays (its S interval lies
  above ``slo.min_ci_low``) and is faster than every other contender, or equivalent to it;
- *equivalent*: the leader and some others are equivalent within ``slo.equivalence_margin`` (TOST):
  the rule picks among them (the cheaper in memory: model-free before shared-weight, int8 and
  separate-model drafters, then the smaller γ);
- *off*: speculation is decisively off -- no setting's S interval reaches above 1 (slower, or within
  the margin of plain: no practical gain), or every faster setting fails a gate;

otherwise it is **open**, names the comparison that is, and how many prompts would settle it.
A category whose requests ran too few speculative rounds to measure anything gets ``no-decision``.
Controls (random tokens) are reported, never deployed.

Scenario dicts carry ``per_prompt`` (:func:`specledger.analysis.run.analyze_scenario`); without it
(simulated loads, hand-built dicts) the given ``speedup_ci`` is used and settings compare by
non-overlapping intervals only (no equivalence).

The rule's parts: the paired tests (:mod:`.paired_tests`), the gates that block (:mod:`.blocking`), which ending
applies (:mod:`.resolution`), each ending's causes in words (:mod:`.causes`), the settings' names, order and
thresholds (:mod:`.verdict_rules`); the verdict as a type (:mod:`.decision`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from specledger.analysis.paired import RatioInterval
from specledger.gates.blocking import blocking_gates
from specledger.gates.candidates import Candidate
from specledger.gates.causes import (
    add_caveats,
    comparison,
    control_verdict,
    deploy_verdict,
    no_data_verdict,
    off_by_gates,
    off_verdict,
    open_on_gates,
    open_verdict,
    out_of_reach,
)
from specledger.gates.decision import DEPLOY, OFF, DecisionGroup, Verdict, VerdictDict
from specledger.gates.paired_tests import (
    MIN_EQUIVALENCE_PROMPTS,
    PairedIntervals,
    compare_settings,
    interval_vs_plain,
    prompts_to_settle,
)
from specledger.gates.resolution import Ending, resolve
from specledger.gates.result import GateResult
from specledger.gates.slo import SLO
from specledger.gates.verdict_rules import (
    CONTROL_CATEGORIES,
    DRAFTER_MEMORY_RANK,
    MIN_ROUNDS_PER_REQUEST,
    MIN_TOKENS_PER_REQUEST,
    control_repetition,
    memory_key,
    prompts_to_separate,
    repeated_ngram_fraction,
    setting_name,
    too_thin,
)
from specledger.workloads.context_buckets import split_key

#: S of one setting against plain, 1 − α: (scenario, alpha) -> interval
VsPlain = Callable[[Candidate, float], RatioInterval]
#: S_a / S_b, paired: (a, b, a's interval vs plain, b's, alpha) -> interval
Compare = Callable[[Candidate, Candidate, RatioInterval, RatioInterval, float], RatioInterval]


def _worded(group: DecisionGroup, ending: Ending, eligible: Sequence[Candidate], iv: PairedIntervals,
            slo: SLO) -> Verdict:
    """The verdict of ``ending`` in words (:mod:`specledger.gates.causes`)."""
    others = [x for x in eligible if x is not ending.focus]
    if ending.kind == DEPLOY:
        return deploy_verdict(group, ending.focus, others, iv, slo)
    if ending.kind == OFF:
        return off_verdict(group, ending.leader, iv.plain(ending.leader), slo)
    return open_verdict(group, ending.focus, others, iv, slo, pays=ending.pays, leader=ending.provisional,
                        unproven=ending.unproven)


def decide_group(items: Sequence[Candidate], slo: SLO, group: DecisionGroup, vs_plain: VsPlain | None = None,
                 compare: Compare | None = None) -> Verdict:
    """The decision of one (category, temperature) from its scenarios: indifference-zone selection
    (:func:`specledger.gates.resolution.resolve`) among the settings that pass every gate, put in words
    (:mod:`specledger.gates.causes`). ``vs_plain(s, alpha)`` and ``compare(a, b, ia, ib, alpha)`` give the paired
    intervals (default: from each scenario's ``per_prompt``); the traffic mix (:mod:`specledger.gates.mix`) passes
    its stratified ones, so the mix is decided by this same rule."""
    alpha, margin = slo.decision_alpha, slo.equivalence_margin
    measured = [s for s in items if s.get("speedup") is not None and math.isfinite(float(s["speedup"]))]
    if not measured:
        return no_data_verdict(group, "no speculative setting was measured against plain decoding on the same prompts")
    if (thin := too_thin(measured)) is not None:
        return no_data_verdict(group, thin)
    vs_plain, compare = vs_plain or interval_vs_plain, compare or compare_settings
    ivs = {id(s): vs_plain(s, alpha) for s in measured}
    eligible = [s for s in measured if not blocking_gates(s["gates"], slo)]
    if not eligible:
        fastest = max(measured, key=lambda s: s["speedup"])
        return off_by_gates(group, fastest, measured, PairedIntervals(ivs, {}), slo)
    iv = PairedIntervals(ivs, {(id(x), id(y)): compare(x, y, ivs[id(x)], ivs[id(y)], alpha)
                               for x in eligible for y in eligible if x is not y})
    ending = resolve(measured, eligible, iv, slo)
    verdict = _worded(group, ending, eligible, iv, slo)
    verdict.comparisons = [comparison(ending.leader, x, iv.ratio(ending.leader, x), margin)
                           for x in eligible if x is not ending.leader]
    if ending.hinge:
        open_on_gates(verdict, ending.leader, ending.hinge, slo)
    picked = next((x for x in eligible if verdict.setting == setting_name(x)), None)
    if verdict.deploys and picked is not None:
        add_caveats(verdict, picked, slo)
    return verdict


def decide(
    scenarios: Sequence[Candidate],
    slo: SLO = SLO(),
    controls: Mapping[tuple[str, float], float] | None = None,
    plain_latency: Mapping[tuple[str, float], GateResult] | None = None,
    load: int = 1,
) -> list[Verdict]:
    """One decision per (category, temperature) from scenario dicts carrying ``gates`` (as dicts) and,
    for paired decisions, ``per_prompt`` (see the module doc). ``plain_latency``: plain decoding's latency
    gate per (category, temperature) at this ``load``; where it fails, the entry says the SLO is out of
    reach at this load whatever runs (``slo_out_of_reach``)."""
    controls, plain_latency = controls or {}, plain_latency or {}
    groups: dict[tuple[str, float], list[Candidate]] = defaultdict(list)
    for s in scenarios:
        groups[(s["category"], s["temperature"])].append(s)
    out = []
    for (cat, temp), items in groups.items():
        group = DecisionGroup(cat, temp, out_of_reach(plain_latency.get((cat, float(temp))), load),
                              split_key(cat)[1])  # decided per context bucket (mainjob/buckets.py)
        if cat in CONTROL_CATEGORIES:
            measured = [s for s in items if s.get("speedup") is not None]
            out.append(control_verdict(group, measured, controls.get((cat, float(temp)))))
            continue
        verdict = decide_group(items, slo, group)
        if verdict.slo_out_of_reach:
            verdict.reason += f" {verdict.slo_out_of_reach}."
        out.append(verdict)
    return out


def verdicts(
    scenarios: Sequence[Candidate],
    slo: SLO = SLO(),
    controls: Mapping[tuple[str, float], float] | None = None,
    plain_latency: Mapping[tuple[str, float], GateResult] | None = None,
    load: int = 1,
) -> list[VerdictDict]:
    """:func:`decide`'s verdicts as dicts (``summary.json``'s form)."""
    return [v.to_dict() for v in decide(scenarios, slo, controls, plain_latency, load)]


__all__ = ["CONTROL_CATEGORIES", "DRAFTER_MEMORY_RANK", "MIN_EQUIVALENCE_PROMPTS", "MIN_ROUNDS_PER_REQUEST",
           "MIN_TOKENS_PER_REQUEST", "control_repetition", "decide", "decide_group", "memory_key",
           "out_of_reach", "prompts_to_separate", "prompts_to_settle", "repeated_ngram_fraction", "setting_name",
           "verdicts"]
