"""One pass over a run's records: every ledger figure per scenario, the reconciliation, the cost
curves and the optimal gamma. Pure: records in, JSON-ready dicts out (times in ms, speeds in tokens/s)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from specledger.analysis.cost_fit import curve_best_gamma, describe_cost, verify_points
from specledger.analysis.metrics import all_rounds, baseline_t0, latency_stats, round_stats, totals
from specledger.analysis.reconcile import reconcile, reconciliation_sentences, why_sentences
from specledger.analysis.scenario import (
    ScenarioKey,
    baseline_key,
    by_prompt,
    group_scenarios,
    restrict,
    shared_prompts,
)
from specledger.analysis.trees import analyze_trees
from specledger.ledger.speedup import best_point
from specledger.records import RequestRecord
from specledger.rundir import json_safe


def per_prompt_totals(
    records: Sequence[RequestRecord], prompts: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, seconds) per prompt, aligned with ``prompts`` (repeats of a prompt are summed)."""
    groups = by_prompt(records)
    tokens = np.array([sum(r.output_tokens for r in groups[p]) for p in prompts], dtype=float)
    seconds = np.array([sum(r.total_time for r in groups[p]) for p in prompts], dtype=float)
    return tokens, seconds


def speedup_figure(prompts: Sequence[str], spec: tuple[np.ndarray, np.ndarray], plain: tuple[np.ndarray, np.ndarray],
                   alpha: float) -> tuple[float, float, float]:
    """(S, low, high) over ``prompts``: S = (Σ tok / Σ t)_spec / (Σ tok / Σ t)_plain from each side's per-prompt
    (tokens, seconds) aligned with ``prompts``, with the decisions' two-sided ``1 − alpha`` confidence sequence
    over those prompts (:func:`specledger.analysis.paired.speedup_interval`, valid at every look of a race); NaN
    bounds where it is unbounded (fewer than 4 prompts at α = 0.05). The one estimator of S that the verdicts,
    the tables and the plots show."""
    from specledger.analysis.paired import PerPrompt, speedup_interval

    def side(tokens: np.ndarray, seconds: np.ndarray) -> PerPrompt:
        return PerPrompt(dict(zip(prompts, tokens.tolist())), dict(zip(prompts, seconds.tolist())))

    iv = speedup_interval(side(*spec), side(*plain), alpha)
    return iv.ratio, iv.lo if math.isfinite(iv.lo) else math.nan, iv.hi if math.isfinite(iv.hi) else math.nan


def analyze_scenario(
    key: ScenarioKey,
    records: Sequence[RequestRecord],
    baseline: Sequence[RequestRecord],
    *,
    alpha: float = 0.05,
    little_gain: float = 1.10,
) -> dict[str, object]:
    """Ledger figures of one speculative scenario against its paired plain baseline.

    Everything comparative (speed-up, reconciliation, why) uses only the prompts both sides ran. ``speedup_ci``
    is :func:`speedup_figure`'s: the decisions' own interval at ``alpha`` (``slo.decision_alpha``), over the
    ``paired_prompts``, so every table and plot that shows it shows the interval the verdict used.
    """
    prompts = shared_prompts(records, baseline)
    spec_p, base_p = restrict(records, prompts), restrict(baseline, prompts)
    out: dict[str, object] = {**key.as_dict(), "paired_prompts": len(prompts)}
    out["totals"] = totals(records)
    out["rounds"] = round_stats(records)
    out["latency"] = latency_stats(records)
    out["memory_bytes"] = peak_memory_bytes(records)
    if not prompts:
        out.update(
            speedup=None,
            speedup_ci=[None, None],
            baseline_tokens_per_s=None,
            paired_tokens_per_s=None,
            t0_ms=None,
            reconciliation=None,
            reconciliation_text=["No baseline requests on the same prompts: nothing to compare."],
            why=[],
        )
        return out
    st, ss = per_prompt_totals(spec_p, prompts)
    bt, bs = per_prompt_totals(base_p, prompts)
    # what the paired decisions (specledger.analysis.paired) compare: per-prompt totals of both sides
    own = sorted(by_prompt(records))  # every prompt this setting ran: settings compare on those both ran
    ot, os_ = per_prompt_totals(records, own)
    out["per_prompt"] = {"prompts": list(prompts), "tokens": st.tolist(), "seconds": ss.tolist(),
                         "base_tokens": bt.tolist(), "base_seconds": bs.tolist(),
                         "own": {"prompts": own, "tokens": ot.tolist(), "seconds": os_.tolist()}}
    point, low, high = speedup_figure(prompts, (st, ss), (bt, bs), alpha)
    t0 = baseline_t0(base_p)
    spec_ledger = {**round_stats(spec_p), **totals(spec_p)}
    base_ledger = {**round_stats(base_p), **totals(base_p)}
    rec = reconcile(spec_ledger, base_ledger, t0, point)
    out.update(
        speedup=point,
        speedup_ci=[low, high],
        paired_tokens_per_s=spec_ledger["tokens_per_s"],
        baseline_tokens_per_s=base_ledger["tokens_per_s"],
        t0_ms=t0 * 1e3,
        reconciliation=rec,
        reconciliation_text=reconciliation_sentences(rec),
        why=why_sentences(spec_ledger, t0, point, little_gain),
    )
    return out


def analyze_baseline(key: ScenarioKey, records: Sequence[RequestRecord]) -> dict[str, object]:
    """The plain-decoding reference of one (category, temperature)."""
    return {
        **key.as_dict(),
        "totals": totals(records),
        "rounds": round_stats(records),
        "latency": latency_stats(records),
        "t0_ms": baseline_t0(records) * 1e3,
        "memory_bytes": peak_memory_bytes(records),
    }


_MEMORY_KEYS = ("peak_memory_bytes", "peak_mem_bytes", "memory_bytes")


def peak_memory_bytes(records: Iterable[RequestRecord]) -> float | None:
    """Largest peak memory any request recorded in ``extra`` (bytes), or None if none did."""
    values = [
        float(r.extra[k]) for r in records for k in _MEMORY_KEYS if isinstance(r.extra.get(k), (int, float))
    ]
    return max(values) if values else None


def optimal_gamma(
    scenarios: Sequence[dict], groups: dict[ScenarioKey, list[RequestRecord]], surface: Any = None,
    replay: Any = None,
) -> list[dict[str, object]]:
    """Predicted vs measured best γ per (category, temperature, drafter). The predicted curve is the run's one
    forecast model's (:mod:`specledger.predict.gamma`: monotone costs, per-request chains, prefill and boundary
    rounds, window levels), in sample, on the ``prompts`` (how many) where plain decoding was measured -- the
    self-check's model, not a decode-only extrapolation. ``predicted_best_gamma`` is the
    argmax over the whole predicted range (``agree``: equal to the measured best), and
    ``predicted_best_gamma_among_run`` the argmax over the γ's the run measured (and plain decoding)."""
    from specledger.predict.gamma import end_to_end_curves

    groups = {k: v for k, v in groups.items() if not k.tree_budget}  # chains' γ (trees: the "trees" section)
    scenarios = [s for s in scenarios if not s.get("tree_budget")]
    curves = end_to_end_curves((r for recs in groups.values() for r in recs), surface, replay)
    by_drafter: dict[tuple, list[ScenarioKey]] = defaultdict(list)
    for key in groups:
        if not key.is_baseline:
            by_drafter[(key.category, key.temperature, key.drafter)].append(key)
    measured = {(s["category"], s["temperature"], s["drafter"], s["gamma"]): s["speedup"] for s in scenarios}
    out = []
    for (cat, temp, drafter), keys in by_drafter.items():
        base = groups.get(baseline_key(keys[0]))
        forecast = curves.get((cat, float(temp), drafter))
        if not base or not forecast or not forecast["curve"]:
            continue
        curve = forecast["curve"]
        static = sorted(k.gamma for k in keys if isinstance(k.gamma, int))
        points = [(g, measured.get((cat, temp, drafter, g))) for g in static]
        points = [(g, s) for g, s in points if s is not None and math.isfinite(s)]
        measured_best = best_point(points) if points else None
        m_best = (measured_best[0] if measured_best[1] > 1.0 else 0) if measured_best else None
        p_best = curve_best_gamma(curve)  # over the whole predicted range: the recommendation
        p_best_run = curve_best_gamma([p for p in curve if p["gamma"] == 0 or p["gamma"] in static])
        out.append(
            {
                "category": cat,
                "temperature": temp,
                "drafter": drafter,
                "curve": curve,
                "prompts": forecast["prompts"],
                "measured": [{"gamma": g, "speedup": s} for g, s in points],
                "predicted_best_gamma": p_best,
                "predicted_best_gamma_among_run": p_best_run,
                "measured_best_gamma": m_best,
                "agree": (p_best == m_best) if m_best is not None else None,
            }
        )
    return out


def _run_cost(groups: dict[ScenarioKey, list[RequestRecord]], surface: Any) -> Any:
    """The run's one measured cost model (:func:`specledger.cost.costmodel.fit_cost_model`) over its solo
    requests, or None without any."""
    from specledger.cost.costmodel import fit_cost_model

    solo = [r for recs in groups.values() for r in recs if r.rounds and all(rd.batch_size <= 1 for rd in r.rounds)]
    return fit_cost_model(solo, source="the run's solo rounds", n_boot=0, surface=surface) if solo else None


def analyze_run(
    records: Iterable[RequestRecord], *, alpha: float = 0.05, little_gain: float = 1.10,
    surface: Any = None, replay: Any = None,
) -> dict[str, object]:
    """Every figure of a run: baselines, scenarios (S with the decisions' interval at ``alpha``,
    :func:`analyze_scenario`), the cost model per drafter, optimal γ. JSON-ready (see
    :func:`specledger.rundir.json_safe`). ``surface`` (the verify surface measured at the run's start) and
    ``replay`` (exact replay of model-free greedy drafters) feed the one measured cost model and the γ curves."""
    groups = group_scenarios(records)
    baselines, scenarios, unpaired = [], [], []
    for key, recs in groups.items():
        if key.is_baseline:
            baselines.append(analyze_baseline(key, recs))
            continue
        base = groups.get(baseline_key(key), [])
        s = analyze_scenario(key, recs, base, alpha=alpha, little_gain=little_gain)
        if not s["paired_prompts"]:
            unpaired.append(key.label)
        scenarios.append(s)
    drafter_rounds: dict[str, list] = defaultdict(list)
    for key, recs in groups.items():
        if not key.is_baseline and not key.tree_budget:  # chain cost models; trees: analyze_trees
            drafter_rounds[key.drafter].extend(all_rounds(recs))
    cost = _run_cost({k: v for k, v in groups.items() if not k.tree_budget}, surface)  # chains; trees: analyze_trees
    models = {d: describe_cost(cost, d, rs) for d, rs in drafter_rounds.items()} if cost is not None else {}
    return json_safe(
        {
            "baselines": baselines,
            "scenarios": scenarios,
            "unpaired": unpaired,
            "cost_models": models,
            "cost_points": {d: verify_points(cost, drafter_rounds[d]) for d in models} if cost is not None else {},
            "optimal_gamma": optimal_gamma(scenarios, groups, surface, replay),
            **({"trees": trees} if (trees := analyze_trees(groups, scenarios)) else {}),
        }
    )  # type: ignore[return-value]
