"""The verdict's entries, one per way a decision ends: resolved deploy (:func:`_resolved_deploy`), resolved
off (:func:`_resolved_off`, :func:`_off_gates` when every setting fails a gate), open with its contenders
(:func:`_open`), a control (:func:`_control`); each with its headline and reason. Which one applies is
:func:`specledger.gates.verdicts.decide_group`'s call."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from specledger.analysis.paired import EQUIVALENT, RatioInterval
from specledger.analysis.sequential import interval_level
from specledger.gates.result import FAIL, GateResult
from specledger.gates.slo import SLO
from specledger.gates.verdict_rules import (
    _blocking,
    _fmt_ci,
    _lo,
    _marginally_blocked,
    _pays,
    _within_margin,
    prompts_to_settle,
    setting_name,
)


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
        near = f"next: {setting_name(closest)}, paired ratio {v.ratio:.3f} [{_fmt_ci(v)}] on {v.n} prompts"
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
    through = None
    if _pays(ic, slo) != "pays" and paying:  # shown faster than plain through a setting that pays (_proven_to_pay)
        via = max(paying, key=lambda y: _lo(ivs[id(y)]) * _lo(pair[(id(chosen), id(y))]))
        through = _shown_through(ic, via, ivs[id(via)], pair[(id(chosen), id(via))], slo)
        head += f"; {through['text']}"
    out = {**_entry(base, chosen, ic, "deploy"), "resolution": resolution, "resolved": True,
           "equivalent_to": [setting_name(x) for x in others if vs[id(x)].verdict(margin) == EQUIVALENT],
           "tied_with": [x["label"] for x in faster_points], "headline": head, "contenders": [],
           **({"shown_through": through} if through else {})}
    level = f"{100 * interval_level(slo.decision_alpha):.0f} %"
    out["reason"] = (f"{setting_name(chosen)} passes the gates: S = {ic.ratio:.2f} ({level} CI {_fmt_ci(ic)}); "
                     f"{head}.")
    return out


def _shown_through(own: RatioInterval, via: Mapping[str, Any], iv_via: RatioInterval, ratio: RatioInterval,
                   slo: SLO) -> dict[str, Any]:
    """A deploy whose own S interval ``own`` does not clear ``min_ci_low``, shown faster than plain through
    ``via`` (:func:`~specledger.gates.verdict_rules._proven_to_pay`): lo(S_via) · lo(S_chosen / S_via) clears it.
    Each bound holds at ``1 − α`` over the race, so the chained one at ``1 − 2α`` at worst; ``text`` says so in
    words, for the answer line."""
    bound, name = _lo(iv_via) * _lo(ratio), setting_name(via)
    level = 100 * interval_level(2 * slo.decision_alpha)
    text = (f"its own interval [{_fmt_ci(own)}] is not above {slo.min_ci_low:g}; faster than plain shown through "
            f"{name}: S ≥ {_lo(iv_via):.3f} ({name} vs plain, {iv_via.n} prompts) × {_lo(ratio):.3f} (paired ratio, "
            f"{ratio.n} prompts) = {bound:.3f} at {level:.0f} %")
    return {"setting": name, "bound": bound, "level": level / 100, "text": text}


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
    need = [n for _, v in rivals if (n := prompts_to_settle(v, margin, slo.decision_alpha)) is not None]
    if unproven and (n := prompts_to_settle(ivs[id(focus)], margin, slo.decision_alpha)) is not None:
        need.append(n)
    elif not pays and (n := prompts_to_settle(il, margin, slo.decision_alpha)) is not None:
        need.append(n)
    lead = f"{setting_name(shown)} S {il.ratio:.2f} [{_fmt_ci(il)}]"
    if unproven and not rivals:
        own = ivs[id(focus)]
        head = (f"{setting_name(focus)} is within {100 * margin:.0f} % of every setting, and S {own.ratio:.2f} "
                f"[{_fmt_ci(own)}] against plain after {own.n} prompts is not yet shown above "
                f"{slo.min_ci_low:g}")
    elif rivals:
        x, v = min(rivals, key=lambda p: _lo(p[1]))
        why = (f"{setting_name(x)} could still be more than {100 * margin:.0f} % faster"
               if not _within_margin(focus, x, ivs, pair, margin)
               else f"{setting_name(x)} cannot be more than {100 * margin:.0f} % faster, but whether either pays "
                    "against plain is still open")  # a rival for paying, not for speed
        head = (f"{setting_name(focus)} vs {setting_name(x)}: paired ratio {v.ratio:.3f} [{_fmt_ci(v)}] after "
                f"{v.n} prompts; {why}")
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
    out["reason"] = ((f"{lead} pays; " if pays or leader is not None else "Off until resolved: ")  # as decided
                     + f"not yet resolved: {head}"
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
    return (f"SLO out of reach at load {load} even without speculation "
            f"(plain {', '.join(over) or plain_latency.evidence})"
            "; speculation is judged on what it changes")
