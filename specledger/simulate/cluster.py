"""Replicas behind a router, and the capacity plan: how many replicas meet an SLO at a request rate.

Routers: ``round_robin`` (request i to replica i mod N) and ``least_outstanding`` (the replica with
the fewest requests waiting or running; ties to the lowest index), as a load balancer in front of
vLLM replicas does.

Capacity plan: for a Poisson rate R and an SLO (P99 TTFT and/or P50 TPOT, ms), the smallest N
whose simulation meets it, found by doubling then bisection (meeting the SLO is treated as
monotone in N: more replicas at the same rate never hurt). Computed per setting (plain, each
static γ, each policy), so speculation is compared with plain decoding in replicas, the unit
capacity is bought in. The crossover map gives, over load x context, the speed-up of each
setting over plain and the best one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specledger.errors import require
from specledger.records import GammaSpec
from specledger.simulate.arrivals import closed_loop, poisson
from specledger.simulate.chains import ChainTable
from specledger.simulate.dispatch import Router, round_robin
from specledger.simulate.replica import Replica
from specledger.simulate.results import CapacityRowDict, CrossoverCellDict, SimMetricsDict
from specledger.simulate.simulator import break_even_verify_premium, simulate
from specledger.simulate.state import ServerConfig


def least_outstanding() -> Router:
    def pick(replicas: Sequence[Replica], rid: int) -> int:
        return min(range(len(replicas)), key=lambda i: replicas[i].outstanding())

    return pick


ROUTERS: dict[str, Callable[[], Router]] = {"round_robin": round_robin, "least_outstanding": least_outstanding}


def router(name: str) -> Router:
    require(name in ROUTERS, f"unknown router {name!r}; use {' or '.join(ROUTERS)}")
    return ROUTERS[name]()


@dataclass(frozen=True)
class SLO:
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None

    def met(self, m: SimMetricsDict) -> bool:
        ok = True
        if self.ttft_p99_ms is not None:
            ok &= m["ttft_p99_ms"] is not None and m["ttft_p99_ms"] <= self.ttft_p99_ms
        if self.tpot_p50_ms is not None:
            ok &= m["tpot_p50_ms"] is not None and m["tpot_p50_ms"] <= self.tpot_p50_ms
        return bool(ok)

    def label(self) -> str:
        parts = []
        if self.ttft_p99_ms is not None:
            parts.append(f"TTFT P99 <= {self.ttft_p99_ms:g} ms")
        if self.tpot_p50_ms is not None:
            parts.append(f"TPOT P50 <= {self.tpot_p50_ms:g} ms")
        return " and ".join(parts) or "none"


def replicas_needed(table: ChainTable, rate: float, slo: SLO, cost: Any, gamma: GammaSpec, config: ServerConfig,
                    n_requests: int = 2000, max_replicas: int = 256, route: str = "least_outstanding",
                    seed: int = 0) -> tuple[int | None, SimMetricsDict | None]:
    """Smallest N in 1..max_replicas meeting ``slo`` at Poisson ``rate`` (None if even max_replicas fails),
    with the metrics at that N."""
    arr = poisson(rate, n_requests, seed)
    cache: dict[int, SimMetricsDict] = {}

    def run(n: int) -> SimMetricsDict:
        if n not in cache:
            cache[n] = simulate(table, arr, n_requests, cost, gamma, config=config, replicas=n,
                                router=router(route), seed=seed).metrics()
        return cache[n]

    hi = 1
    while not slo.met(run(hi)):
        if hi >= max_replicas:
            return None, None
        hi = min(2 * hi, max_replicas)
    lo = hi // 2 + 1 if hi > 1 else 1
    while lo < hi:
        mid = (lo + hi) // 2
        if slo.met(run(mid)):
            hi = mid
        else:
            lo = mid + 1
    return hi, run(hi)


def capacity_plan(table: ChainTable, rates: Sequence[float], slo: SLO, cost: Any, settings: Sequence[int | str],
                  config: ServerConfig, n_requests: int = 2000, max_replicas: int = 256,
                  route: str = "least_outstanding", seed: int = 0) -> list[CapacityRowDict]:
    """Replicas needed per (rate, setting); ``saving`` = replicas with plain minus with the setting."""
    rows: list[CapacityRowDict] = []
    for rate in rates:
        plain_n = None
        for g in settings:
            n, m = replicas_needed(table, rate, slo, cost, g, config, n_requests, max_replicas, route, seed)
            if g == 0:
                plain_n = n
            rows.append({"rate": rate, "setting": "plain" if g == 0 else str(g), "replicas": n, "slo": slo.label(),
                         "ttft_p99_ms": m["ttft_p99_ms"] if m else None, "tpot_p50_ms": m["tpot_p50_ms"] if m else None,
                         "throughput_tok_s": m["throughput_tok_s"] if m else None})
        for r in rows[-len(settings):]:
            r["saving_vs_plain"] = (plain_n - r["replicas"]) if plain_n is not None and r["replicas"] else None
    return rows


def with_context(table: ChainTable, context: int) -> ChainTable:
    """The same chains and output lengths with every prompt ``context`` tokens long."""
    return ChainTable(table.accept, table.fill, np.full(table.size, int(context), dtype=np.int64),
                      table.output_tokens, table.categories, table.drafter, table.assumption, table.deterministic)


def crossover_map(table: ChainTable, concurrencies: Sequence[int], contexts: Sequence[int], cost: Any,
                  settings: Sequence[int | str], config: ServerConfig, n_requests: int = 200,
                  seed: int = 0) -> list[CrossoverCellDict]:
    """Over load x context: each setting's throughput speed-up over plain, its break-even verify premium
    (:func:`~specledger.simulate.simulator.break_even_verify_premium`) and the best setting per cell."""
    cells: list[CrossoverCellDict] = []
    for ctx in contexts:
        t = with_context(table, ctx)
        for c in concurrencies:
            cfg = dataclasses.replace(config, max_num_seqs=max(config.max_num_seqs, c))
            base = simulate(t, closed_loop(c), n_requests, cost, 0, config=cfg, seed=seed).metrics()
            speed: dict[str, float] = {}
            premium: dict[str, float | None] = {}
            for g in settings:
                if g == 0:
                    continue
                m = simulate(t, closed_loop(c), n_requests, cost, g, config=cfg, seed=seed).metrics()
                speed[str(g)] = m["throughput_tok_s"] / base["throughput_tok_s"]
                premium[str(g)] = break_even_verify_premium(speed[str(g)], m)
            best = max(speed, key=lambda k: speed[k], default=None)
            cells.append({"context": ctx, "concurrency": c, "speedup": speed, "break_even_verify_premium": premium,
                          "best": best if best is not None and speed[best] > 1.0 else "plain"})
    return cells
