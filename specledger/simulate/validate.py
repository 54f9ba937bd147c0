"""The simulator against a real serving sweep, point by point (``benchmarks/bench_simulator.py``).

For every concurrency point (load c, setting plain or drafter γ=g, repeat r) of a
``sweep --experiment serving`` run, the simulator serves the same prompts in the same order at the
same load, with acceptance from the run's per-prompt chains measured at that γ
(:func:`~specledger.simulate.measured_run.tables_per_gamma`; draws keyed per prompt: the sweep is
greedy, so a prompt served twice accepts alike both times) and a cost profile (with its measured
step-to-step jitter), averaged over ``seeds`` simulations. Honest by default:
leave-one-repeat-out -- the steps of repeat r are predicted with costs fitted on the *other*
repeats' steps (:func:`specledger.simulate.profile.fit_serving_cost`); with one repeat the fit is
in-sample and labelled so; ``cost`` given (a calibrated profile) replaces the fit altogether.

Real figures per repeat: throughput = that repeat's tokens / wall (``serving.json``), TTFT/TPOT P50
and chunk ITL P99 from its records (:func:`specledger.analysis.metrics.latency_stats`). Each side's
figure is the mean over repeats; error = (simulated - real) / real. Crossover per load: the smallest
γ whose speed-up over plain at that load is below 1 (None: speculation paid at every γ measured).
The crossover is also checked against what the measurement resolves: a γ whose real repeats' paired
speed-ups fall on both sides of 1 ('~1') cannot place the crossover; ``consistent`` = the simulated
speed-up is on the real side at every γ the repeats resolve. Beside each speculative point: the ITL P99 and
TPOT P50 of the mean-only model (every request the
pooled chain, E[K] committed every round -- inference-sim's), to show what the spread adds.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from specledger.analysis.metrics import latency_stats
from specledger.engine.drafters.catalog import PLAIN
from specledger.errors import require
from specledger.ledger.speedup import best_point
from specledger.simulate.arrivals import closed_loop
from specledger.simulate.measured_run import RunSource, plain_table, tables_per_gamma, workload_order
from specledger.simulate.profile import fit_serving_cost
from specledger.simulate.results import CrossoverCheckDict, SpeedupSidesDict, ValidationDict, ValidationRowDict
from specledger.simulate.simulator import simulate
from specledger.simulate.state import ServerConfig

METRICS = ("throughput_tok_s", "tpot_p50_ms", "ttft_p50_ms", "itl_p99_ms")
TOLERANCE = {"throughput_tok_s": 0.05, "tpot_p50_ms": 0.10, "ttft_p50_ms": 0.10, "itl_p99_ms": 0.15}


def parse_setting(setting: str) -> tuple[str, int | str]:
    """``"plain"`` -> (``PLAIN.name``, 0); ``"ngram γ=4"`` -> ("ngram", 4); policies keep their name."""
    if setting == "plain":
        return PLAIN.name, 0
    m = re.fullmatch(r"(\S+) γ=(\S+)", setting)
    require(m is not None, f"unrecognised serving setting {setting!r}")
    g = m.group(2)  # type: ignore[union-attr]
    return m.group(1), int(g) if g.isdigit() else g  # type: ignore[union-attr]


def real_metrics(records: Sequence[Any], wall_s: float) -> dict[str, float | None]:
    lat = latency_stats(records)
    tokens = sum(r.output_tokens for r in records)
    return {"throughput_tok_s": tokens / wall_s if wall_s > 0 else math.nan,
            "tpot_p50_ms": lat["tpot_ms"]["p50"], "ttft_p50_ms": lat["ttft_ms"]["p50"],
            "itl_p99_ms": lat["itl_chunk_ms"]["p99"],
            "preemptions": sum(r.extra.get("preemptions", 0) for r in records)}


def _walls(run: RunSource) -> dict[tuple, list[float]]:
    out: dict[tuple, list[float]] = {}
    for p in (run.serving or {}).get("concurrency", []):
        out[(p["kind"], p["load"], p["setting"])] = [x["wall_s"] for x in p.get("repeats", [])]
    return out


def blocked_noise(matrix: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """The measurement's own noise with the machine's drift common to a repeat taken out: the pooled
    residual sd of log(figure) in a randomized-block design (rows = settings at one load, columns =
    repeats; the sweep serves a load's settings back to back within each repeat, so a slow minute of
    the machine moves every setting of that repeat alike), and its degrees of freedom.

    log y_sr = μ_s + β_r + ε_sr;  s² = Σ (log y_sr − ȳ_s· − ȳ_·r + ȳ··)² / ((S − 1)(R − 1)).
    The half-width of setting s's mean relative to the repeats' common level is then
    t_{(S−1)(R−1), 0.975} · s / √R (relative, since the logs are taken). None with fewer than two
    settings or repeats, or a missing / non-positive figure."""
    y = np.asarray(matrix, dtype=float)
    if y.ndim != 2 or y.shape[0] < 2 or y.shape[1] < 2 or not np.all(np.isfinite(y)) or np.any(y <= 0):
        return None
    y = np.log(y)
    resid = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    dof = (y.shape[0] - 1) * (y.shape[1] - 1)
    return float(np.sqrt((resid ** 2).sum() / dof)), dof


def half_width(rel_sd: float, repeats: int, groups: int) -> float:
    """95 % half-width (relative) of a mean over ``repeats`` at relative sd ``rel_sd``: Student t with
    (groups − 1)(repeats − 1) degrees of freedom when blocked over ``groups`` settings, repeats − 1 when not
    (``groups`` = 1)."""
    from scipy.stats import t

    dof = (repeats - 1) * (groups - 1 if groups > 1 else 1)
    return float(t.ppf(0.975, dof) * rel_sd / math.sqrt(repeats))


def _blocked(rows: list[ValidationRowDict]) -> None:
    """Per (kind, load) and metric: the noise with the repeat's common drift removed (:func:`blocked_noise`)
    becomes the point's ``real_ci_half`` (what decides whether it can be judged); the plain repeats' own
    half-width stays as ``real_ci_half_unblocked``."""
    groups: dict[tuple, list[ValidationRowDict]] = defaultdict(list)
    for r in rows:
        groups[(r["kind"], r["load"])].append(r)
    for rs in groups.values():
        for m in METRICS:
            reps = [r[m]["real_repeats"] for r in rs]
            if len({len(x) for x in reps}) != 1 or any(v is None for x in reps for v in x):
                continue
            noise = blocked_noise(reps)
            if noise is None:
                continue
            sd, _ = noise
            for r in rs:
                v = r[m]
                v["real_ci_half_unblocked"] = v["real_ci_half"]
                v["noise"] = {"method": "blocked by repeat", "rel_sd": sd, "settings": len(rs), "repeats": len(reps[0])}
                v["real_ci_half"] = half_width(sd, len(reps[0]), len(rs))


def mean_ci_half(values: Sequence[float]) -> float:
    """Half-width of the 95 % Student-t interval of the mean of ``values`` (n ≥ 2):
    t_{n−1, 0.975} · sd / √n (:func:`half_width`, unblocked). It shrinks as repeats are added, where the
    range (max − min) grows."""
    return half_width(float(np.std(values, ddof=1)), len(values), 1)


def validate(run: RunSource, cost: Any = None, seeds: int = 16, max_gamma: int = 16, jitter: bool = True,
             per: str = "prompt", chains: str = "per-gamma") -> ValidationDict:
    """Real vs simulated figures at every concurrency point of ``run`` (see the module docstring)."""
    require(run.serving is not None, f"{run.path} has no serving.json; give a `sweep --experiment serving` run")
    points = {k: v for k, v in run.points().items() if k[0] == "concurrency"}
    require(bool(points), f"{run.path} has no concurrency points to compare with")
    walls = _walls(run)
    order_ids = run.prompt_order()
    recs = run.serving_records()
    repeats = sorted({k[3] for k in points})
    tables: dict[tuple, tuple] = {(PLAIN.name, 0): plain_table(recs)}
    settings = {parse_setting(k[2]) for k in points}
    for d in {s[0] for s in settings} - {PLAIN.name}:
        per_g = tables_per_gamma(recs, d, sorted({g for dd, g in settings if dd == d}, key=str), max_gamma, chains)
        tables.update({(d, g): t for g, t in per_g.items()})
    costs = {}
    for r in repeats:
        if cost is not None:
            costs[r] = cost
        else:
            train = [x for x in recs if int(x.extra.get("repeat", 0)) != r] or recs
            label = ("in-sample: fitted on the same (only) repeat" if len(repeats) == 1
                     else f"fitted on the steps of repeats other than {r}")
            costs[r] = fit_serving_cost(train, source=f"serving-run steps ({label})")
    rows: list[ValidationRowDict] = []
    for (kind, load, setting) in sorted({k[:3] for k in points}, key=lambda k: (k[1], k[2])):
        drafter, gamma = parse_setting(setting)
        table, index = tables[(drafter, gamma)]
        per_real, per_sim = [], []
        for r in repeats:
            rs = points.get((kind, load, setting, r))
            wall = walls.get((kind, load, setting), [])
            if not rs or r >= len(wall):
                continue
            per_real.append(real_metrics(rs, wall[r]))
            n = len(rs)
            order = workload_order(order_ids or sorted({x.prompt_id for x in rs}), index, n)
            sims = [simulate(table, closed_loop(int(load)), n, costs[r], gamma, drafter,
                             ServerConfig(max_num_seqs=int(load)), order=order, seed=s, jitter=jitter,
                              per=per).metrics()
                    for s in range(seeds)]
            sim = {m: float(np.mean([s[m] for s in sims])) for m in (*METRICS, "preemptions")}
            if drafter != PLAIN.name:  # the inference-sim model: the mean chain, E[K] every round
                det = simulate(table.mean_only(deterministic=True), closed_loop(int(load)), n, costs[r], gamma,
                               drafter, ServerConfig(max_num_seqs=int(load)), order=order, seed=0).metrics()
                sim["itl_p99_ms_mean_only"] = det["itl_p99_ms"]
                sim["tpot_p50_ms_mean_only"] = det["tpot_p50_ms"]
            per_sim.append(sim)
        if not per_real:
            continue
        row: ValidationRowDict = {"kind": kind, "load": load, "setting": setting, "drafter": drafter, "gamma": gamma,
                                  "repeats": len(per_real)}
        for m in METRICS:
            real = float(np.mean([x[m] for x in per_real if x[m] is not None]))
            sim = float(np.mean([x[m] for x in per_sim]))
            reps = [x[m] for x in per_real if x[m] is not None]
            row[m] = {"real": real, "sim": sim, "error": (sim - real) / real if real else None,
                      "real_repeats": [x[m] for x in per_real],
                      "within": abs(sim - real) <= TOLERANCE[m] * abs(real) if real else None,
                      # the measurement's own noise floor: how far the real repeats fall from each other
                      "real_spread": (max(reps) - min(reps)) / real if len(reps) > 1 and real else None,
                      # what the real figure (the mean of the repeats) is known to: the 95 % t-interval's
                      # half-width over the mean
                      "real_ci_half": None, "noise": None}
            if len(reps) > 1 and real:
                rel_sd = float(np.std(reps, ddof=1) / abs(real))
                row[m]["noise"] = {"method": "repeats", "rel_sd": rel_sd, "settings": 1, "repeats": len(reps)}
                row[m]["real_ci_half"] = half_width(rel_sd, len(reps), 1)
        for m in ("itl_p99_ms_mean_only", "tpot_p50_ms_mean_only"):
            vals = [x[m] for x in per_sim if x.get(m) is not None]
            row[m] = float(np.mean(vals)) if vals else None
        rows.append(row)
    _blocked(rows)
    _speedups(rows)
    return {"points": rows, "crossover": crossovers(rows), "cost_source": {r: c.source for r, c in costs.items()},
            "tolerance": TOLERANCE, "seeds": seeds, "jitter": jitter, "per": per, "chains": chains}


def _speedups(rows: list[ValidationRowDict]) -> None:
    """Speed-up over plain at the same load, real and simulated; ``real_repeats``: repeat r's throughput
    over plain's in repeat r (the sweep runs them side by side)."""
    base = {(r["kind"], r["load"]): r for r in rows if r["drafter"] == PLAIN.name}
    for r in rows:
        b = base.get((r["kind"], r["load"]))
        if b is not None:
            r["speedup"] = {side: r["throughput_tok_s"][side] / b["throughput_tok_s"][side] for side in ("real", "sim")}
            pairs = zip(r["throughput_tok_s"].get("real_repeats", []), b["throughput_tok_s"].get("real_repeats", []))
            r["speedup"]["real_repeats"] = [x / y for x, y in pairs if x is not None and y]


def _side(speedup: SpeedupSidesDict) -> str:
    """'>1' / '<1' when every real repeat's speed-up falls on that side of 1, '~1' when they straddle it."""
    reps = speedup.get("real_repeats") or [speedup["real"]]
    return ">1" if min(reps) > 1.0 else "<1" if max(reps) < 1.0 else "~1"


def crossovers(rows: Sequence[ValidationRowDict]) -> list[CrossoverCheckDict]:
    """Per (load, drafter): the smallest static γ whose speed-up is below 1, real and simulated, and the best γ."""
    by: dict[tuple, list[ValidationRowDict]] = defaultdict(list)
    for r in rows:
        if r["drafter"] != PLAIN.name and isinstance(r["gamma"], int) and "speedup" in r:
            by[(r["load"], r["drafter"])].append(r)
    out: list[CrossoverCheckDict] = []
    for (load, drafter), rs in sorted(by.items()):
        rs = sorted(rs, key=lambda r: r["gamma"])
        real, sim = _crossing(rs, "real"), _crossing(rs, "sim")
        # resolved by the measurement? a γ whose real repeats straddle 1 cannot say on which side it lies
        real_sides = {r["gamma"]: _side(r["speedup"]) for r in rs}
        out.append({"load": load, "drafter": drafter, "crossover_real": real[0], "best_real": real[1],
                    "crossover_sim": sim[0], "best_sim": sim[1], "same": real[0] == sim[0], "real_sides": real_sides,
                    "consistent": all(side == "~1" or (side == ">1") == (r["speedup"]["sim"] > 1.0)
                                      for r, side in zip(rs, real_sides.values()))})
    return out


def _crossing(rows: Sequence[ValidationRowDict], side: str) -> tuple[int | None, int]:
    """(the smallest γ of ``rows`` (sorted by γ) whose ``side`` speed-up is below 1, None if none; the best γ, 0
    where none beats plain)."""
    crossover = next((r["gamma"] for r in rows if r["speedup"][side] < 1.0), None)
    gamma, speed = best_point((r["gamma"], r["speedup"][side]) for r in rows)
    return crossover, gamma if speed > 1.0 else 0
