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
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specledger.analysis.paired import PerPrompt, RatioInterval, setting_ratio, speedup_interval
from specledger.gates.result import GATES, NOT_ASSESSED, GateResult
from specledger.gates.slo import SLO
from specledger.gates.verdict_entries import (
    _comparison,
    _control,
    _entry,
    _off_gates,
    _open,
    _resolved_deploy,
    _resolved_off,
    out_of_reach,
)
from specledger.gates.verdict_rules import (
    CONTROL_CATEGORIES,
    DRAFTER_MEMORY_RANK,
    MIN_EQUIVALENCE_PROMPTS,
    MIN_ROUNDS_PER_REQUEST,
    MIN_TOKENS_PER_REQUEST,
    _blocking,
    _marginal,
    _marginally_blocked,
    _pays,
    _proven_to_pay,
    _too_thin,
    _within_margin,
    control_repetition,
    memory_key,
    prompts_to_separate,
    prompts_to_settle,
    repeated_ngram_fraction,
    setting_name,
)
from specledger.workloads.context_buckets import split_key


def _interval_vs_plain(s: Mapping[str, Any], alpha: float) -> RatioInterval:
    """S with its 1 − α interval: from the paired per-prompt totals when the scenario has them, else the
    scenario's own ``speedup_ci`` as given."""
    pp = s.get("per_prompt")
    if pp and pp.get("prompts"):
        spec = PerPrompt.from_dict(pp)
        base = PerPrompt.from_dict({"prompts": pp["prompts"], "tokens": pp.get("base_tokens"),
                                    "seconds": pp.get("base_seconds")})
        iv = speedup_interval(spec, base, alpha)
        if math.isfinite(iv.ratio):
            return RatioInterval(float(s["speedup"]), iv.lo, iv.hi, iv.n)
    lo, hi = s.get("speedup_ci") or (None, None)
    n = int(s.get("paired_prompts") or 0)
    ok = lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
    return RatioInterval(float(s["speedup"]), lo if ok else -math.inf, hi if ok else math.inf, n)


def _compare(a: Mapping[str, Any], b: Mapping[str, Any], ia: RatioInterval, ib: RatioInterval,
             alpha: float) -> RatioInterval:
    """S_a / S_b paired on the prompts both ran; without per-prompt totals, the ratio of the points with an
    interval only when the two intervals do not overlap (then it excludes 1), else unbounded."""
    pa, pb = a.get("per_prompt"), b.get("per_prompt")
    if pa and pb and pa.get("prompts") and pb.get("prompts"):  # on every prompt both ran, plain or not
        return setting_ratio(PerPrompt.from_dict(pa.get("own") or pa), PerPrompt.from_dict(pb.get("own") or pb),
                             alpha)
    ratio = ia.ratio / ib.ratio if ib.ratio else math.nan
    if ia.lo > ib.hi and ib.hi > 0:
        return RatioInterval(ratio, ia.lo / ib.hi, math.inf, min(ia.n, ib.n))
    if ia.hi < ib.lo and ib.lo > 0:
        return RatioInterval(ratio, 0.0, ia.hi / ib.lo, min(ia.n, ib.n))
    return RatioInterval(ratio, -math.inf, math.inf, min(ia.n, ib.n))


def decide_group(items: Sequence[dict[str, Any]], slo: SLO, base: dict[str, Any],
                 vs_plain: Callable[[Mapping[str, Any], float], RatioInterval] | None = None,
                 compare: Callable[..., RatioInterval] | None = None) -> dict[str, Any]:
    """The decision of one (category, temperature) from its scenarios: indifference-zone selection.
    ``vs_plain(s, alpha)`` and ``compare(a, b, ia, ib, alpha)`` give the paired intervals (default: from each
    scenario's ``per_prompt``); the traffic mix (:mod:`specledger.gates.mix`) passes its stratified ones, so
    the mix is decided by this same rule.

    A setting is *safe* when no other eligible setting can be more than the margin m faster: for every other b
    the lower bound of S_s / S_b exceeds 1/(1+m), paired, or, through plain, hi(S_b) / lo(S_s) < 1 + m. The
    decision is resolved when some
    setting pays and some safe setting is faster than plain (the rule picks among the safe ones faster than
    plain: all are within m of the best), or when no eligible
    setting can be more than m faster than plain (off). Otherwise it is open, with the leader and every
    setting that could still beat it by more than m as the contenders (the race runs those)."""
    alpha, margin = slo.decision_alpha, slo.equivalence_margin
    measured = [s for s in items if s.get("speedup") is not None and math.isfinite(float(s["speedup"]))]
    if not measured:
        return {**_entry(base, None, None, "no-decision"), "resolution": "no-data", "resolved": False,
                "headline": "no speculative setting was measured against plain decoding on the same prompts",
                "reason": "No decision: no speculative setting was measured against plain decoding on the same "
                          "prompts."}
    if (thin := _too_thin(measured)) is not None:
        return {**_entry(base, None, None, "no-decision"), "resolution": "no-data", "resolved": False,
                "headline": thin, "reason": f"No decision: {thin}."}
    vs_plain, compare = vs_plain or _interval_vs_plain, compare or _compare
    ivs = {id(s): vs_plain(s, alpha) for s in measured}
    eligible = [s for s in measured if not _blocking(s["gates"], slo)]
    fastest = max(measured, key=lambda s: s["speedup"])
    if not eligible:
        return _off_gates(base, fastest, ivs[id(fastest)], measured, ivs, slo)
    pair = {(id(x), id(y)): compare(x, y, ivs[id(x)], ivs[id(y)], alpha)
            for x in eligible for y in eligible if x is not y}

    def safe(x: dict[str, Any]) -> bool:
        return all(_within_margin(x, y, ivs, pair, margin) for y in eligible if y is not x)

    def beaten_by_more_than_margin(x: dict[str, Any], y: dict[str, Any]) -> bool:
        """``y`` is proven more than the margin faster than ``x``: hi(S_x / S_y) < 1/(1+m). Only such an ``x``
        is passed over: one merely slower, but possibly within the margin, keeps the decision open, so two runs
        do not pass it over in one and pick it in the other."""
        return pair[(id(x), id(y))].hi < 1.0 / (1.0 + margin)

    paying = [x for x in eligible if _pays(ivs[id(x)], slo) == "pays"]
    leader = max(paying or eligible, key=lambda x: x["speedup"])  # a faster point that may not pay contends
    hinge = [x for x in measured if x not in eligible and x["speedup"] > leader["speedup"]
             and _marginally_blocked(x, slo) and _pays(ivs[id(x)], slo) != "slower"]
    # The target is reproducible: the rule's first setting (cheaper in memory, then smaller γ) among those within
    # the margin of the best. Walk the settings faster than plain in the rule's order: the first one that is safe
    # (and shown to beat plain) is the pick; one proven more than the margin slower than another setting is passed
    # over; one that is neither keeps the decision open (a rerun could pick it or pass it: the race measures it).
    chosen, undecided, unproven = None, None, False
    if paying:
        for x in sorted((x for x in eligible if x["speedup"] > 1.0), key=lambda x: (*memory_key(x), -x["speedup"])):
            if safe(x) and _proven_to_pay(x, paying, ivs, pair, slo):
                chosen = x
                break
            if any(beaten_by_more_than_margin(x, y) for y in eligible if y is not x):
                continue
            undecided, unproven = x, safe(x)  # safe but not yet proven faster than plain: measure it with plain
            break
    if chosen is not None:
        entry = _resolved_deploy(base, chosen, [x for x in eligible if x is not chosen], ivs, pair, slo)
    elif all(_pays(ivs[id(x)], slo) in ("no gain", "slower") for x in eligible):
        entry = _resolved_off(base, leader, ivs[id(leader)], slo)
    elif undecided is not None and (undecided is not leader or unproven):
        entry = _open(base, undecided, [x for x in eligible if x is not undecided], ivs, pair, slo,
                      pays=_pays(ivs[id(undecided)], slo) == "pays", leader=leader, unproven=unproven)
    else:
        entry = _open(base, leader, [x for x in eligible if x is not leader], ivs, pair, slo,
                      pays=bool(paying) and leader in paying)
    entry["comparisons"] = [_comparison(leader, x, pair[(id(leader), id(x))], margin)
                            for x in eligible if x is not leader]
    if hinge:
        parts = [f"{setting_name(x)} (S {x['speedup']:.2f}) fails {' and '.join(_marginally_blocked(x, slo))} "
                 f"only within {100 * slo.margin:.0f} % of the SLO" for x in hinge]
        entry.update(resolved=False, resolution="open",
                     contenders=list(dict.fromkeys([*(entry.get("contenders") or [setting_name(leader)]),
                                                    *(setting_name(x) for x in hinge)])))
        entry["headline"] += "; open on the gates: " + "; ".join(parts)
        entry["reason"] += f" Not yet resolved on the gates: {'; '.join(parts)}; a rerun may decide otherwise."
    picked = next((x for x in eligible if entry.get("setting") == setting_name(x)), None)
    if entry["decision"] == "deploy" and picked is not None:
        passes = _marginal(picked, [g for g in GATES if g not in _blocking(picked["gates"], slo)])
        if passes:
            entry["reason"] += (f" {setting_name(picked)} passes {' and '.join(passes)} only within "
                                f"{100 * slo.margin:.0f} % of the SLO.")
        caveat = [n for n in GATES if picked["gates"].get(n, {}).get("status") == NOT_ASSESSED]
        if caveat:
            entry["reason"] += f" Not assessed: {', '.join(caveat)}."
    return entry


def verdicts(
    scenarios: Sequence[dict[str, Any]],
    slo: SLO = SLO(),
    controls: dict[tuple[str, float], float] | None = None,
    plain_latency: Mapping[tuple[str, float], GateResult] | None = None,
    load: int = 1,
) -> list[dict[str, Any]]:
    """One decision per (category, temperature) from scenario dicts carrying ``gates`` (as dicts) and,
    for paired decisions, ``per_prompt`` (see the module doc). ``plain_latency``: plain decoding's latency
    gate per (category, temperature) at this ``load``; where it fails, the entry says the SLO is out of
    reach at this load whatever runs (``slo_out_of_reach``)."""
    controls, plain_latency = controls or {}, plain_latency or {}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for s in scenarios:
        groups[(s["category"], s["temperature"])].append(s)
    out = []
    for (cat, temp), items in groups.items():
        base = {"category": cat, "temperature": temp, "resolved": True, "tied_with": [], "equivalent_to": [],
                "comparisons": [], "prompts_needed": None, "contenders": [],
                "slo_out_of_reach": out_of_reach(plain_latency.get((cat, float(temp))), load)}
        if (bucket := split_key(cat)[1]) is not None:  # decided per context bucket (mainjob/buckets.py)
            base["context_bucket"] = bucket
        if cat in CONTROL_CATEGORIES:
            measured = [s for s in items if s.get("speedup") is not None]
            out.append(_control(base, measured, controls.get((cat, float(temp)))))
            continue
        entry = decide_group(items, slo, base)
        if entry.get("slo_out_of_reach"):
            entry["reason"] += f" {entry['slo_out_of_reach']}."
        out.append(entry)
    return out


__all__ = ["CONTROL_CATEGORIES", "DRAFTER_MEMORY_RANK", "MIN_EQUIVALENCE_PROMPTS", "MIN_ROUNDS_PER_REQUEST",
           "MIN_TOKENS_PER_REQUEST", "control_repetition", "decide_group", "memory_key",
           "out_of_reach", "prompts_to_separate", "prompts_to_settle", "repeated_ngram_fraction", "setting_name",
           "verdicts"]
