"""Speculation-length policies side by side at concurrency 1: static γ against dynamic speculation.

Per prompt, side by side (one round of each in turn, :mod:`specledger.engine.interleave`): plain decoding,
the drafter at every static γ, then every dynamic policy (heuristic, ema, goodput, ...). Each setting's
speed-up is taken against plain decoding
on the same prompts, S = (Σtok/Σt)_setting / (Σtok/Σt)_plain, with a paired prompt-bootstrap
95% CI (:func:`specledger.analysis.stats.paired_speedup_bootstrap`).

Policy instances live for the whole experiment: what a policy learns across requests (the
goodput policy's cost line, the EMA's acceptance) carries over, while the engine calls
``reset()`` at the start of every request for per-request state.

"Best static γ in hindsight" is the static γ with the highest measured S. Picking the maximum
of noisy estimates flatters it, so the question "is goodput at least as good?" is answered
within noise: yes when goodput's point estimate is not below the best static one, or when
their 95% CIs overlap; the direct paired ratio goodput / best static (with its CI) is reported
beside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from specledger.bench.experiment import (
    ExperimentHeaderDict,
    GreedyPromptFieldsDict,
    IdenticalDict,
    Progress,
    SettingFiguresDict,
    check_fresh,
    drafter_factory,
    encode_prompts,
    experiment_header,
    greedy_prompt_fields,
    identical,
    setting_figures,
    tag,
)
from specledger.engine.drafters.catalog import NGRAM, PLAIN
from specledger.engine.interleave import SideBySide
from specledger.engine.protocol import StreamArgs, TargetEngine
from specledger.errors import require
from specledger.records import GammaSpec, RequestRecord
from specledger.rundir import POLICIES_JSON, RunDir, json_safe

POLICY_EXPERIMENT = "policies"
DYNAMIC = ("heuristic", "ema", "batch", "goodput")


class PolicySettingDict(SettingFiguresDict):
    """One row of the table: plain, a static γ (a tree's too) or a policy, against plain decoding."""

    setting: str
    kind: str  # "plain", "static", "tree" or "policy"
    gamma: int | str  # a policy's name for a policy
    tree_budget: int  # 0: chains
    correctness: IdenticalDict | None  # outputs identical to plain's (None: plain itself)


class GoodputVsStaticDict(TypedDict):
    """The goodput policy against the best static γ in hindsight: both S with their 95 % intervals, whether they
    overlap, the direct paired ratio and one sentence."""

    best_static: str
    best_static_gamma: int | str
    best_static_speedup: float
    best_static_ci: list[float | None]
    goodput_speedup: float
    goodput_ci: list[float | None]
    ci_overlap: bool | None
    goodput_not_below_point: bool
    goodput_at_least_best_within_noise: bool
    ratio_to_best_static: float
    ratio_ci: list[float | None]
    statement: str


class GoodputLearnedDict(TypedDict):
    """What the goodput policy learned over the experiment."""

    cost_line_s: tuple[float, float] | None  # (c0, c1) of its round time T(γ) = c0 + c1·γ, seconds
    acceptance: float  # its first-position acceptance estimate


class PoliciesDocDict(ExperimentHeaderDict, GreedyPromptFieldsDict):
    """``policies.json``."""

    drafter: str
    static_gammas: list[int]
    tree_budgets: list[int]
    policies: list[str]
    max_tokens: int
    settings: list[PolicySettingDict]
    goodput_vs_best_static: GoodputVsStaticDict | None
    goodput_learned: GoodputLearnedDict | None


def setting_name(gamma: GammaSpec) -> str:
    """``0`` -> "plain", an int -> "γ=4", a policy name -> itself."""
    if gamma == 0:
        return "plain"
    return f"γ={gamma}" if isinstance(gamma, int) else str(gamma)


def intervals_overlap(a: Sequence[float | None], b: Sequence[float | None]) -> bool | None:
    """Whether closed intervals [a0, a1] and [b0, b1] intersect; None if either bound is missing."""
    if any(x is None for x in (*a, *b)):
        return None
    return max(a[0], b[0]) <= min(a[1], b[1])


def compare_to_best_static(settings: Sequence[PolicySettingDict], records: dict[str, list[RequestRecord]],
                           n_resamples: int = 1000, seed: int = 0) -> GoodputVsStaticDict | None:
    """Goodput vs the best static γ in hindsight: CI overlap, the direct paired ratio and one sentence."""
    statics = [s for s in settings if s["kind"] == "static" and s["speedup"] is not None]
    goodput = next((s for s in settings if s["setting"] == "goodput"), None)
    if goodput is None or not statics or goodput["speedup"] is None:
        return None
    best = max(statics, key=lambda s: s["speedup"])
    direct = setting_figures(records["goodput"], records[best["setting"]], n_resamples, seed)
    overlap = intervals_overlap(goodput["speedup_ci"], best["speedup_ci"])
    not_below = goodput["speedup"] >= best["speedup"]
    verdict = bool(not_below or overlap)
    g_lo, g_hi = goodput["speedup_ci"]
    b_lo, b_hi = best["speedup_ci"]

    def ci(lo: float | None, hi: float | None) -> str:
        finite = all(x is not None and math.isfinite(x) for x in (lo, hi))
        return f"{lo:.3f}–{hi:.3f}" if finite else "n/a"

    sentence = (
        f"goodput S = {goodput['speedup']:.3f} (95% CI {ci(g_lo, g_hi)}) vs best static {best['setting']} "
        f"S = {best['speedup']:.3f} (95% CI {ci(b_lo, b_hi)}): "
        + ("goodput is at least as fast" if not_below else
           "within noise (CIs overlap)" if overlap else "goodput is slower beyond noise")
        + f"; paired ratio goodput / {best['setting']} = {direct['speedup']:.3f}"
        + f" (95% CI {ci(*direct['speedup_ci'])})."
    )
    return {
        "best_static": best["setting"],
        "best_static_gamma": best["gamma"],
        "best_static_speedup": best["speedup"],
        "best_static_ci": best["speedup_ci"],
        "goodput_speedup": goodput["speedup"],
        "goodput_ci": goodput["speedup_ci"],
        "ci_overlap": overlap,
        "goodput_not_below_point": not_below,
        "goodput_at_least_best_within_noise": verdict,
        "ratio_to_best_static": direct["speedup"],
        "ratio_ci": [x if math.isfinite(x) else None for x in direct["speedup_ci"]],
        "statement": sentence,
    }


def run_policies(
    engine: TargetEngine,
    items: Sequence[Any],
    drafter: str = NGRAM.name,
    static_gammas: Sequence[int] = (1, 2, 4, 6, 8),
    policies: Sequence[str] = ("heuristic", "ema", "goodput"),
    max_tokens: int = 96,
    out_dir: str | Path = ".",
    seed: int = 0,
    n_resamples: int = 1000,
    progress: Progress | None = None,
    layers: str | None = None,
    draft_path: str | None = None,
    tree_budgets: Sequence[int] = (),
) -> PoliciesDocDict:
    """Plain, every static γ (with every token-tree budget N > 0 of ``tree_budgets`` too: a setting
    "γ=g tree=N", depth <= g) and every policy per prompt (interleaved); traces tagged
    ``extra.experiment = "policies"`` go to ``out_dir/traces.jsonl``, the table to ``policies.json``."""
    from specledger.engine.policy import make_policy
    from specledger.engine.sampling import SamplingParams

    require(drafter != PLAIN.name, "the policy comparison needs a drafter; use --drafter ngram (default)")
    require(all(isinstance(g, int) and g >= 1 for g in static_gammas), "static gammas must be integers >= 1")
    require(len(set(static_gammas)) == len(static_gammas), "static gammas must be distinct")
    for p in policies:
        require(p in DYNAMIC, f"unknown policy {p!r}; choose from {', '.join(DYNAMIC)}")
    require(len(set(policies)) == len(policies), "policies must be distinct")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_fresh(out, POLICY_EXPERIMENT)
    prompts, skipped = encode_prompts(engine, items, max_tokens)

    make = drafter_factory(drafter, engine, layers, draft_path)
    plain = drafter_factory(PLAIN.name, engine)
    instances = {p: make_policy(p) for p in policies}  # one per experiment: learning carries over
    settings: list[tuple[str, str, Any, Any]] = [("plain", "plain", plain, 0)]
    settings += [(setting_name(g), "static", make, g) for g in static_gammas]
    require(all(isinstance(b, int) and b >= 0 for b in tree_budgets), "tree budgets must be integers >= 0")
    budget_of: dict[str, int] = {}
    for g in static_gammas:
        for b in sorted(set(tree_budgets) - {0}):
            budget_of[f"{setting_name(g)} tree={b}"] = b
            settings.append((f"{setting_name(g)} tree={b}", "tree", make, g))
    settings += [(p, "policy", make, instances[p]) for p in policies]
    # warm-up (discarded) with fresh drafters and static gammas only: policies learn from real requests
    for g in (0, max(static_gammas)):
        engine.generate(list(prompts[0].ids), drafter=(plain if g == 0 else make)(), gamma=g,
                        max_tokens=min(max_tokens, 8))

    params = SamplingParams(temperature=0.0, seed=seed)
    by_setting: dict[str, list[RequestRecord]] = {name: [] for name, *_ in settings}
    total, done = len(prompts) * len(settings), 0
    side_by_side = SideBySide()
    for p in prompts:  # a prompt's settings side by side, one round of each in turn
        if progress:
            progress(done, total, f"policies {p.category}: {len(settings)} settings side by side")
        records = side_by_side.run([
            (engine, p.ids, StreamArgs(drafter=factory(), gamma=gamma, params=params, max_tokens=max_tokens,
                                       request_id=f"policies|{p.id}|{name}", tree_budget=budget_of.get(name, 0)))
            for name, _, factory, gamma in settings])
        for (name, kind, _, _), rec in zip(settings, records):
            tag(rec, p, POLICY_EXPERIMENT, name, kind=kind)
            by_setting[name].append(rec)
        RunDir(out).append(records)
        done += len(settings)
    if progress:
        progress(done, total, "policies done")

    base = by_setting["plain"]
    rows: list[PolicySettingDict] = []
    for name, kind, _, gamma in settings:
        row: PolicySettingDict = {
            "setting": name, "kind": kind, "gamma": gamma if isinstance(gamma, int) else name,
            "tree_budget": budget_of.get(name, 0), **setting_figures(by_setting[name], base, n_resamples, seed),
            "correctness": identical(by_setting[name], base) if kind != "plain" else None}
        if kind == "plain":
            row["speedup"], row["speedup_ci"] = 1.0, [None, None]
        rows.append(row)
    rows = json_safe(rows)  # NaN -> None, as in the JSON file
    best = compare_to_best_static(rows, by_setting, n_resamples, seed)
    learned: GoodputLearnedDict | None = None
    if "goodput" in instances:
        gp = instances["goodput"]
        learned = {"cost_line_s": gp.cost_line(), "acceptance": gp.acceptance()}
    result: PoliciesDocDict = {
        **experiment_header(POLICY_EXPERIMENT, engine),
        "drafter": drafter,
        "static_gammas": list(static_gammas),
        "tree_budgets": sorted(set(tree_budgets) - {0}),
        "policies": list(policies),
        "max_tokens": max_tokens,
        **greedy_prompt_fields(prompts, skipped),
        "settings": rows,
        "goodput_vs_best_static": best,
        "goodput_learned": learned,
    }
    return RunDir(out).write_experiment(POLICIES_JSON, result)
