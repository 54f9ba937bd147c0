"""The verdict per (category, temperature): the fastest scenario with no failed gate and a speed-up CI
lower bound above ``min_ci_low``; otherwise "off". ``not assessed`` blocks only with ``require_assessed``.
Ties (overlapping intervals, widened for small samples: :func:`small_sample_factor`) go to the smaller
memory footprint, then the smaller γ; controls (random tokens) are reported,
never deployed."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from specledger.gates.result import FAIL, GATES, NOT_ASSESSED
from specledger.gates.slo import SLO
from specledger.records import RequestRecord


def _blocking(gates: dict[str, dict[str, str]], slo: SLO) -> list[str]:
    bad = {FAIL, NOT_ASSESSED} if slo.require_assessed else {FAIL}
    return [name for name in GATES if gates.get(name, {}).get("status", NOT_ASSESSED) in bad]


#: categories that are controls, never deployed: they show what the drafters do on input without structure
CONTROL_CATEGORIES = frozenset({"random"})
#: memory rank of a drafter's own state (weights, KV): model-free < shared weights < int8 copy < separate model
DRAFTER_MEMORY_RANK = {"ngram": 0, "suffix": 1, "layerskip": 2, "quant-self": 3, "model": 4}


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


def _memory_key(s: dict[str, Any]) -> tuple:
    g = s["gamma"] if isinstance(s["gamma"], (int, float)) else math.inf
    return (DRAFTER_MEMORY_RANK.get(s["drafter"], 5), g)


def _half_width(s: dict[str, Any]) -> float | None:
    lo, hi = s["speedup_ci"]
    return None if lo is None or hi is None else (hi - lo) / 2


def prompts_to_separate(a: dict[str, Any], b: dict[str, Any] | None = None, threshold: float = 1.0) -> int | None:
    """Paired prompts that would make the 95 % intervals of ``a`` and ``b`` (or ``a`` and ``threshold``)
    stop overlapping, if the half-widths shrink as 1/sqrt(n) and the point estimates stay put."""
    n = max(int(a.get("paired_prompts") or 1), 1)
    ha = _half_width(a)
    if ha is None:
        return None
    if b is None:
        gap, width = abs(a["speedup"] - threshold), ha
    else:
        hb = _half_width(b)
        if hb is None:
            return None
        gap, width = abs(a["speedup"] - b["speedup"]), ha + hb
    if not (math.isfinite(gap) and math.isfinite(width)) or gap <= 0:  # a NaN speed-up separates nothing
        return None
    return max(n + 1, math.ceil(n * (width / gap) ** 2))


def small_sample_factor(n: int) -> float:
    """t_{n-1, 0.975} / z_{0.975}: how much wider a 95 % interval of a mean over ``n`` paired prompts is
    than the percentile bootstrap's, which assumes many (with 2 prompts the bootstrap's interval is just
    the two prompts' speed-ups; Student's t with 1 degree of freedom is 6.5 times wider). 1 for n >= 100."""
    if n >= 100:
        return 1.0
    from scipy.stats import norm, t

    return float(t.ppf(0.975, max(n, 2) - 1) / norm.ppf(0.975))


def _tie_bounds(s: dict[str, Any]) -> tuple[float | None, float | None]:
    """The speed-up interval the tie test uses: the bootstrap interval widened about the point by
    :func:`small_sample_factor` of its paired prompts, so that 2 prompts do not 'resolve' settings that a
    third prompt could reorder."""
    lo, hi = s["speedup_ci"]
    if lo is None or hi is None:
        return lo, hi
    n = s.get("paired_prompts")
    k = small_sample_factor(int(n)) if n else 1.0  # unknown sample size: the interval as given
    x = s["speedup"]
    return x - k * (x - lo), x + k * (hi - x)


def _name(s: dict[str, Any]) -> str:
    return f"{s['drafter']} γ {s['gamma']}"


def _marginal(s: dict[str, Any], names: Sequence[str]) -> list[str]:
    """'latency (TTFT P99)' for each gate in ``names`` whose outcome a rerun could flip (its
    ``marginal`` checks, :func:`specledger.gates.latency._judge`)."""
    out = []
    for name in names:
        checks = s["gates"].get(name, {}).get("marginal") or []
        if checks:
            out.append(f"{name} ({', '.join(checks)})")
    return out


def _marginally_blocked(s: dict[str, Any], slo: SLO) -> list[str]:
    """The blocking gates of ``s`` when every one of them fails only within the SLO's margin (else [])."""
    blocked = _blocking(s["gates"], slo)
    flips = _marginal(s, blocked)
    return flips if blocked and len(flips) == len(blocked) else []


def _undecided_gates(best: dict[str, Any] | None, contenders: Sequence[dict[str, Any]], slo: SLO) -> str:
    """Why the verdict hinges on a gate outcome inside the machine's drift: the chosen setting passes a
    gate only marginally, or a contender fails only marginally. "" when nothing hinges on one."""
    parts = []
    if best is not None and (passes := _marginal(best, [g for g in GATES if g not in _blocking(best["gates"], slo)])):
        parts.append(f"{_name(best)} passes {' and '.join(passes)} only within {100 * slo.margin:.0f} % of the SLO")
    for s in contenders:
        if fails := _marginally_blocked(s, slo):
            parts.append(f"{_name(s)} (S = {s['speedup']:.2f}) fails {' and '.join(fails)} only within "
                         f"{100 * slo.margin:.0f} % of the SLO")
    return "; ".join(parts)


def verdicts(
    scenarios: Sequence[dict[str, Any]],
    slo: SLO = SLO(),
    controls: dict[tuple[str, float], float] | None = None,
) -> list[dict[str, Any]]:
    """One decision per (category, temperature) from scenario dicts carrying ``gates`` (as dicts).

    Among the settings with no blocking gate and CI low > ``slo.min_ci_low``, take the fastest; every
    setting whose interval overlaps its interval is as good as far as the data can tell ("ngram γ 2 ≈
    γ 4"): pick among them by the stated rule (the cheaper in memory: model-free drafter before
    shared-weight, int8 and separate-model drafters, then the smaller γ), and mark the decision
    unresolved with the prompts it would take to separate them. Control categories
    (:data:`CONTROL_CATEGORIES`) are never deployed: their entry is ``decision = "control"``.
    """
    controls = controls or {}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for s in scenarios:
        groups[(s["category"], s["temperature"])].append(s)
    out = []
    for (cat, temp), items in groups.items():
        measured = [s for s in items if s.get("speedup") is not None]
        eligible = [
            s
            for s in measured
            if not _blocking(s["gates"], slo) and (s["speedup_ci"][0] or -math.inf) > slo.min_ci_low
        ]
        base = {"category": cat, "temperature": temp, "resolved": True, "tied_with": [], "prompts_needed": None}
        if cat in CONTROL_CATEGORIES:
            rep = controls.get((cat, float(temp)))
            fastest = max(measured, key=lambda s: s["speedup"]) if measured else None
            seen = (f"; its fastest setting, {_name(fastest)}, measured S = {fastest['speedup']:.2f}"
                    if fastest else "")
            rep_text = (f"plain decoding's replies to random tokens repeat themselves: {100 * rep:.0f} % of their "
                        "4-grams occurred earlier in the same reply, which the n-gram and suffix drafters copy"
                        if rep is not None else "no plain output long enough to measure its repetition")
            out.append({**base, "decision": "control", "drafter": None, "gamma": None, "label": "control",
                        "speedup": None, "speedup_ci": [None, None], "repeated_ngram_fraction": rep,
                        "reason": (f"Control, never deployed: random token ids have no structure to predict, so "
                                   f"any speed-up here comes from the model's own output, not the workload; "
                                   f"{rep_text}{seen}.")})
            continue
        if eligible:
            fastest = max(eligible, key=lambda s: s["speedup"])
            flo = _tie_bounds(fastest)[0]
            tied = [s for s in eligible if s is fastest or ((hi := _tie_bounds(s)[1]) is not None and flo is not None
                                                            and hi >= flo)]
            best = min(tied, key=lambda s: (*_memory_key(s), -s["speedup"]))
            lo, hi = best["speedup_ci"]
            caveat = [n for n in GATES if best["gates"][n]["status"] == NOT_ASSESSED]
            others = [s for s in tied if s is not best]
            reason = (
                f"{best['drafter']} γ={best['gamma']} passes the gates: "
                f"S = {best['speedup']:.2f} (95% CI {lo:.2f}–{hi:.2f})"
                + (f"; {', '.join(caveat)} not assessed" if caveat else "")
            )
            entry = {**base, "decision": "deploy", "drafter": best["drafter"], "gamma": best["gamma"],
                     "label": best["label"], "speedup": best["speedup"], "speedup_ci": best["speedup_ci"]}
            if others:
                need = [prompts_to_separate(best, o) for o in others]
                known = [x for x in need if x is not None]
                entry.update(resolved=False, tied_with=[o["label"] for o in others],
                             prompts_needed=max(known) if known else None)
                ties = " ≈ ".join([_name(best)] + [_name(o) for o in others])
                n_min = min((int(x["paired_prompts"]) for x in tied if x.get("paired_prompts")), default=100)
                widened = (f", each widened ×{small_sample_factor(n_min):.1f} for {n_min} prompts"
                           if small_sample_factor(n_min) > 1.05 else "")
                reason += (f". Not yet resolved: {ties} (their 95% intervals overlap{widened}); chosen by the rule "
                           "'cheaper in memory, then smaller γ'; "
                           + (f"≈ {entry['prompts_needed']} paired prompts per category would separate them"
                              if known else "more prompts are needed to separate them"))
            # settings blocked only by a marginal gate that could be the pick or tie with it
            near = [s for s in measured if s not in eligible and _marginally_blocked(s, slo)
                    and (s["speedup_ci"][0] or -math.inf) > slo.min_ci_low
                    and (hi := _tie_bounds(s)[1]) is not None and flo is not None and hi >= flo]
            if hinge := _undecided_gates(best, near, slo):
                entry["resolved"] = False
                reason += f". Not yet resolved on the gates: {hinge}; a rerun on this machine may decide otherwise"
            out.append({**entry, "reason": reason + "."})
            continue
        entry = {**base, "decision": "off", "drafter": None, "gamma": None, "label": "off", "speedup": None,
                 "speedup_ci": [None, None], "reason": _off_reason(measured, slo)}
        passing = [s for s in measured if not _blocking(s["gates"], slo)]
        if passing:
            top = max(passing, key=lambda s: s["speedup"])
            if top["speedup"] > slo.min_ci_low and top["speedup_ci"][0] is not None:
                need = prompts_to_separate(top, threshold=slo.min_ci_low)
                entry.update(resolved=False, prompts_needed=need)
                entry["reason"] += (f" Not yet resolved: {_name(top)} measured S = {top['speedup']:.2f} but its "
                                    f"interval reaches {slo.min_ci_low:g}"
                                    + (f"; ≈ {need} paired prompts would settle it." if need else "."))
        near = [s for s in measured if _marginally_blocked(s, slo) and (s["speedup_ci"][0] or -math.inf) > slo.min_ci_low]
        if hinge := _undecided_gates(None, near, slo):
            entry["resolved"] = False
            entry["reason"] += f" Not yet resolved on the gates: {hinge}; a rerun on this machine may decide otherwise."
        out.append(entry)
    return out


def _off_reason(measured: Sequence[dict[str, Any]], slo: SLO) -> str:
    if not measured:
        return "Off: no speculative setting was measured against plain decoding on the same prompts."
    fastest = max(measured, key=lambda s: s["speedup"])
    lo = fastest["speedup_ci"][0]
    blocked = _blocking(fastest["gates"], slo)
    name = f"{fastest['drafter']} γ={fastest['gamma']} (S = {fastest['speedup']:.2f})"
    if blocked:
        ok = [s for s in measured if not _blocking(s["gates"], slo)]
        tail = (
            f"; the best setting that passes, {ok[0]['drafter']} γ={ok[0]['gamma']}, has a CI lower bound of "
            f"{ok[0]['speedup_ci'][0] if ok[0]['speedup_ci'][0] is not None else float('nan'):.2f} ≤ {slo.min_ci_low:g}"
            if (ok := sorted(ok, key=lambda s: -s["speedup"]))
            else ""
        )
        return f"Off: the fastest setting, {name}, fails the {' and '.join(blocked)} gate{'s' if len(blocked) > 1 else ''}{tail}."
    if lo is None:
        return (f"Off: the fastest setting, {name}, has no confidence interval (one prompt cannot be resampled); "
                "measure more prompts (--n 2 or more) before deploying.")
    return f"Off: the fastest setting, {name}, has a speed-up CI lower bound of {lo:.2f}, not above {slo.min_ci_low:g}."
