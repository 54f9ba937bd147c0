"""What the report page shows, read off ``summary.json``: the answer (one row per category at the load that
matters, and the one setting for all the traffic, :func:`mix_rows`) and one section per category with its
verdicts at every load and the points of its own plots.

Nothing is decided here (:mod:`specledger.gates` and :mod:`specledger.report.summary` decide); this module only
picks, per (category, temperature), which verdict leads and which numbers sit beside it. Keys the run
may lack (older runs, or a summary written before a key existed) are read with ``.get``:

- the leading verdict is the one at the SLO's ``target_load`` when set and decided, else at the lowest
  load decided;
- its S is the verdict's own ``speedup`` / ``speedup_ci``; for an "off" or "control" verdict that S is the
  fastest setting's (named beside it: ``setting``, else the fastest scenario at that load), which is what
  was weighed and found wanting; a "no-decision" verdict (too few rounds measured) shows none: what it
  measured is prefill timing noise;
- E[L] is the verdict's ``mean_committed`` when present, else the solo ``rounds.el_full`` of the same
  (drafter, γ): at greedy decoding acceptance does not depend on the load;
- the one reason is ``headline`` when present, else the first sentence of ``reason``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypedDict

from specledger.gates.decision import Comparison, LegacyDrop, Verdict
from specledger.report.summary_model import SloFigures, Summary
from specledger.report.summary_rows import Interval, SettingRow
from specledger.report.summary_verdicts import ScheduleEntry

#: decision -> css class
DECISIONS = {"deploy": "deploy", "off": "off", "control": "control", "no-decision": "nodecision"}

#: resolution -> (what the status column says, css class)
RESOLUTIONS = {
    "winner": ("resolved: winner", "resolved"),
    "equivalent": ("resolved: equivalent", "resolved"),
    "off": ("resolved: off", "resolved"),
    "open": ("open", "open"),
    "no-data": ("no data", "open"),
    "control": ("control", "muted"),
}

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")


def first_sentence(text: str | None) -> str:
    """The text up to its first sentence end (". " before a capital); decimals ("1.16") do not end one."""
    if not text:
        return ""
    return _SENTENCE_END.split(text.strip(), maxsplit=1)[0]


def shorten(text: str, limit: int = 150) -> str:
    """``text`` cut to at most ``limit`` characters at a clause boundary (" (", "; ", ", "), " …" marking the
    cut; the answer table shows this, the category section the whole."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    cut = max(head.rfind(" ("), head.rfind("; "), head.rfind(", "))
    return (head[:cut] if cut > limit // 2 else head.rstrip()) + " …"


def slug(key: tuple[str, float]) -> str:
    """An HTML id fragment for (category, temperature): ``code-T0``, ``qa-T0.7``."""
    cat = re.sub(r"[^A-Za-z0-9_-]+", "-", key[0]).strip("-") or "category"
    return f"{cat}-T{key[1]:g}"


def decision_text(v: Verdict) -> str:
    """"deploy ngram γ=4", "off", "no decision", "control"."""
    if v.decision == "deploy":
        return f"deploy {v.drafter} γ={v.gamma}"
    if v.decision == "no-decision":
        return "no decision"
    if v.decision == "control":
        return "control"
    return "off"


def status_of(v: Verdict) -> tuple[str, str]:
    """(status text, css class) from ``resolution`` when present, else from ``resolved``."""
    res = v.resolution
    if v.decision == "control" and res is None:
        res = "control"
    if res in RESOLUTIONS:
        return RESOLUTIONS[res]
    if v.decision == "no-decision":
        return "no data", "open"
    return ("resolved", "resolved") if v.resolved is not False else ("open", "open")


#: how every measured S and paired ratio is estimated, wherever it is shown (summary.json ``intervals``)
INTERVAL_METHOD = ("ratio of per-prompt totals (Σ tokens ÷ Σ time), paired on the prompts both sides ran, with its "
                   "confidence sequence over those prompts (specledger.analysis.sequential): it holds at every look "
                   "of the race at once; unbounded below 4 prompts")
#: the one other estimator of an S interval: a simulated load's, which is no measurement
SIMULATED_INTERVAL = "the simulator's 95 % prompt bootstrap, widened by its error at the measured loads"


def ci_level(slo: SloFigures) -> int:
    """The level of the verdicts' S intervals in percent: the paired ``1 − decision_alpha`` confidence sequences
    (:func:`specledger.analysis.sequential.interval_level`) where the SLO has that key, else the 95 % bootstrap of
    runs before it."""
    return round(100 * _level(slo.decision_alpha))


def _level(alpha: float | None) -> float:
    """1 − decision_alpha (:func:`specledger.analysis.sequential.interval_level`), else 0.95."""
    from specledger.analysis.sequential import interval_level

    return interval_level(float(alpha)) if isinstance(alpha, (int, float)) else 0.95


def ci_name(slo: SloFigures) -> str:
    """"95 % CI (confidence sequence over prompts)": the name and level every table, plot and line gives the
    measured intervals (:data:`INTERVAL_METHOD`)."""
    return f"{ci_level(slo)} % CI (confidence sequence over prompts)"


def interval_spec(decision_alpha: float | None) -> dict[str, float | str]:
    """summary.json's ``intervals`` (:class:`~specledger.report.summary_model.Intervals`): the level (1 −
    decision_alpha), the method, what n counts, and the simulated loads' other estimator."""
    return {"level": _level(decision_alpha),
            "method": INTERVAL_METHOD,
            "n": "prompts: each figure's own (a verdict's prompts, a comparison's n, a scenario's paired_prompts)",
            "simulated": f"simulated loads: {SIMULATED_INTERVAL}"}


def ci_note(v: Verdict) -> str | None:
    """What a verdict's shown S interval needs said beside it: a deploy shown faster than plain through another
    setting (its own interval does not clear min_ci_low: ``shown_through``), or a simulated interval."""
    if v.shown_through is not None and v.shown_through.text:
        return v.shown_through.text
    if v.simulated and v.speedup is not None:
        return f"interval: {SIMULATED_INTERVAL}"
    return None


def _int_gamma(s: SettingRow) -> bool:
    return isinstance(s.gamma, int) and not isinstance(s.gamma, bool)


def solo_el(summary: Summary) -> dict[tuple[str, float, str, int | str], float]:
    """(category, temperature, drafter, γ) -> E[L] of the solo scenario (chains only)."""
    out = {}
    for s in summary.scenarios:
        el = s.rounds.el_full
        if el is not None and not s.tree_budget:
            out[(*s.key, s.drafter, s.gamma)] = el
    return out


def settings_at(summary: Summary, key: tuple[str, float], load: int, solo_load: int) -> list[SettingRow]:
    """The scenarios of ``key`` decided at ``load``: the solo ones at the run's solo load, the load points
    (``load_scenarios``, measured or simulated) elsewhere."""
    if load == solo_load:
        rows = [s for s in summary.scenarios if s.load is None or s.at_load == load]
    else:
        rows = [s for s in summary.load_scenarios if s.at_load == load]
    return [s for s in rows if s.key == key]


def fastest(rows: Sequence[SettingRow]) -> SettingRow | None:
    """The row with the highest measured S (None when none has one)."""
    scored = [(s.speedup, s) for s in rows if s.speedup is not None]
    return max(scored, key=lambda x: x[0])[1] if scored else None


class VerdictRow(TypedDict):
    """What one verdict shows in the report (:func:`verdict_row`)."""

    category: str
    temperature: float
    load: int
    simulated: bool
    id: str  # the category section's HTML id fragment (:func:`slug`)
    decision: str  # :func:`decision_text`
    css: str  # the decision's css class (:data:`DECISIONS`)
    speedup: float | None  # S shown: the chosen setting's, else the fastest's (None: nothing measured)
    ci: Interval  # its interval
    n: int | None  # the prompts it rests on
    ci_note: str | None  # what its interval needs said (:func:`ci_note`)
    speedup_of: str | None  # the setting S is of, where it is not the chosen one
    el: float | None  # E[L] of that setting
    status: str  # :func:`status_of`
    status_css: str
    headline: str  # the one reason
    short: str  # the headline cut for the answer table (:func:`shorten`)
    reason: str  # the whole reason
    out_of_reach: str | None  # the SLO out of reach even for plain, where the headline does not say it
    prompts: int | None  # the verdict's paired prompts
    comparisons: list[Comparison]
    dropped: list[LegacyDrop]  # a verdict's ``dropped``: summaries written before race_dropped only
    tied_with: list[str]


def verdict_row(v: Verdict, summary: Summary, solo_load: int,
                els: dict[tuple[str, float, str, int | str], float] | None = None) -> VerdictRow:
    """What one verdict shows: decision, S [CI] on n prompts (of the chosen setting, else of the fastest, named;
    ``ci_note``: what its interval needs said, :func:`ci_note`), E[L], status, the one reason (``headline``;
    ``short``: cut for the answer table) and the full one."""
    key, load = v.key, v.load_or_solo
    els = solo_el(summary) if els is None else els
    s, (lo, hi), s_of, n = v.speedup, v.speedup_ci, None, v.prompts
    drafter, gamma = v.drafter, v.gamma
    if v.decision == "no-decision":  # too few rounds: any S would be prefill timing noise
        s, lo, hi, n = None, None, None, None
    elif v.decision != "deploy":
        best = fastest(settings_at(summary, key, load, solo_load))
        if best is not None:
            drafter, gamma = best.drafter, best.gamma
            if s is None:
                s, (lo, hi), n = best.speedup, best.speedup_ci, best.paired_prompts
        if s is not None:
            named = v.setting not in (None, "off", "control", "no-decision")
            s_of = v.setting if named else (f"{drafter} γ={gamma}" if best is not None else None)
    el = v.mean_committed
    if el is None and drafter is not None and gamma is not None:
        el = els.get((*key, drafter, gamma))
    status, status_css = status_of(v)
    headline = v.headline or first_sentence(v.reason)
    out_of_reach = v.slo_out_of_reach
    return VerdictRow(
        category=key[0], temperature=key[1], load=load, simulated=bool(v.simulated),
        id=slug(key), decision=decision_text(v), css=DECISIONS.get(v.decision, "off"),
        speedup=s, ci=(lo, hi), n=n or None, ci_note=ci_note(v), speedup_of=s_of, el=el,
        status=status, status_css=status_css,
        headline=headline, short=shorten(headline), reason=v.reason,
        out_of_reach=out_of_reach if out_of_reach and out_of_reach not in headline else None,
        prompts=v.prompts, comparisons=list(v.comparisons), dropped=list(v.dropped or []), tied_with=list(v.tied_with))


def grouped_verdicts(summary: Summary) -> dict[tuple[str, float], list[Verdict]]:
    """(category, temperature) -> its verdicts sorted by load, in the summary's order of categories."""
    out: dict[tuple[str, float], list[Verdict]] = {}
    for v in summary.verdicts:
        out.setdefault(v.key, []).append(v)
    return {k: sorted(vs, key=lambda v: v.load_or_solo) for k, vs in out.items()}


def leading(verdicts: Sequence[Verdict], target_load: int | None) -> Verdict:
    """The verdict at ``target_load`` when set and decided, else the one at the lowest load."""
    at_target = [v for v in verdicts if target_load is not None and v.load_or_solo == int(target_load)]
    return at_target[0] if at_target else min(verdicts, key=lambda v: v.load_or_solo)


def answer_rows(summary: Summary) -> list[VerdictRow]:
    """One :func:`verdict_row` per (category, temperature): its leading verdict."""
    target = summary.slo.target_load
    solo, els = summary.solo_load, solo_el(summary)
    return [verdict_row(leading(vs, target), summary, solo, els) for vs in grouped_verdicts(summary).values()]


class CrossoverPoint(TypedDict):
    """One setting's S at one load (:func:`crossover_points`)."""

    load: int
    speedup: float
    ci: Interval
    n: int | None  # its prompts
    simulated: bool


def crossover_points(summary: Summary, key: tuple[str, float]) -> dict[str, list[CrossoverPoint]]:
    """Setting label ("ngram γ=4") -> its S at every load decided, sorted by load: ``load``, ``speedup``,
    ``ci``, ``n`` (its prompts), ``simulated`` (chains with an integer γ only; trees and policies have no load
    points)."""
    solo = summary.solo_load
    out: dict[str, list[CrossoverPoint]] = {}
    rows = [(s, solo, False) for s in summary.scenarios if s.load is None]
    rows += [(s, s.at_load, bool(s.simulated)) for s in summary.load_scenarios]
    for s, load, sim in rows:
        if s.key != key or not _int_gamma(s) or s.tree_budget or s.speedup is None:
            continue
        out.setdefault(f"{s.drafter} γ={s.gamma}", []).append(
            CrossoverPoint(load=load, speedup=s.speedup, ci=s.speedup_ci, n=s.paired_prompts, simulated=sim))
    return {k: sorted(v, key=lambda p: p["load"]) for k, v in out.items()}


class MixSettingRow(TypedDict):
    """One setting's evidence in the mix's table (:func:`mix_rows`)."""

    setting: str
    speedup: float | None  # S on the mix
    ci: Interval
    n: int | None  # its prompts
    per_category: list[float | None]  # its S in each category, in the shares' order


class MixRow(VerdictRow):
    """The one setting for all the traffic (:func:`mix_rows`): its verdict row and its evidence."""

    given: bool  # the shares are ``--mix``'s, not the workload's
    settings: list[MixSettingRow]
    shares: list[tuple[str, float]]  # (category, share in %)


def mix_rows(summary: Summary) -> list[MixRow]:
    """The one setting for all the traffic (``summary["mix"]``, :mod:`specledger.gates.mix`), one per
    temperature: its :func:`verdict_row` (decision, S on the mix [CI], status, reason) at the solo load, plus
    ``shares`` (category, share in %), ``given`` (the shares are ``--mix``'s, not the workload's) and
    ``settings``, its evidence: each setting's S on the mix [CI] and its S in every category, in ``shares``'
    order."""
    solo = summary.solo_load
    given = bool(summary.meta.traffic_mix)
    return [_mix_row(m, summary, solo, given) for m in summary.mix]


def _mix_row(m: Verdict, summary: Summary, solo: int, given: bool) -> MixRow:
    weights = m.weights or {}
    settings = [MixSettingRow(setting=s.setting, speedup=s.speedup, ci=s.speedup_ci, n=s.prompts,
                              per_category=[s.per_category.get(c) for c in weights])
                for s in m.settings or []]
    return {**verdict_row(m, summary, solo, {}), "load": solo, "given": given, "settings": settings,
            "shares": [(c, 100 * float(w)) for c, w in weights.items()]}


#: the paste-ready configs a schedule entry may carry, in the order shown: (key, engine)
SNIPPETS = (("vllm", "vLLM"), ("trtllm", "TensorRT-LLM"), ("sglang", "SGLang"), ("llama_cpp", "llama.cpp"))


def snippets(schedule: ScheduleEntry) -> list[tuple[str, str]]:
    """(engine, paste-ready text) for each engine config the schedule entry carries, written by the one
    owner of that text (:func:`specledger.gates.schedule.snippet`: JSON, or the flags joined)."""
    from specledger.gates.schedule import snippet

    launched = schedule.engine  # probe --launch: the engine's own command line
    own = [(f"{launched.kind} (as launched)", launched.command)] if launched is not None and launched.command else []
    entry = schedule.model_dump()
    return own + [(engine, snippet(entry, key)) for key, engine in SNIPPETS  # type: ignore[arg-type]
                  if schedule.config(key)]


class CategorySection(TypedDict):
    """One (category, temperature)'s section of the report (:func:`category_sections`)."""

    key: tuple[str, float]
    id: str  # its HTML id fragment
    category: str
    temperature: float
    lead: VerdictRow  # its answer row
    rows: list[VerdictRow]  # a row per load
    schedule: ScheduleEntry | None  # its ``schedules`` entry


def category_sections(summary: Summary) -> list[CategorySection]:
    """Per (category, temperature): ``lead`` (its answer row), ``rows`` (a :func:`verdict_row` per load)
    and ``schedule`` (its ``schedules`` entry, None when absent)."""
    target = summary.slo.target_load
    solo, els = summary.solo_load, solo_el(summary)
    sched = {s.key: s for s in summary.schedules}
    return [CategorySection(key=key, id=slug(key), category=key[0], temperature=key[1],
                            lead=verdict_row(leading(vs, target), summary, solo, els),
                            rows=[verdict_row(v, summary, solo, els) for v in vs], schedule=sched.get(key))
            for key, vs in grouped_verdicts(summary).items()]


__all__ = ["INTERVAL_METHOD", "SIMULATED_INTERVAL", "CategorySection", "CrossoverPoint", "MixRow", "MixSettingRow",
           "VerdictRow", "answer_rows", "category_sections", "ci_level", "ci_name", "ci_note", "crossover_points",
           "decision_text", "first_sentence", "interval_spec", "leading", "mix_rows", "shorten", "snippets",
           "status_of", "verdict_row"]
