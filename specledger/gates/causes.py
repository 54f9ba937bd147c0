"""The verdict's endings with their causes, each as a :class:`~specledger.gates.decision.Verdict` with its headline
and reason: resolved deploy (:func:`deploy_verdict`: a winner, or the rule's pick among equivalent settings,
perhaps shown faster than plain only through another setting), resolved off (:func:`off_verdict`;
:func:`off_by_gates` when every setting fails a gate), open with its contenders (:func:`open_verdict`, and
:func:`open_on_gates` when a faster setting fails a gate only within the SLO's margin), a control
(:func:`control_verdict`), no decision (:func:`no_data_verdict`). Which ending applies is
:mod:`specledger.gates.resolution`'s call, made for a group by :func:`specledger.gates.verdicts.decide_group`."""

from __future__ import annotations

import math
from collections.abc import Sequence

from specledger.analysis.paired import EQUIVALENT, RatioInterval
from specledger.analysis.sequential import interval_level
from specledger.gates.blocking import blocking_gates, marginal_gates, marginally_blocked, not_assessed
from specledger.gates.candidates import Candidate
from specledger.gates.decision import (
    BY_EQUIVALENCE,
    CONTROL,
    DEPLOY,
    NO_DATA,
    NO_DECISION,
    OFF,
    OPEN,
    WINNER,
    Comparison,
    DecisionGroup,
    ShownThrough,
    Verdict,
    interval_of,
)
from specledger.gates.paired_tests import (
    NO_GAIN,
    PAYS,
    SLOWER_THAN_PLAIN,
    UNSETTLED,
    PairedIntervals,
    against_plain,
    format_ci,
    lower_bound,
    prompts_to_settle,
)
from specledger.gates.result import FAIL, GATES, GateResult
from specledger.gates.slo import SLO
from specledger.gates.verdict_rules import setting_name


def _measured(group: DecisionGroup, chosen: Candidate | None, iv: RatioInterval | None, decision: str,
              resolution: str, resolved: bool) -> Verdict:
    """A verdict reporting ``chosen`` (the pick, the leader or the fastest) with its S against plain ``iv``; the
    drafter and γ only where it deploys."""
    out = group.verdict(decision, resolution, resolved)
    deploy = decision == DEPLOY and chosen is not None
    el = (chosen.get("rounds") or {}).get("el_full") if chosen is not None else None
    out.drafter = chosen["drafter"] if deploy else None
    out.gamma = chosen["gamma"] if deploy else None
    out.label = chosen["label"] if deploy else decision
    out.speedup = iv.ratio if iv is not None and chosen is not None else None
    out.speedup_ci = interval_of(iv.lo, iv.hi) if iv is not None else (None, None)
    out.setting = setting_name(chosen) if chosen is not None else None
    out.mean_committed = el if isinstance(el, (int, float)) and math.isfinite(el) else None
    out.prompts = iv.n if iv is not None else 0
    return out


def no_data_verdict(group: DecisionGroup, why: str) -> Verdict:
    """No decision: ``why`` nothing measured here can decide."""
    out = _measured(group, None, None, NO_DECISION, NO_DATA, resolved=False)
    out.headline, out.reason = why, f"No decision: {why}."
    return out


def comparison(a: Candidate, b: Candidate, iv: RatioInterval, margin: float) -> Comparison:
    """S_a / S_b as the verdict lists it."""
    return Comparison(setting_name(a), setting_name(b), iv.ratio, interval_of(iv.lo, iv.hi), iv.n, iv.verdict(margin))


def deploy_verdict(group: DecisionGroup, chosen: Candidate, others: Sequence[Candidate], iv: PairedIntervals,
                   slo: SLO) -> Verdict:
    """Resolved: ``chosen`` pays and no other setting can be more than the margin faster."""
    margin, ic = slo.equivalence_margin, iv.plain(chosen)
    vs = {id(x): iv.ratio(chosen, x) for x in others}
    beats_all = all(lower_bound(vs[id(x)]) > 1.0 for x in others)
    closest = min(others, key=lambda x: vs[id(x)].ratio if math.isfinite(vs[id(x)].ratio) else math.inf,
                  default=None)
    near = ""
    if closest is not None:
        v = vs[id(closest)]
        near = f"next: {setting_name(closest)}, paired ratio {v.ratio:.3f} [{format_ci(v)}] on {v.n} prompts"
    faster_points = [x for x in others if x["speedup"] > chosen["speedup"]]
    if not others:
        head, resolution = f"{setting_name(chosen)} is the only setting that passes the gates", WINNER
    elif beats_all:
        head, resolution = f"{setting_name(chosen)} beats every other setting, paired ({near})", WINNER
    else:
        pct = f"{100 * margin:.0f} %"
        head = (f"no setting is more than {pct} faster than {setting_name(chosen)}, paired"
                + (f" ({setting_name(chosen)} chosen by the rule 'cheaper in memory, then smaller γ' over "
                   + ", ".join(f"{setting_name(x)} (S {x['speedup']:.2f})" for x in faster_points) + ")"
                   if faster_points else f" ({near})"))
        resolution = BY_EQUIVALENCE
    paying = [y for y in others if iv.pays(y, slo) == PAYS]
    out = _measured(group, chosen, ic, DEPLOY, resolution, resolved=True)
    if against_plain(ic, slo) != PAYS and paying:  # shown faster than plain through one that pays (proven_to_pay)
        via = max(paying, key=lambda y: iv.chained_bound(chosen, y))
        out.shown_through = shown_through(ic, via, iv, iv.ratio(chosen, via), slo)
        head += f"; {out.shown_through.text}"
    out.equivalent_to = [setting_name(x) for x in others if vs[id(x)].verdict(margin) == EQUIVALENT]
    out.tied_with = [x["label"] for x in faster_points]
    out.headline = head
    level = f"{100 * interval_level(slo.decision_alpha):.0f} %"
    out.reason = (f"{setting_name(chosen)} passes the gates: S = {ic.ratio:.2f} ({level} CI {format_ci(ic)}); "
                  f"{head}.")
    return out


def shown_through(own: RatioInterval, via: Candidate, iv: PairedIntervals, ratio: RatioInterval,
                  slo: SLO) -> ShownThrough:
    """A deploy whose own S interval ``own`` does not clear ``min_ci_low``, shown faster than plain through
    ``via`` (:meth:`~specledger.gates.paired_tests.PairedIntervals.proven_to_pay`): lo(S_via) · lo(S_chosen / S_via)
    clears it. Each bound holds at ``1 − α`` over the race, so the chained one at ``1 − 2α`` at worst; ``text``
    says so in words, for the answer line."""
    iv_via = iv.plain(via)
    bound, name = lower_bound(iv_via) * lower_bound(ratio), setting_name(via)
    level = 100 * interval_level(2 * slo.decision_alpha)
    text = (f"its own interval [{format_ci(own)}] is not above {slo.min_ci_low:g}; faster than plain shown through "
            f"{name}: S ≥ {lower_bound(iv_via):.3f} ({name} vs plain, {iv_via.n} prompts) × {lower_bound(ratio):.3f} "
            f"(paired ratio, {ratio.n} prompts) = {bound:.3f} at {level:.0f} %")
    return ShownThrough(name, bound, level / 100, text)


def off_verdict(group: DecisionGroup, leader: Candidate, il: RatioInterval, slo: SLO) -> Verdict:
    """Resolved off: no setting that passes the gates can be more than the margin faster than plain."""
    lead = f"{setting_name(leader)} S {il.ratio:.2f} [{format_ci(il)}]"
    why = (f"S < 1: the fastest setting, {lead}, is slower than plain" if il.hi < 1.0 else
           f"no practical gain: not even the fastest setting, {lead}, can be more than "
           f"{100 * slo.equivalence_margin:.0f} % faster than plain")
    out = _measured(group, leader, il, OFF, OFF, resolved=True)
    out.headline, out.reason = why, f"Off: {why}."
    return out


def open_verdict(group: DecisionGroup, focus: Candidate, others: Sequence[Candidate], iv: PairedIntervals, slo: SLO,
                 pays: bool, leader: Candidate | None = None, unproven: bool = False) -> Verdict:
    """Open: ``focus`` (the leader, or the rule's first setting whose place is unsettled) and every setting that
    could still beat it by more than the margin (and could pay) are the contenders; with ``leader`` (the
    fastest paying setting) given, that is the provisional deploy. ``unproven``: ``focus`` is within the margin
    of every setting but not yet shown faster than plain (``proven_to_pay``): more prompts with plain."""
    margin = slo.equivalence_margin
    shown = leader if leader is not None else focus
    il = iv.plain(shown)
    rivals = [(x, iv.ratio(focus, x)) for x in others if not iv.within_margin(focus, x, margin)
              or (not pays and leader is None and iv.pays(x, slo) == UNSETTLED)]  # could still pay: measure it
    need = [n for _, v in rivals if (n := prompts_to_settle(v, margin, slo.decision_alpha)) is not None]
    if unproven and (n := prompts_to_settle(iv.plain(focus), margin, slo.decision_alpha)) is not None:
        need.append(n)
    elif not pays and (n := prompts_to_settle(il, margin, slo.decision_alpha)) is not None:
        need.append(n)
    lead = f"{setting_name(shown)} S {il.ratio:.2f} [{format_ci(il)}]"
    if unproven and not rivals:
        own = iv.plain(focus)
        head = (f"{setting_name(focus)} is within {100 * margin:.0f} % of every setting, and S {own.ratio:.2f} "
                f"[{format_ci(own)}] against plain after {own.n} prompts is not yet shown above "
                f"{slo.min_ci_low:g}")
    elif rivals:
        x, v = min(rivals, key=lambda p: lower_bound(p[1]))
        why = (f"{setting_name(x)} could still be more than {100 * margin:.0f} % faster"
               if not iv.within_margin(focus, x, margin)
               else f"{setting_name(x)} cannot be more than {100 * margin:.0f} % faster, but whether either pays "
                    "against plain is still open")  # a rival for paying, not for speed
        head = (f"{setting_name(focus)} vs {setting_name(x)}: paired ratio {v.ratio:.3f} [{format_ci(v)}] after "
                f"{v.n} prompts; {why}")
    else:
        head = f"{lead} could be above or below 1 after {il.n} prompts"
    names = [setting_name(focus), *(setting_name(x) for x, _ in rivals)]
    if leader is not None and setting_name(leader) not in names:
        names.insert(0, setting_name(leader))
    deploys = pays or leader is not None  # as decided, until resolved
    out = _measured(group, shown, il, DEPLOY if deploys else OFF, OPEN, resolved=False)
    out.prompts_needed = max(need) if need else None
    out.tied_with = [x["label"] for x, _ in rivals]
    out.contenders, out.headline = names, head
    # what is open is between settings once one is proven to pay: more prompts need no plain run
    # ... unless nothing between settings is open (no rival): then S against plain is
    out.needs_plain = unproven or not rivals or not deploys
    out.reason = ((f"{lead} pays; " if deploys else "Off until resolved: ") + f"not yet resolved: {head}"
                  + (f"; ≈ {out.prompts_needed} paired prompts would settle it." if need else "."))
    return out


def _fails_marginally(s: Candidate, speed: str, slo: SLO) -> str:
    """"ngram γ=2 (S 1.30) fails latency (TTFT P99) only within 10 % of the SLO" (``speed``: the parenthesis)."""
    return (f"{setting_name(s)} ({speed}) fails {' and '.join(marginally_blocked(s, slo))} "
            f"only within {100 * slo.margin:.0f} % of the SLO")


def off_by_gates(group: DecisionGroup, fastest: Candidate, measured: Sequence[Candidate], iv: PairedIntervals,
                 slo: SLO) -> Verdict:
    """Off when every setting fails a gate. The cause named is speed when even the fastest does not pay
    (a gate that fails on a setting slower than plain is not why speculation is off), else the gate."""
    ifast = iv.plain(fastest)
    status = against_plain(ifast, slo)
    blocked = blocking_gates(fastest["gates"], slo)
    lead = f"{setting_name(fastest)} (S {ifast.ratio:.2f} [{format_ci(ifast)}])"
    if status in (NO_GAIN, SLOWER_THAN_PLAIN):
        why = (f"S < 1: the fastest setting, {lead}, is slower than plain" if status == SLOWER_THAN_PLAIN else
               f"no practical gain: the fastest setting, {lead}, is within {100 * slo.equivalence_margin:.0f} % "
               "of plain")
    else:
        evidence = "; ".join(f"{g}: {fastest['gates'][g].get('evidence', '')}" for g in blocked)
        why = (f"the fastest setting, {lead}, fails the {' and '.join(blocked)} gate"
               f"{'s' if len(blocked) > 1 else ''} ({evidence})")
    marginal = [s for s in measured if marginally_blocked(s, slo) and iv.pays(s, slo) == PAYS]
    out = _measured(group, fastest, ifast, OFF, OPEN if marginal else OFF, resolved=not marginal)
    out.headline, out.reason = why, f"Off: {why}."
    if marginal:
        parts = [_fails_marginally(s, f"S = {s['speedup']:.2f}", slo) for s in marginal]
        out.headline += "; open on the gates"
        out.contenders = [setting_name(s) for s in marginal]
        out.reason += f" Not yet resolved on the gates: {'; '.join(parts)}; a rerun may decide otherwise."
    return out


def open_on_gates(v: Verdict, leader: Candidate, hinge: Sequence[Candidate], slo: SLO) -> None:
    """``v`` made open: the settings in ``hinge``, faster than its ``leader``, fail a gate only within the SLO's
    margin (a rerun could pass them); they join the contenders."""
    parts = [_fails_marginally(x, f"S {x['speedup']:.2f}", slo) for x in hinge]
    v.resolved, v.resolution = False, OPEN
    v.contenders = list(dict.fromkeys([*(v.contenders or [setting_name(leader)]), *(setting_name(x) for x in hinge)]))
    v.headline += "; open on the gates: " + "; ".join(parts)
    v.reason += f" Not yet resolved on the gates: {'; '.join(parts)}; a rerun may decide otherwise."


def add_caveats(v: Verdict, picked: Candidate, slo: SLO) -> None:
    """The deployed setting's gates that pass only within the SLO's margin, and those not assessed, said in the
    reason."""
    passes = marginal_gates(picked, [g for g in GATES if g not in blocking_gates(picked["gates"], slo)])
    if passes:
        v.reason += (f" {setting_name(picked)} passes {' and '.join(passes)} only within "
                     f"{100 * slo.margin:.0f} % of the SLO.")
    caveat = not_assessed(picked)
    if caveat:
        v.reason += f" Not assessed: {', '.join(caveat)}."


def control_verdict(group: DecisionGroup, measured: Sequence[Candidate], rep: float | None) -> Verdict:
    """A control (random tokens): reported with its fastest setting and plain's own repetition, never deployed."""
    fastest = max(measured, key=lambda s: s["speedup"]) if measured else None
    seen = f"; its fastest setting, {setting_name(fastest)}, measured S = {fastest['speedup']:.2f}" if fastest else ""
    rep_text = (f"plain decoding's replies to random tokens repeat themselves: {100 * rep:.0f} % of their "
                "4-grams occurred earlier in the same reply, which the n-gram and suffix drafters copy"
                if rep is not None else "no plain output long enough to measure its repetition")
    out = group.verdict(CONTROL, CONTROL, resolved=True)
    out.label = "control"
    out.speedup = fastest["speedup"] if fastest else None
    out.setting = setting_name(fastest) if fastest else None
    out.repeated_ngram_fraction = rep
    out.headline = "control, never deployed" + (f" (fastest {setting_name(fastest)} S {fastest['speedup']:.2f})"
                                                if fastest else "")
    out.reason = (f"Control, never deployed: random token ids have no structure to predict, so any speed-up "
                  f"here comes from the model's own output, not the workload; {rep_text}{seen}.")
    return out


def out_of_reach(plain_latency: GateResult | None, load: int) -> str | None:
    """"SLO out of reach at load L even without speculation (plain TTFT P99 2348 ms > 2000 ms)" when plain
    decoding's own latency gate fails at this load, else None."""
    if plain_latency is None or plain_latency.status != FAIL:
        return None
    over = [p.strip() for p in plain_latency.evidence.split(",") if ">" in p]
    return (f"SLO out of reach at load {load} even without speculation "
            f"(plain {', '.join(over) or plain_latency.evidence})"
            "; speculation is judged on what it changes")


__all__ = ["add_caveats", "comparison", "control_verdict", "deploy_verdict", "no_data_verdict", "off_by_gates",
           "off_verdict", "open_on_gates", "open_verdict", "out_of_reach", "shown_through"]
