"""Every run checks its own predictions honestly: leave one γ out, fit without it, predict it, compare.

For each drafter that ran at least two static γ's and each of those γ_h: the cost model and the
acceptance chains are fitted on the run's records *without* that drafter's γ_h records (plain
decoding and the other γ's stay), then the end-to-end speed-up of γ_h is predicted per category
on the prompts where γ_h and plain decoding were both measured -- the speculative time forecast, the
baseline the run's measured plain decoding of those prompts (a user forecasting a new γ has measured
its baseline; only the speculative side is a forecast) -- and compared with the measured

    S = (Σ tokens_spec / Σ time_spec) / (Σ tokens_plain / Σ time_plain)     (same prompts)

error = |S_predicted − S_measured| / S_measured. The check reports every row, the median and the
90th percentile of the errors.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from specledger.cost.costmodel import fit_cost_model
from specledger.engine.drafters.catalog import PLAIN
from specledger.predict.acceptance import AcceptanceModel
from specledger.predict.predict import measured_baseline, predict_category, request_noise, window_levels
from specledger.predict.replay import run_forecast_inputs
from specledger.predict.results import (
    BucketRowDict,
    ErrorSummaryDict,
    HeldOutRowDict,
    MachineNoiseDict,
    PredictionCheckDict,
    ReproducibilityDict,
    ScenarioPredictionDict,
    SpeedupErrorDict,
)
from specledger.records import RequestRecord


def usable(records: Iterable[RequestRecord], temperature: float | None = None) -> list[RequestRecord]:
    """Solo, static-γ chain records of the main job (no side experiments, no token trees: their forecasts are
    :mod:`specledger.predict.tree_forecast`'s) at one temperature (default: the lowest)."""
    recs = [
        r for r in records
        if not r.extra.get("experiment") and isinstance(r.gamma, int) and not r.tree_budget
        and all(rd.batch_size <= 1 for rd in r.rounds)
    ]
    if not recs:
        return []
    t = min(r.temperature for r in recs) if temperature is None else temperature
    return [r for r in recs if abs(r.temperature - t) < 1e-9]


def _pid(r: RequestRecord) -> str:
    return r.prompt_id or r.request_id


def measured_speedup(spec: Sequence[RequestRecord], plain: Sequence[RequestRecord]) -> float:
    """Paired end-to-end speed-up over the prompts both sides ran (NaN if none)."""
    common = {_pid(r) for r in spec} & {_pid(r) for r in plain}
    s = [r for r in spec if _pid(r) in common]
    b = [r for r in plain if _pid(r) in common]
    ts, tb = sum(r.total_time for r in s), sum(r.total_time for r in b)
    ns, nb = sum(r.output_tokens for r in s), sum(r.output_tokens for r in b)
    if not s or ts <= 0 or tb <= 0 or nb <= 0:
        return math.nan
    return (ns / ts) / (nb / tb)


def predict_held_out(
    train: Sequence[RequestRecord],
    test: Sequence[RequestRecord],
    drafter: str,
    gamma: int,
    max_tokens: int | None = None,
    n_boot: int = 0,
    meta: dict[str, Any] | None = None,
    inputs: tuple[Any, Any] | None = None,
) -> list[HeldOutRowDict]:
    """Fit on ``train`` only, predict ``drafter`` at ``gamma`` for each category of ``test`` (its records of
    that setting and plain decoding), and compare. ``train`` must not contain that setting. ``meta`` (the
    run's ``run.json``) brings the measured surface and the prompts' token ids (replay); the replayed
    outputs are the *plain* records of ``train``. ``inputs``: (surface, replayer) already built from the
    run's records, shared (every ``train`` keeps the plain records, so the replayer is the same)."""
    assert not any(r.drafter == drafter and r.gamma == gamma for r in train), "fitted on the γ under test"
    surface, replay = inputs if inputs is not None else run_forecast_inputs(train, meta)
    cost = fit_cost_model(train, source="fitted without the held-out setting", n_boot=10 if n_boot else 0,
                          surface=surface)
    noise = request_noise(cost, train) if n_boot else None
    acc = AcceptanceModel.from_records(train)
    if max_tokens is not None:
        for cat in acc.categories():
            for c in acc.requests(cat, drafter):
                c.max_tokens = max_tokens
    plain_by_cat: dict[str, list[RequestRecord]] = defaultdict(list)
    spec_by_cat: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in test:
        cat = r.category or "default"
        if r.drafter == PLAIN.name:
            plain_by_cat[cat].append(r)
        elif r.drafter == drafter and r.gamma == gamma:
            spec_by_cat[cat].append(r)
    baseline = measured_baseline(train)  # the fit's own plain records
    window = window_levels(cost, train)  # each prompt's side-by-side window, from its other settings only
    rows: list[HeldOutRowDict] = []
    for cat in sorted(spec_by_cat):
        both = {_pid(r) for r in spec_by_cat[cat]} & {_pid(r) for r in plain_by_cat[cat]}
        chains = [c for c in acc.requests(cat, drafter) if c.prompt_id in both]
        if not chains:
            continue
        keep = {c.prompt_id for c in chains}
        spec_kept = [r for r in spec_by_cat[cat] if _pid(r) in keep]
        measured = measured_speedup(spec_kept, [r for r in plain_by_cat[cat] if _pid(r) in keep])
        pred = predict_category(cost, acc, cat, drafter, gamma, chains=chains, n_boot=n_boot, replay=replay,
                                noise=noise, baseline=baseline, window=window)
        if pred is None or not math.isfinite(measured):
            continue
        rows.append({
            "category": cat,
            "drafter": drafter,
            "gamma": gamma,
            "prompts": len(chains),
            "fitted_gammas": sorted({g for c in chains for g in c.gammas}),
            "measured_speedup": measured,
            "predicted_speedup": pred.predicted_speedup,
            "interval": pred.interval,
            "abs_error": abs(pred.predicted_speedup - measured) / measured,
            "covered": bool(pred.interval[0] <= measured <= pred.interval[1]) if n_boot else None,
            "acceptance_source": pred.extra.get("acceptance_source"),
            "predicted_el": pred.extra.get("el"),
            "measured_el": _measured_el(spec_kept),
            "predicted_t_round_ms": pred.extra.get("t_round_ms"),
            "measured_t_round_ms": 1e3 * sum(rd.t_round for r in spec_kept for rd in r.rounds)
            / max(sum(len(r.rounds) for r in spec_kept), 1),
            # the timing-free half of the model: rounds per request follow from acceptance, fill and length
            "predicted_rounds_per_request": pred.rounds_per_request,
            "measured_rounds_per_request": float(np.mean([len(r.rounds) for r in spec_kept])),
        })
    return rows


def _measured_el(records: Sequence[RequestRecord]) -> float | None:
    """Tokens committed per round over the records' rounds (truncated rounds included, as forecasts count them)."""
    n = sum(len(r.rounds) for r in records)
    return sum(rd.committed for r in records for rd in r.rounds) / n if n else None


def machine_noise(records: Iterable[RequestRecord]) -> MachineNoiseDict | None:
    """How much the machine itself moves: P10 / P50 / P90 (ms) of plain decoding's steps, each step scaled
    by its request's median step (so prompts of different lengths do not count as noise) and reported
    at the median step's scale. ``busy``: P90 / P10 > 1.5, the speed figures are not reliable."""
    per_request = [np.array([rd.t_verify for rd in r.rounds]) for r in records
                   if r.drafter == PLAIN.name and len(r.rounds) >= 2 and all(rd.batch_size <= 1 for rd in r.rounds)]
    if len(per_request) < 2:
        return None
    scale = float(np.median(np.concatenate(per_request))) * 1e3
    rel = np.concatenate([t / np.median(t) for t in per_request])
    p10, p50, p90 = (float(np.percentile(rel, q)) * scale for q in (10, 50, 90))
    return {"p10_ms": p10, "p50_ms": p50, "p90_ms": p90, "requests": len(per_request), "steps": int(rel.size),
            "busy": p90 / p10 > 1.5}


def summarize_errors(rows: Sequence[SpeedupErrorDict] | Sequence[BucketRowDict]) -> ErrorSummaryDict:
    errs = [r["abs_error"] for r in rows if r.get("abs_error") is not None and math.isfinite(r["abs_error"])]
    cov = [r["covered"] for r in rows if r.get("covered") is not None]
    return {
        "median_abs_error": float(np.median(errs)) if errs else None,
        "p90_abs_error": float(np.percentile(errs, 90)) if errs else None,
        "max_abs_error": float(np.max(errs)) if errs else None,
        "n": len(errs),
        "interval_coverage": float(np.mean(cov)) if cov else None,
    }


def leave_one_gamma_out(records: Iterable[RequestRecord], max_tokens: int | None = None,
                        meta: dict[str, Any] | None = None, n_boot: int = 0,
                        inputs: tuple[Any, Any] | None = None) -> PredictionCheckDict:
    """The run's self-check (see module docstring): rows, median and P90 absolute relative error."""
    recs = usable(records)
    gammas: dict[str, set[int]] = defaultdict(set)
    for r in recs:
        if r.drafter != PLAIN.name and isinstance(r.gamma, int) and r.gamma > 0:
            gammas[r.drafter].add(r.gamma)
    rows: list[HeldOutRowDict] = []
    for drafter in sorted(gammas):
        if len(gammas[drafter]) < 2:
            continue
        for g in sorted(gammas[drafter]):
            train = [r for r in recs if not (r.drafter == drafter and r.gamma == g)]
            rows += predict_held_out(train, recs, drafter, g, max_tokens, n_boot=n_boot, meta=meta, inputs=inputs)
    out: PredictionCheckDict = {
        "rows": rows, **summarize_errors(rows), "machine_noise": machine_noise(recs),
        "method": "leave one gamma out: fit cost and acceptance without it, predict it, compare end-to-end speed-ups "
                  "on the same prompts",
        "assumption": AcceptanceModel.assumption}
    if not rows:
        out["note"] = "no drafter ran two or more gammas: nothing to hold out"
    return out


def run_prediction_check(records: Iterable[RequestRecord], meta: dict[str, Any] | None = None,
                         inputs: tuple[Any, Any] | None = None) -> PredictionCheckDict:
    """:func:`leave_one_gamma_out` of a run directory's records, with the run's max_tokens from ``run.json``."""
    return leave_one_gamma_out(records, run_max_tokens(meta), meta, inputs=inputs)


def run_max_tokens(meta: dict[str, Any] | None) -> int | None:
    """The run's one output budget from ``run.json``, or None where budgets differ by category (every request then
    keeps its own)."""
    config = (meta or {}).get("config") or {}
    max_tokens = config.get("max_tokens")
    return max_tokens if isinstance(max_tokens, int) and not config.get("category_max_tokens") else None


def scenario_predictions(records: Iterable[RequestRecord], check: PredictionCheckDict,
                         meta: dict[str, Any] | None = None,
                         inputs: tuple[Any, Any] | None = None) -> dict[tuple, ScenarioPredictionDict]:
    """{(category, temperature, drafter, gamma): {"speedup", "kind"}}: the end-to-end model's speed-up of
    every measured static-γ setting of the check's temperature — held out (fitted without that γ, from
    ``check``) where the drafter ran two or more γ's, in sample (fitted on everything) otherwise; both on the
    setting's prompts measured with plain, priced at their window levels, as the check and the S-vs-γ curve
    (:mod:`specledger.predict.gamma`) are."""
    recs = usable(records)
    if not recs:
        return {}
    temp = float(recs[0].temperature)
    out: dict[tuple, ScenarioPredictionDict] = {}
    for r in check.get("rows", []):
        out[(r["category"], temp, r["drafter"], r["gamma"])] = {"speedup": r["predicted_speedup"], "kind": "held out"}
    settings = {(r.category or "default", r.drafter, r.gamma) for r in recs if r.drafter != PLAIN.name}
    missing = [s for s in settings if (s[0], temp, s[1], s[2]) not in out]
    if not missing or not any(r.drafter == PLAIN.name for r in recs):
        return out
    surface, replay = inputs if inputs is not None else run_forecast_inputs(recs, meta)
    cost = fit_cost_model(recs, n_boot=0, surface=surface)
    acc = AcceptanceModel.from_records(recs)
    from specledger.predict.gamma import infer_max_tokens, plain_prompts

    max_tokens, paired, window = infer_max_tokens(recs), plain_prompts(recs), window_levels(cost, recs)
    for cat, drafter, g in missing:
        chains = [c for c in acc.requests(cat, drafter) if c.prompt_id in paired[cat] and g in c.gammas]
        for c in chains:
            c.max_tokens = max_tokens if c.max_tokens is None else c.max_tokens
        p = (predict_category(cost, acc, cat, drafter, g, chains=chains, n_boot=0, replay=replay, window=window)
             if chains else None)
        if p is not None:
            out[(cat, temp, drafter, g)] = {"speedup": p.predicted_speedup, "kind": "in sample"}
    return out


def reproducibility(checks: Sequence[PredictionCheckDict]) -> ReproducibilityDict | None:
    """How far the *measured* side of the in-run check moves between runs of the same prompts: for every
    setting (category, drafter, γ) that two checks (``run_prediction_check`` results, e.g. two ``make
    run``s) both measured, |S_a / S_b − 1|, over every pair of checks; median and P90. If each run's S
    carries independent noise, one measurement's own is about that over √2 -- the floor under any
    forecast's error against a single run. None when no setting was measured twice."""
    measured = [{(r["category"], r["drafter"], r["gamma"]): r["measured_speedup"] for r in c.get("rows", [])}
                for c in checks]
    diffs = [abs(a[k] / b[k] - 1.0) for i, a in enumerate(measured) for b in measured[i + 1:]
             for k in a if k in b and b[k] > 0 and math.isfinite(a[k])]
    if not diffs:
        return None
    med, p90 = float(np.median(diffs)), float(np.percentile(diffs, 90))
    return {"pairs": len(diffs), "runs": len(checks), "median_run_to_run": med, "p90_run_to_run": p90,
            "median_single_run": med / math.sqrt(2), "p90_single_run": p90 / math.sqrt(2)}
