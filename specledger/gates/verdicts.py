"""The decision per (category, temperature) at one load: which setting to deploy, or off -- resolved or open.

Contenders are compared *paired*, on the prompts both ran (:mod:`specledger.gates.paired`: the ratio
of their speed-ups, a Student-t interval of the ratio estimator, one-sided tests at ``slo.decision_alpha``).
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
from collections.abc import Mapping, Sequence
from typing import Any

from specledger.gates.paired import (
    EQUIVALENT,
    PerPrompt,
    RatioInterval,
    setting_ratio,
    speedup_interval,
)
from specledger.gates.result import FAIL, GATES, NOT_ASSESSED, GateResult
from specledger.gates.slo import SLO
from specledger.records import RequestRecord

#: fewest paired prompts behind an equivalence ("within the margin", "no practical gain"): with 2-5 prompts the
#: t interval's own variance estimate is too unsteady, and the race looks after every round (docs/decisions.md)
MIN_EQUIVALENCE_PROMPTS = 6
#: categories that are controls, never deployed: they show what the drafters do on input without structure
CONTROL_CATEGORIES = frozenset({"random"})
#: memory rank of a drafter's own state (weights, KV): model-free < shared weights < int8 copy < separate model
DRAFTER_MEMORY_RANK = {"ngram": 0, "suffix": 1, "layerskip": 2, "head": 3, "quant-self": 4, "model": 5}
#: below this many full speculative rounds per request (best setting) a category's rounds say nothing
MIN_ROUNDS_PER_REQUEST = 2.0
#: below this many output tokens per request (best setting) the time compared is mostly the prefill
MIN_TOKENS_PER_REQUEST = 4.0


def _blocking(gates: dict[str, dict[str, str]], slo: SLO) -> list[str]:
    bad = {FAIL, NOT_ASSESSED} if slo.require_assessed else {FAIL}
    return [name for name in GATES if gates.get(name, {}).get("status", NOT_ASSESSED) in bad]


def repeated_ngram_fraction(token_ids: Sequence[int], n: int = 4) -> float | None:
    """Share of an output's n-grams that already occurred earlier in it (None when shorter than n + 1)."""
    grams = [tuple(token_ids[i : i + n]) for i in range(len(token_ids) - n + 1)]
    if len(grams) < 2:
        return None
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def control_repetition(records: Sequence[RequestRecord], n: int = 4) -> dict[tuple[str, float], float]:
    """Mean repeated-n-gram fraction of plain decoding's outputs per control (category, temperature)."""
    acc: dict[tuple[str, float], list[float]] = defaultdict(list)
    for r in records:
        if r.category in CONTROL_CATEGORIES and (r.drafter or "none") == "none":
            if (f := repeated_ngram_fraction(r.token_ids, n)) is not None:
                acc[(r.category, float(r.temperature))].append(f)
    return {k: sum(v) / len(v) for k, v in acc.items()}


def memory_key(s: Mapping[str, Any]) -> tuple:
    """The tie rule's order: cheaper drafter state first, then the smaller γ."""
    g = s["gamma"] if isinstance(s["gamma"], (int, float)) else math.inf
    return (DRAFTER_MEMORY_RANK.get(s["drafter"], 9), g)


def setting_name(s: Mapping[str, Any]) -> str:
    return f"{s['drafter']} γ={s['gamma']}" + (f" tree={s['tree_budget']}" if s.get("tree_budget") else "")


def _fmt_ci(iv: RatioInterval) -> str:
    if not (math.isfinite(iv.lo) and math.isfinite(iv.hi)):
        return "no interval"
    return f"{iv.lo:.2f}–{iv.hi:.2f}"


def prompts_to_separate(a: dict[str, Any], b: dict[str, Any] | None = None, threshold: float = 1.0) -> int | None:
    """Paired prompts that would make the intervals of ``a`` and ``b`` (or ``a`` and ``threshold``) stop
    overlapping, if the half-widths shrink as 1/sqrt(n) and the point estimates stay put."""
    n = max(int(a.get("paired_prompts") or 1), 1)

    def half(s: dict[str, Any]) -> float | None:
        lo, hi = s["speedup_ci"]
        return None if lo is None or hi is None else (hi - lo) / 2

    ha = half(a)
    if ha is None:
        return None
    if b is None:
        gap, width = abs(a["speedup"] - threshold), ha
    else:
        hb = half(b)
        if hb is None:
            return None
        gap, width = abs(a["speedup"] - b["speedup"]), ha + hb
    if not (math.isfinite(gap) and math.isfinite(width)) or gap <= 0:
        return None
    return max(n + 1, math.ceil(n * (width / gap) ** 2))


def prompts_to_settle(iv: RatioInterval, margin: float) -> int | None:
    """Paired prompts that would settle an open ratio, if its interval's log half-width shrinks as
    1/sqrt(n) and the ratio stays put: until the interval excludes 1, or fits inside the margin."""
    if iv.n < 2 or not (math.isfinite(iv.lo) and math.isfinite(iv.hi) and iv.ratio > 0 and iv.lo > 0):
        return None
    half = (math.log(iv.hi) - math.log(iv.lo)) / 2
    room = max(abs(math.log(iv.ratio)), math.log(1 + margin) - abs(math.log(iv.ratio)))
    if half <= 0 or room <= 0:
        return None
    return max(iv.n + 1, math.ceil(iv.n * (half / room) ** 2))


# ----------------------------------------------------------------------------- one group


def _interval_vs_plain(s: Mapping[str, Any], alpha: float) -> RatioInterval:
    """S with its 1 − 2α interval: from the paired per-prompt totals when the scenario has them, else the
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


def _marginal(s: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """'latency (TTFT P99)' for each gate in ``names`` whose outcome a rerun could flip."""
    out = []
    for name in names:
        checks = s["gates"].get(name, {}).get("marginal") or []
        if checks:
            out.append(f"{name} ({', '.join(checks)})")
    return out


def _marginally_blocked(s: Mapping[str, Any], slo: SLO) -> list[str]:
    """The blocking gates of ``s`` when every one of them fails only within the SLO's margin (else [])."""
    blocked = _blocking(s["gates"], slo)
    flips = _marginal(s, blocked)
    return flips if blocked and len(flips) == len(blocked) else []


def _per_request(s: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(full speculative rounds, output tokens) per request of a scenario; rounds None when the records
    carry no rounds at all (an endpoint probe reports tokens, not rounds)."""
    rounds, totals = s.get("rounds") or {}, s.get("totals") or {}
    requests = float(totals.get("requests") or 0)
    if not requests:
        return None, None
    tokens = float(totals.get("tokens") or 0) / requests
    full, any_rounds = rounds.get("full_rounds"), rounds.get("rounds")
    if not isinstance(full, (int, float)) or (not any_rounds and tokens >= MIN_TOKENS_PER_REQUEST):
        return None, tokens
    return float(full) / requests, tokens


def _too_thin(measured: Sequence[Mapping[str, Any]]) -> str | None:
    """Why nothing can be decided from these requests (None when they are enough): even the best setting
    ran fewer than :data:`MIN_ROUNDS_PER_REQUEST` full speculative rounds per request, or its replies
    averaged fewer than :data:`MIN_TOKENS_PER_REQUEST` tokens (what is timed then is the prefill)."""
    facts = [_per_request(s) for s in measured]
    rounds = [r for r, _ in facts if r is not None]
    tokens = [t for _, t in facts if t is not None]
    if not tokens:
        return None
    if max(tokens) >= MIN_TOKENS_PER_REQUEST and (not rounds or max(rounds) >= MIN_ROUNDS_PER_REQUEST):
        return None
    return (f"too few speculative rounds to measure anything ({max(rounds, default=0.0):.1f} full rounds, "
            f"{max(tokens):.1f} output tokens per request): the replies end at their first tokens; give the "
            "prompts as chat `messages` (an instruct model answers raw text with EOS) or raise --max-tokens")


def _entry(base: dict[str, Any], chosen: Mapping[str, Any] | None, iv: RatioInterval | None,
           decision: str) -> dict[str, Any]:
    deploy = decision == "deploy" and chosen is not None
    el = (chosen.get("rounds") or {}).get("el_full") if chosen is not None else None
    return {**base, "decision": decision, "drafter": chosen["drafter"] if deploy else None,
            "gamma": chosen["gamma"] if deploy else None, "label": chosen["label"] if deploy else decision,
            "speedup": iv.ratio if iv is not None and chosen is not None else None,
            "speedup_ci": ([iv.lo if math.isfinite(iv.lo) else None, iv.hi if math.isfinite(iv.hi) else None]
                           if iv is not None else [None, None]),
            "setting": setting_name(chosen) if chosen is not None else None,
            "mean_committed": el if isinstance(el, (int, float)) and math.isfinite(el) else None,
            "prompts": iv.n if iv is not None else 0}


def _comparison(a: Mapping[str, Any], b: Mapping[str, Any], iv: RatioInterval, margin: float) -> dict[str, Any]:
    return {"a": setting_name(a), "b": setting_name(b), "ratio": iv.ratio,
            "ci": [iv.lo if math.isfinite(iv.lo) else None, iv.hi if math.isfinite(iv.hi) else None],
            "n": iv.n, "verdict": iv.verdict(margin)}


def _pays(iv: RatioInterval, slo: SLO) -> str:
    """S against plain: "pays" (interval above min_ci_low), "no gain" (its upper bound below 1 + margin: it
    cannot be worth more than the margin), "slower" (interval below 1), "open"."""
    if iv.hi < 1.0:
        return "slower"
    if iv.hi < 1.0 + slo.equivalence_margin and _enough(iv):
        return "no gain"
    if iv.lo > slo.min_ci_low:
        return "pays"
    return "open"


def _within_margin(x: Mapping[str, Any], y: Mapping[str, Any], ivs: Mapping[int, RatioInterval],
                   pair: Mapping[tuple[int, int], RatioInterval], margin: float) -> bool:
    """``y`` cannot be more than the margin faster than ``x``: paired, lo(S_x / S_y) > 1/(1+m); or through plain,
    hi(S_y) / lo(S_x) < 1 + m (a setting that cannot beat plain by much cannot beat one that pays). Either on
    enough prompts (:func:`_enough`)."""
    xy = pair[(id(x), id(y))]
    if _enough(xy) and _lo(xy) > 1.0 / (1.0 + margin):
        return True
    ix, iy = ivs[id(x)], ivs[id(y)]
    return (_enough(ix) and _enough(iy) and _lo(ix) > 0 and math.isfinite(iy.hi)
            and iy.hi / _lo(ix) < 1.0 + margin)


def _enough(iv: RatioInterval) -> bool:
    """Enough paired prompts for an equivalence (:data:`MIN_EQUIVALENCE_PROMPTS`); ``n`` 0 is an interval given
    whole (a scenario without per-prompt totals, an import), taken as it is."""
    return iv.n == 0 or iv.n >= MIN_EQUIVALENCE_PROMPTS


def _lo(iv: RatioInterval) -> float:
    return iv.lo if not math.isnan(iv.lo) else -math.inf


def decide_group(items: Sequence[dict[str, Any]], slo: SLO, base: dict[str, Any]) -> dict[str, Any]:
    """The decision of one (category, temperature) from its scenarios: indifference-zone selection.

    A setting is *safe* when no other eligible setting can be more than the margin m faster: for every other b
    the lower bound of S_s / S_b exceeds 1/(1+m), paired, or, through plain, hi(S_b) / lo(S_s) < 1 + m. The decision is resolved when some
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
    ivs = {id(s): _interval_vs_plain(s, alpha) for s in measured}
    eligible = [s for s in measured if not _blocking(s["gates"], slo)]
    fastest = max(measured, key=lambda s: s["speedup"])
    if not eligible:
        return _off_gates(base, fastest, ivs[id(fastest)], measured, ivs, slo)
    pair = {(id(x), id(y)): _compare(x, y, ivs[id(x)], ivs[id(y)], alpha)
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


def _proven_to_pay(x: dict[str, Any], paying: Sequence[dict[str, Any]], ivs: Mapping[int, RatioInterval],
                   pair: Mapping[tuple[int, int], RatioInterval], slo: SLO) -> bool:
    """``x`` is proven faster than plain: its own paired interval against plain pays, or, through a setting
    ``y`` that pays, ``lo(S_y) · lo(S_x / S_y) > min_ci_low`` (both one-sided bounds at α: the chained bound
    holds at 2α at worst). A setting the rule would pick for being within the margin of the best is deployed
    only once it is shown to beat plain itself."""
    if _pays(ivs[id(x)], slo) == "pays":
        return True
    return any(_lo(ivs[id(y)]) * _lo(pair[(id(x), id(y))]) > slo.min_ci_low for y in paying if y is not x)


def _resolved_deploy(base: dict[str, Any], chosen: dict[str, Any], others: Sequence[dict[str, Any]],
                     ivs: Mapping[int, RatioInterval], pair: Mapping[tuple[int, int], RatioInterval],
                     slo: SLO) -> dict[str, Any]:
    """Resolved: ``chosen`` pays and no other setting can be more than the margin faster."""
    margin, ic = slo.equivalence_margin, ivs[id(chosen)]
    vs = {id(x): pair[(id(chosen), id(x))] for x in others}
    beats_all = all(_lo(vs[id(x)]) > 1.0 for x in others)
    closest = min(others, key=lambda x: vs[id(x)].ratio if math.isfinite(vs[id(x)].ratio) else math.inf,
                  default=None)
    near = ""
    if closest is not None:
        v = vs[id(closest)]
        near = f"next: {setting_name(closest)}, paired ratio {v.ratio:.3f} [{_fmt_ci(v)}]"
    faster_points = [x for x in others if x["speedup"] > chosen["speedup"]]
    if not others:
        head, resolution = f"{setting_name(chosen)} is the only setting that passes the gates", "winner"
    elif beats_all:
        head, resolution = f"{setting_name(chosen)} beats every other setting, paired ({near})", "winner"
    else:
        pct = f"{100 * margin:.0f} %"
        head = (f"no setting is more than {pct} faster than {setting_name(chosen)}, paired"
                + (f" ({setting_name(chosen)} chosen by the rule 'cheaper in memory, then smaller γ' over "
                   + ", ".join(f"{setting_name(x)} (S {x['speedup']:.2f})" for x in faster_points) + ")"
                   if faster_points else f" ({near})"))
        resolution = "equivalent"
    paying = [y for y in others if _pays(ivs[id(y)], slo) == "pays"]
    if _pays(ic, slo) != "pays" and paying:  # shown faster than plain through a setting that pays (_proven_to_pay)
        via = max(paying, key=lambda y: _lo(ivs[id(y)]) * _lo(pair[(id(chosen), id(y))]))
        bound = _lo(ivs[id(via)]) * _lo(pair[(id(chosen), id(via))])
        head += f"; faster than plain through {setting_name(via)} (S ≥ {bound:.3f})"
    out = {**_entry(base, chosen, ic, "deploy"), "resolution": resolution, "resolved": True,
           "equivalent_to": [setting_name(x) for x in others if vs[id(x)].verdict(margin) == EQUIVALENT],
           "tied_with": [x["label"] for x in faster_points], "headline": head, "contenders": []}
    out["reason"] = (f"{setting_name(chosen)} passes the gates: S = {ic.ratio:.2f} (90 % CI {_fmt_ci(ic)}); "
                     f"{head}.")
    return out


def _resolved_off(base: dict[str, Any], leader: dict[str, Any], il: RatioInterval, slo: SLO) -> dict[str, Any]:
    """Resolved off: no setting that passes the gates can be more than the margin faster than plain."""
    lead = f"{setting_name(leader)} S {il.ratio:.2f} [{_fmt_ci(il)}]"
    why = (f"S < 1: the fastest setting, {lead}, is slower than plain" if il.hi < 1.0 else
           f"no practical gain: not even the fastest setting, {lead}, can be more than "
           f"{100 * slo.equivalence_margin:.0f} % faster than plain")
    return {**_entry(base, leader, il, "off"), "resolution": "off", "resolved": True, "headline": why,
            "contenders": [], "reason": f"Off: {why}."}


def _open(base: dict[str, Any], focus: dict[str, Any], others: Sequence[dict[str, Any]],
          ivs: Mapping[int, RatioInterval], pair: Mapping[tuple[int, int], RatioInterval], slo: SLO,
          pays: bool, leader: dict[str, Any] | None = None, unproven: bool = False) -> dict[str, Any]:
    """Open: ``focus`` (the leader, or the rule's first setting whose place is unsettled) and every setting that
    could still beat it by more than the margin (and could pay) are the contenders; with ``leader`` (the
    fastest paying setting) given, that is the provisional deploy. ``unproven``: ``focus`` is within the margin
    of every setting but not yet shown faster than plain (:func:`_proven_to_pay`): more prompts with plain."""
    margin = slo.equivalence_margin
    shown = leader if leader is not None else focus
    il = ivs[id(shown)]
    rivals = [(x, pair[(id(focus), id(x))]) for x in others if not _within_margin(focus, x, ivs, pair, margin)
              or (not pays and leader is None and _pays(ivs[id(x)], slo) == "open")]  # could still pay: measure it
    need = [n for _, v in rivals if (n := prompts_to_settle(v, margin)) is not None]
    if unproven and (n := prompts_to_settle(ivs[id(focus)], margin)) is not None:
        need.append(n)
    elif not pays and (n := prompts_to_settle(il, margin)) is not None:
        need.append(n)
    lead = f"{setting_name(shown)} S {il.ratio:.2f} [{_fmt_ci(il)}]"
    if unproven and not rivals:
        own = ivs[id(focus)]
        head = (f"{setting_name(focus)} is within {100 * margin:.0f} % of every setting, and S {own.ratio:.2f} "
                f"[{_fmt_ci(own)}] against plain after {own.n} prompts is not yet shown above "
                f"{slo.min_ci_low:g}")
    elif rivals:
        x, v = min(rivals, key=lambda p: _lo(p[1]))
        head = (f"{setting_name(focus)} vs {setting_name(x)}: paired ratio {v.ratio:.3f} [{_fmt_ci(v)}] after "
                f"{v.n} prompts; {setting_name(x)} could still be more than {100 * margin:.0f} % faster")
    else:
        head = f"{lead} could be above or below 1 after {il.n} prompts"
    names = [setting_name(focus), *(setting_name(x) for x, _ in rivals)]
    if leader is not None and setting_name(leader) not in names:
        names.insert(0, setting_name(leader))
    out = {**_entry(base, shown, il, "deploy" if (pays or leader is not None) else "off"), "resolution": "open",
           "resolved": False, "prompts_needed": max(need) if need else None,
           "tied_with": [x["label"] for x, _ in rivals], "contenders": names, "headline": head,
           # what is open is between settings once one is proven to pay: more prompts need no plain run
           # ... unless nothing between settings is open (no rival): then S against plain is
           "needs_plain": unproven or not rivals or not (pays or leader is not None)}
    out["reason"] = ((f"{lead} pays; " if pays else "Off until resolved: ") + f"not yet resolved: {head}"
                     + (f"; ≈ {out['prompts_needed']} paired prompts would settle it." if need else "."))
    return out


def _off_gates(base: dict[str, Any], fastest: dict[str, Any], iv: RatioInterval,
               measured: Sequence[dict[str, Any]], ivs: Mapping[int, RatioInterval], slo: SLO) -> dict[str, Any]:
    """Off when every setting fails a gate. The cause named is speed when even the fastest does not pay
    (a gate that fails on a setting slower than plain is not why speculation is off), else the gate."""
    status = _pays(iv, slo)
    blocked = _blocking(fastest["gates"], slo)
    lead = f"{setting_name(fastest)} (S {iv.ratio:.2f} [{_fmt_ci(iv)}])"
    if status in ("no gain", "slower"):
        why = (f"S < 1: the fastest setting, {lead}, is slower than plain" if status == "slower" else
               f"no practical gain: the fastest setting, {lead}, is within {100 * slo.equivalence_margin:.0f} % "
               "of plain")
    else:
        evidence = "; ".join(f"{g}: {fastest['gates'][g].get('evidence', '')}" for g in blocked)
        why = (f"the fastest setting, {lead}, fails the {' and '.join(blocked)} gate"
               f"{'s' if len(blocked) > 1 else ''} ({evidence})")
    marginal = [s for s in measured if _marginally_blocked(s, slo) and _pays(ivs[id(s)], slo) == "pays"]
    out = {**_entry(base, fastest, iv, "off"), "resolution": "off" if not marginal else "open",
           "resolved": not marginal, "headline": why, "reason": f"Off: {why}."}
    if marginal:
        parts = [f"{setting_name(s)} (S = {s['speedup']:.2f}) fails {' and '.join(_marginally_blocked(s, slo))} "
                 f"only within {100 * slo.margin:.0f} % of the SLO" for s in marginal]
        out["headline"] += "; open on the gates"
        out["contenders"] = [setting_name(s) for s in marginal]
        out["reason"] += f" Not yet resolved on the gates: {'; '.join(parts)}; a rerun may decide otherwise."
    return out


def _control(base: dict[str, Any], measured: Sequence[dict[str, Any]], rep: float | None) -> dict[str, Any]:
    fastest = max(measured, key=lambda s: s["speedup"]) if measured else None
    seen = f"; its fastest setting, {setting_name(fastest)}, measured S = {fastest['speedup']:.2f}" if fastest else ""
    rep_text = (f"plain decoding's replies to random tokens repeat themselves: {100 * rep:.0f} % of their "
                "4-grams occurred earlier in the same reply, which the n-gram and suffix drafters copy"
                if rep is not None else "no plain output long enough to measure its repetition")
    return {**base, "decision": "control", "resolution": "control", "drafter": None, "gamma": None,
            "label": "control", "speedup": fastest["speedup"] if fastest else None, "speedup_ci": [None, None],
            "setting": setting_name(fastest) if fastest else None, "mean_committed": None, "prompts": 0,
            "repeated_ngram_fraction": rep,
            "headline": "control, never deployed" + (f" (fastest {setting_name(fastest)} S {fastest['speedup']:.2f})"
                                                     if fastest else ""),
            "reason": (f"Control, never deployed: random token ids have no structure to predict, so any speed-up "
                       f"here comes from the model's own output, not the workload; {rep_text}{seen}.")}


def out_of_reach(plain_latency: GateResult | None, load: int) -> str | None:
    """"SLO out of reach at load L even without speculation (plain TTFT P99 2348 ms > 2000 ms)" when plain
    decoding's own latency gate fails at this load, else None."""
    if plain_latency is None or plain_latency.status != FAIL:
        return None
    over = [p.strip() for p in plain_latency.evidence.split(",") if ">" in p]
    return (f"SLO out of reach at load {load} even without speculation (plain {', '.join(over) or plain_latency.evidence})"
            "; speculation is judged on what it changes")


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
        if cat in CONTROL_CATEGORIES:
            measured = [s for s in items if s.get("speedup") is not None]
            out.append(_control(base, measured, controls.get((cat, float(temp)))))
            continue
        entry = decide_group(items, slo, base)
        if entry.get("slo_out_of_reach"):
            entry["reason"] += f" {entry['slo_out_of_reach']}."
        out.append(entry)
    return out


__all__ = ["CONTROL_CATEGORIES", "DRAFTER_MEMORY_RANK", "control_repetition", "decide_group", "memory_key",
           "out_of_reach", "prompts_to_separate", "prompts_to_settle", "repeated_ngram_fraction", "setting_name",
           "verdicts"]
