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
from typing import Any

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


def load_of(v: dict[str, Any]) -> int:
    """A verdict's or scenario's load (1 when unset, as in runs before loads existed)."""
    return int(v.get("load") or 1)


def cat_key(x: dict[str, Any]) -> tuple[str, float]:
    """(category, temperature) of a verdict, scenario or schedule entry."""
    return str(x["category"]), float(x.get("temperature") or 0.0)


def slug(key: tuple[str, float]) -> str:
    """An HTML id fragment for (category, temperature): ``code-T0``, ``qa-T0.7``."""
    cat = re.sub(r"[^A-Za-z0-9_-]+", "-", key[0]).strip("-") or "category"
    return f"{cat}-T{key[1]:g}"


def decision_text(v: dict[str, Any]) -> str:
    """"deploy ngram γ=4", "off", "no decision", "control"."""
    d = v.get("decision")
    if d == "deploy":
        return f"deploy {v.get('drafter')} γ={v.get('gamma')}"
    if d == "no-decision":
        return "no decision"
    if d == "control":
        return "control"
    return "off"


def status_of(v: dict[str, Any]) -> tuple[str, str]:
    """(status text, css class) from ``resolution`` when present, else from ``resolved``."""
    res = v.get("resolution")
    if v.get("decision") == "control" and res is None:
        res = "control"
    if res in RESOLUTIONS:
        return RESOLUTIONS[res]
    if v.get("decision") == "no-decision":
        return "no data", "open"
    return ("resolved", "resolved") if v.get("resolved", True) else ("open", "open")


#: how every measured S and paired ratio is estimated, wherever it is shown (summary.json ``intervals``)
INTERVAL_METHOD = ("ratio of per-prompt totals (Σ tokens ÷ Σ time), paired on the prompts both sides ran, with its "
                   "confidence sequence over those prompts (specledger.analysis.sequential): it holds at every look "
                   "of the race at once; unbounded below 4 prompts")
#: the one other estimator of an S interval: a simulated load's, which is no measurement
SIMULATED_INTERVAL = "the simulator's 95 % prompt bootstrap, widened by its error at the measured loads"


def ci_level(slo: dict[str, Any]) -> int:
    """The level of the verdicts' S intervals in percent: the paired ``1 − decision_alpha`` confidence sequences
    (:func:`specledger.analysis.sequential.interval_level`) where the SLO has that key, else the 95 % bootstrap of
    runs before it."""
    return round(100 * _level(slo))


def _level(slo: dict[str, Any]) -> float:
    """1 − decision_alpha (:func:`specledger.analysis.sequential.interval_level`), else 0.95."""
    from specledger.analysis.sequential import interval_level

    alpha = slo.get("decision_alpha")
    return interval_level(float(alpha)) if isinstance(alpha, (int, float)) else 0.95


def ci_name(slo: dict[str, Any]) -> str:
    """"95 % CI (confidence sequence over prompts)": the name and level every table, plot and line gives the
    measured intervals (:data:`INTERVAL_METHOD`)."""
    return f"{ci_level(slo)} % CI (confidence sequence over prompts)"


def interval_spec(slo: dict[str, Any]) -> dict[str, Any]:
    """summary.json's ``intervals``: the level (1 − decision_alpha), the method, what n counts, and the simulated
    loads' other estimator."""
    return {"level": _level(slo),
            "method": INTERVAL_METHOD,
            "n": "prompts: each figure's own (a verdict's prompts, a comparison's n, a scenario's paired_prompts)",
            "simulated": f"simulated loads: {SIMULATED_INTERVAL}"}


def ci_note(v: dict[str, Any]) -> str | None:
    """What a verdict's shown S interval needs said beside it: a deploy shown faster than plain through another
    setting (its own interval does not clear min_ci_low: ``shown_through``), or a simulated interval."""
    if (v.get("shown_through") or {}).get("text"):
        return str(v["shown_through"]["text"])
    if v.get("simulated") and v.get("speedup") is not None:
        return f"interval: {SIMULATED_INTERVAL}"
    return None


def _int_gamma(s: dict[str, Any]) -> bool:
    g = s.get("gamma")
    return isinstance(g, int) and not isinstance(g, bool)


def solo_el(summary: dict[str, Any]) -> dict[tuple, float]:
    """(category, temperature, drafter, γ) -> E[L] of the solo scenario (chains only)."""
    out = {}
    for s in summary.get("scenarios") or []:
        el = (s.get("rounds") or {}).get("el_full")
        if el is not None and not s.get("tree_budget"):
            out[(*cat_key(s), s.get("drafter"), s.get("gamma"))] = el
    return out


def settings_at(summary: dict[str, Any], key: tuple[str, float], load: int, solo_load: int) -> list[dict[str, Any]]:
    """The scenarios of ``key`` decided at ``load``: the solo ones at the run's solo load, the load points
    (``load_scenarios``, measured or simulated) elsewhere."""
    if load == solo_load:
        rows = [s for s in summary.get("scenarios") or [] if "load" not in s or load_of(s) == load]
    else:
        rows = [s for s in summary.get("load_scenarios") or [] if load_of(s) == load]
    return [s for s in rows if cat_key(s) == key]


def fastest(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The row with the highest measured S (None when none has one)."""
    scored = [s for s in rows if s.get("speedup") is not None]
    return max(scored, key=lambda s: s["speedup"]) if scored else None


def _ci(x: dict[str, Any] | None) -> tuple[float | None, float | None]:
    ci = (x or {}).get("speedup_ci") or [None, None]
    return (ci[0], ci[1]) if len(ci) == 2 else (None, None)


def verdict_row(v: dict[str, Any], summary: dict[str, Any], solo_load: int,
                els: dict[tuple, float] | None = None) -> dict[str, Any]:
    """What one verdict shows: decision, S [CI] on n prompts (of the chosen setting, else of the fastest, named;
    ``ci_note``: what its interval needs said, :func:`ci_note`), E[L], status, the one reason (``headline``;
    ``short``: cut for the answer table) and the full one."""
    key, load = cat_key(v), load_of(v)
    els = solo_el(summary) if els is None else els
    s, (lo, hi), s_of, n = v.get("speedup"), _ci(v), None, v.get("prompts")
    drafter, gamma = v.get("drafter"), v.get("gamma")
    if v.get("decision") == "no-decision":  # too few rounds: any S would be prefill timing noise
        s, lo, hi, n = None, None, None, None
    elif v.get("decision") != "deploy":
        best = fastest(settings_at(summary, key, load, solo_load))
        if best is not None:
            drafter, gamma = best.get("drafter"), best.get("gamma")
            if s is None:
                s, (lo, hi), n = best["speedup"], _ci(best), best.get("paired_prompts")
        if s is not None:
            named = v.get("setting") not in (None, "off", "control", "no-decision")
            s_of = v.get("setting") if named else (f"{drafter} γ={gamma}" if best is not None else None)
    el = v.get("mean_committed")
    if el is None:
        el = els.get((*key, drafter, gamma))
    status, status_css = status_of(v)
    reason = v.get("reason") or ""
    headline = v.get("headline") or first_sentence(reason)
    out_of_reach = v.get("slo_out_of_reach")
    return {
        "category": key[0], "temperature": key[1], "load": load, "simulated": bool(v.get("simulated")),
        "id": slug(key), "decision": decision_text(v), "css": DECISIONS.get(v.get("decision"), "off"),
        "speedup": s, "ci": (lo, hi), "n": n or None, "ci_note": ci_note(v), "speedup_of": s_of, "el": el,
        "status": status, "status_css": status_css,
        "headline": headline, "short": shorten(headline), "reason": reason,
        "out_of_reach": out_of_reach if out_of_reach and out_of_reach not in headline else None,
        "prompts": v.get("prompts"), "comparisons": v.get("comparisons") or [],
        "dropped": v.get("dropped") or [], "tied_with": v.get("tied_with") or [],
    }


def grouped_verdicts(summary: dict[str, Any]) -> dict[tuple[str, float], list[dict[str, Any]]]:
    """(category, temperature) -> its verdicts sorted by load, in the summary's order of categories."""
    out: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for v in summary.get("verdicts") or []:
        out.setdefault(cat_key(v), []).append(v)
    return {k: sorted(vs, key=load_of) for k, vs in out.items()}


def leading(verdicts: Sequence[dict[str, Any]], target_load: int | None) -> dict[str, Any]:
    """The verdict at ``target_load`` when set and decided, else the one at the lowest load."""
    at_target = [v for v in verdicts if target_load is not None and load_of(v) == int(target_load)]
    return at_target[0] if at_target else min(verdicts, key=load_of)


def solo_load_of(summary: dict[str, Any]) -> int:
    """The load the solo scenarios were measured at (:func:`specledger.report.summary.measured_load`)."""
    from specledger.report.summary import measured_load

    return measured_load(summary.get("meta") or {})


def answer_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One :func:`verdict_row` per (category, temperature): its leading verdict."""
    target = (summary.get("slo") or {}).get("target_load")
    solo, els = solo_load_of(summary), solo_el(summary)
    return [verdict_row(leading(vs, target), summary, solo, els) for vs in grouped_verdicts(summary).values()]


def crossover_points(summary: dict[str, Any], key: tuple[str, float]) -> dict[str, list[dict[str, Any]]]:
    """Setting label ("ngram γ=4") -> its S at every load decided, sorted by load: ``load``, ``speedup``,
    ``ci``, ``n`` (its prompts), ``simulated`` (chains with an integer γ only; trees and policies have no load
    points)."""
    solo = solo_load_of(summary)
    out: dict[str, list[dict[str, Any]]] = {}
    rows = [(s, solo, False) for s in summary.get("scenarios") or [] if "load" not in s]
    rows += [(s, load_of(s), bool(s.get("simulated"))) for s in summary.get("load_scenarios") or []]
    for s, load, sim in rows:
        if cat_key(s) != key or not _int_gamma(s) or s.get("tree_budget") or s.get("speedup") is None:
            continue
        out.setdefault(f"{s['drafter']} γ={s['gamma']}", []).append(
            {"load": load, "speedup": s["speedup"], "ci": _ci(s), "n": s.get("paired_prompts"), "simulated": sim})
    return {k: sorted(v, key=lambda p: p["load"]) for k, v in out.items()}


def mix_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The one setting for all the traffic (``summary["mix"]``, :mod:`specledger.gates.mix`), one per
    temperature: its :func:`verdict_row` (decision, S on the mix [CI], status, reason) at the solo load, plus
    ``shares`` (category, share in %), ``given`` (the shares are ``--mix``'s, not the workload's) and
    ``settings``, its evidence: each setting's S on the mix [CI] and its S in every category, in ``shares``'
    order."""
    solo = solo_load_of(summary)
    given = bool((summary.get("meta") or {}).get("traffic_mix"))
    out = []
    for m in summary.get("mix") or []:
        weights = m.get("weights") or {}
        settings = [{"setting": s.get("setting"), "speedup": s.get("speedup"), "ci": _ci(s), "n": s.get("prompts"),
                     "per_category": [(s.get("per_category") or {}).get(c) for c in weights]}
                    for s in m.get("settings") or []]
        out.append({**verdict_row(m, summary, solo, {}), "load": solo, "given": given, "settings": settings,
                    "shares": [(c, 100 * float(w)) for c, w in weights.items()]})
    return out


#: the paste-ready configs a schedule entry may carry, in the order shown: (key, engine)
SNIPPETS = (("vllm", "vLLM"), ("trtllm", "TensorRT-LLM"), ("sglang", "SGLang"), ("llama_cpp", "llama.cpp"))


def snippets(schedule: dict[str, Any]) -> list[tuple[str, str]]:
    """(engine, paste-ready text) for each engine config the schedule entry carries, written by the one
    owner of that text (:func:`specledger.gates.schedule.snippet`: JSON, or the flags joined)."""
    from specledger.gates.schedule import snippet

    launched = schedule.get("engine") or {}  # probe --launch: the engine's own command line
    own = [(f"{launched.get('kind')} (as launched)", str(launched["command"]))] if launched.get("command") else []
    return own + [(engine, snippet(schedule, key)) for key, engine in SNIPPETS if schedule.get(key)]


def category_sections(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (category, temperature): ``lead`` (its answer row), ``rows`` (a :func:`verdict_row` per load)
    and ``schedule`` (its ``schedules`` entry, None when absent)."""
    target = (summary.get("slo") or {}).get("target_load")
    solo, els = solo_load_of(summary), solo_el(summary)
    sched = {cat_key(s): s for s in summary.get("schedules") or []}
    return [{"key": key, "id": slug(key), "category": key[0], "temperature": key[1],
             "lead": verdict_row(leading(vs, target), summary, solo, els),
             "rows": [verdict_row(v, summary, solo, els) for v in vs], "schedule": sched.get(key)}
            for key, vs in grouped_verdicts(summary).items()]


__all__ = ["INTERVAL_METHOD", "SIMULATED_INTERVAL", "answer_rows", "category_sections", "ci_level", "ci_name",
           "ci_note", "crossover_points", "decision_text", "first_sentence", "interval_spec", "leading", "mix_rows",
           "shorten", "snippets", "solo_load_of", "status_of", "verdict_row"]
