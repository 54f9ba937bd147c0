"""The simulator at the run's own loads: ``specledger run --loads 1,16 --simulate-loads 64,256``.

Loads beyond what this machine serves are simulated (:func:`simulate_points`) in the shape of a
measured load point (:mod:`specledger.mainjob.measured_loads`): every setting -- plain decoding and each
drafter × γ the run measured solo (chains only; trees are not simulated) -- serves the run's prompts
closed loop at concurrency L with L sequence slots, max(L, prompts) requests in the given order
(the prompts cycled, categories interleaved), the same requests for every setting. Inputs:

* acceptance: the run's solo chains per prompt (:func:`specledger.simulate.measured_run.tables_per_gamma`,
  one table per γ the run measured), plain's sizes (:func:`~specledger.simulate.measured_run.plain_table`);
* price: one :class:`~specledger.cost.pricer.StepPricer`, given by the caller (the run's own
  measured cost model on its cost surface, as ``cost_model.json``);
* draws keyed per prompt at T = 0 (greedy decoding of a prompt accepts alike every time), per
  request under sampling.

A point of n requests is simulated ``reps`` = ceil(``min_requests`` / n) times (seeds 0, 1, ...)
and pooled as repeats, so a one-wave point still has a few hundred requests behind its figures.

:func:`validation` runs the same simulation at the *measured* loads > 1, with the measured points'
own request order, and compares it with what was measured there (``simulate/validate.py``'s
figures: throughput, TTFT P50, TPOT P50, chunk ITL P99, and the paired speed-up over plain); its
errors, (simulated − measured) / measured, stand beside every simulated verdict.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specledger.analysis.metrics import MS, latency_stats, tpot
from specledger.analysis.stats import paired_speedup_bootstrap
from specledger.engine.drafters.catalog import PLAIN
from specledger.records import RequestRecord, setting_label
from specledger.simulate.arrivals import closed_loop
from specledger.simulate.measured_run import measured_gammas, plain_table, tables_per_gamma, workload_order
from specledger.simulate.results import LoadValidationRowDict
from specledger.simulate.simulator import simulate
from specledger.simulate.state import ServerConfig

#: the figures compared at the measured loads (as :mod:`specledger.simulate.validate`), and the speed-up
VALIDATED = ("throughput_tok_s", "ttft_p50_ms", "tpot_p50_ms", "itl_p99_ms", "speedup")


@dataclass
class SimPoint:
    """One simulated point (a setting at a load and temperature), its requests pooled over ``reps`` seeds.
    Per request (aligned arrays): its prompt, output tokens, latency (arrival -> last token), TTFT, TPOT
    (NaN below two tokens) and longest chunk gap, in seconds."""

    temperature: float
    load: int
    drafter: str
    gamma: int
    prompt_ids: list[str]
    tokens: np.ndarray
    seconds: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    max_gap_s: np.ndarray
    wall_s: float  # makespans summed over the repeats
    itl_token_p99_ms: float | None  # the whole point's (every category), mean over the repeats
    itl_p99_ms: float | None  # chunk ITL P99, the same
    peak_kv_tokens: int
    preemptions: int
    reps: int

    @property
    def setting(self) -> str:
        return setting_label(self.drafter, self.gamma)

    @property
    def throughput_tok_s(self) -> float:
        return float(self.tokens.sum()) / self.wall_s if self.wall_s > 0 else math.nan

    def select(self, prompt_ids: set[str]) -> np.ndarray:
        """Boolean mask of the requests that replayed one of ``prompt_ids``."""
        return np.array([p in prompt_ids for p in self.prompt_ids], dtype=bool)


def settings_of(solo: Sequence[RequestRecord]) -> list[tuple[str, int]]:
    """Plain, then every (drafter, static γ ≥ 1) with chain rounds in ``solo``, sorted."""
    drafters = sorted({r.drafter for r in solo if r.drafter != PLAIN.name and r.rounds and not r.tree_budget})
    return [(PLAIN.name, 0)] + [(d, g) for d in drafters for g in measured_gammas(solo, d)]


def _tables(solo: Sequence[RequestRecord], settings: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple]:
    """(table, {prompt: row}) per setting: plain's sizes, each drafter's chains measured at that γ."""
    out: dict[tuple[str, int], tuple] = {(PLAIN.name, 0): plain_table([r for r in solo if r.drafter == PLAIN.name])}
    by_drafter: dict[str, list[int]] = defaultdict(list)
    for d, g in settings:
        if d != PLAIN.name:
            by_drafter[d].append(g)
    chains = [r for r in solo if not r.tree_budget]
    for d, gs in by_drafter.items():
        for g, pair in tables_per_gamma(chains, d, gs, max(16, *gs)).items():
            out[(d, int(g))] = pair
    return out


def _run(table: Any, index: Mapping[str, int], order: Sequence[str], load: int, cost: Any, drafter: str,
         gamma: int, temperature: float, min_requests: int, kv_budget: int | None) -> SimPoint:
    n = len(order)
    reps = max(1, math.ceil(min_requests / n))
    rows = workload_order(list(order), dict(index), n)
    per = "prompt" if temperature == 0 else "request"
    cfg = ServerConfig(max_num_seqs=int(load), kv_budget_tokens=kv_budget)
    parts: dict[str, list] = defaultdict(list)
    wall, itl_token, itl_chunk, peak, preempt = 0.0, [], [], 0, 0
    for seed in range(reps):
        res = simulate(table, closed_loop(int(load)), n, cost, gamma, drafter, cfg, order=rows, seed=seed, per=per)
        c, m = res.ledger, res.metrics()
        ok = ~np.isnan(c.t_last)
        parts["prompt_ids"] += [p for p, k in zip(order, ok) if k]
        parts["tokens"].append(c.out[ok].astype(float))
        parts["seconds"].append((c.t_last - c.arrival)[ok])
        parts["ttft_s"].append((c.t_first - c.arrival)[ok])
        parts["tpot_s"].append(np.array([math.nan if (x := tpot(f, last, k)) is None else x for f, last, k in
                                         zip(c.t_first[ok].tolist(), c.t_last[ok].tolist(), c.out[ok].tolist())]))
        parts["max_gap_s"].append(c.max_gap[ok])
        wall += res.makespan
        itl_token.append(m["itl_token_p99_ms"])
        itl_chunk.append(m["itl_p99_ms"])
        peak, preempt = max(peak, int(m["peak_kv_tokens"])), preempt + int(m["preemptions"])

    def mean(xs: list) -> float | None:
        vals = [x for x in xs if x is not None]
        return float(np.mean(vals)) if vals else None

    cat = {k: np.concatenate(v) for k, v in parts.items() if k != "prompt_ids"}
    return SimPoint(temperature, int(load), drafter, int(gamma), parts["prompt_ids"], cat["tokens"], cat["seconds"],
                    cat["ttft_s"], cat["tpot_s"], cat["max_gap_s"], wall, mean(itl_token), mean(itl_chunk), peak,
                    preempt, reps)


def shared_order(order: Sequence[str], tables: Mapping[tuple[str, int], tuple]) -> list[str]:
    """``order`` without the prompts some setting has no measured chain for (every setting serves the same)."""
    return [p for p in order if all(p in index for _, index in tables.values())]


def simulate_points(solo: Sequence[RequestRecord], orders: Mapping[tuple[float, int], Sequence[str]], cost: Any,
                    min_requests: int = 256) -> list[SimPoint]:
    """Every setting of ``solo`` (the run's solo records, one request at a time; trees left out) at every
    (temperature, load) of ``orders``, whose value is the point's requests as prompt ids, in order
    (:func:`specledger.load_points.requests_at` for a load that was not measured; a measured point's own
    order to validate)."""
    out = []
    kv_budget = cost.kv_budget_tokens() if hasattr(cost, "kv_budget_tokens") else None
    for temperature in sorted({t for t, _ in orders}):
        recs = [r for r in solo if float(r.temperature) == temperature and not r.tree_budget]
        settings = settings_of(recs)
        if len(settings) < 2:
            continue
        tables = _tables(recs, settings)
        for load in sorted(load for t, load in orders if t == temperature):
            order = shared_order(orders[(temperature, load)], tables)
            if not order:
                continue
            for d, g in settings:
                table, index = tables[(d, g)]
                out.append(_run(table, index, order, load, cost, d, g, temperature, min_requests, kv_budget))
    return out


def sim_speedup(spec: SimPoint, base: SimPoint, prompts: set[str], n_resamples: int = 1000,
                seed: int = 0) -> tuple[float, float, float, int]:
    """(S, bootstrap low, high, paired prompts): ``spec``'s speed-up over ``base`` on the ``prompts`` both
    served, S = (Σ tokens / Σ latency) per prompt, paired
    (:func:`specledger.analysis.stats.paired_speedup_bootstrap`)."""
    def per_prompt(p: SimPoint) -> dict[str, list[float]]:
        acc: dict[str, list[float]] = {}
        for pid, k, s in zip(p.prompt_ids, p.tokens.tolist(), p.seconds.tolist()):
            if pid in prompts:
                acc.setdefault(pid, [0.0, 0.0])
                acc[pid][0] += k
                acc[pid][1] += s
        return acc

    a, b = per_prompt(spec), per_prompt(base)
    ids = sorted(set(a) & set(b))
    if not ids:
        return math.nan, math.nan, math.nan, 0
    arrays = [np.array([src[i][j] for i in ids]) for src, j in ((a, 0), (a, 1), (b, 0), (b, 1))]
    return (*paired_speedup_bootstrap(*arrays, n_resamples=n_resamples, seed=seed), len(ids))


def _real(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    lat = latency_stats(records)
    wall = sum({float(r.extra["point_wall_s"]) for r in records
                if isinstance(r.extra.get("point_wall_s"), (int, float))})
    tokens = sum(r.output_tokens for r in records)
    return {"throughput_tok_s": tokens / wall if wall else None, "ttft_p50_ms": lat["ttft_ms"]["p50"],
            "tpot_p50_ms": lat["tpot_ms"]["p50"], "itl_p99_ms": lat["itl_chunk_ms"]["p99"]}


def _simulated(p: SimPoint) -> dict[str, float | None]:
    tpots = p.tpot_s[~np.isnan(p.tpot_s)]
    return {"throughput_tok_s": p.throughput_tok_s,
            "ttft_p50_ms": float(np.percentile(p.ttft_s, 50) * MS) if p.ttft_s.size else None,
            "tpot_p50_ms": float(np.percentile(tpots, 50) * MS) if tpots.size else None,
            "itl_p99_ms": p.itl_p99_ms}


def _real_speedup(spec: Sequence[RequestRecord], base: Sequence[RequestRecord]) -> float | None:
    def totals(recs: Sequence[RequestRecord]) -> dict[str, list[float]]:
        acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for r in recs:
            acc[r.prompt_id][0] += r.output_tokens
            acc[r.prompt_id][1] += r.total_time
        return acc

    a, b = totals(spec), totals(base)
    ids = sorted(set(a) & set(b))
    if not ids:
        return None
    s = sum(a[i][0] for i in ids) / sum(a[i][1] for i in ids)
    p = sum(b[i][0] for i in ids) / sum(b[i][1] for i in ids)
    return s / p if s > 0 and p > 0 else None


def validation(sim: Sequence[SimPoint], measured: Mapping[tuple[float, int, str], Sequence[RequestRecord]]
               ) -> list[LoadValidationRowDict]:
    """One row per simulated point that was also measured (``measured``: load records per (temperature,
    load, setting)): each figure of :data:`VALIDATED`, real and simulated, and error = (sim − real) / real."""
    by = {(p.temperature, p.load, p.setting): p for p in sim}
    rows: list[LoadValidationRowDict] = []
    for (temperature, load, setting), recs in sorted(measured.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        p, plain = by.get((temperature, load, setting)), by.get((temperature, load, "plain"))
        if p is None or not recs:
            continue
        real, simulated = _real(recs), _simulated(p)
        if setting != "plain" and plain is not None:
            real["speedup"] = _real_speedup(recs, measured.get((temperature, load, "plain"), []))
            simulated["speedup"] = sim_speedup(p, plain, set(p.prompt_ids), n_resamples=0)[0]
        row: LoadValidationRowDict = {"temperature": temperature, "load": load, "setting": setting, "reps": p.reps}
        for m in VALIDATED:
            if m not in real:
                continue
            r, s = real[m], simulated[m]
            err = (s - r) / r if r and s is not None and math.isfinite(s) else None
            row[m] = {"real": r, "sim": s, "error": err}
        rows.append(row)
    return rows


def worst_errors(rows: Sequence[LoadValidationRowDict], temperature: float) -> dict[str, float]:
    """The largest |error| of each validated figure at ``temperature``, over its settings and measured loads."""
    out: dict[str, float] = {}
    for row in rows:
        if row["temperature"] != temperature:
            continue
        for m in VALIDATED:
            err = (row.get(m) or {}).get("error")
            if err is not None:
                out[m] = max(out.get(m, 0.0), abs(err))
    return out


__all__ = ["SimPoint", "VALIDATED", "settings_of", "sim_speedup", "simulate_points", "validation", "worst_errors"]
