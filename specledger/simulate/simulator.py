"""The simulation loop: arrivals -> router -> replicas, in time order, and the figures of a point.

Events are steps, not tokens: the loop always advances the busy replica whose clock is earliest,
after handing the router every arrival up to that clock (an idle replica's clock jumps to its
next arrival). Closed loop: the ``concurrency`` clients send their next request at the moment one
of theirs finishes. A request joins its replica's queue at arrival and is admitted at the next
step boundary, as in the engine. ``fast`` (default): a replica takes every step up to its next event
at once where it can (:func:`specledger.simulate.fastpath.advance`; a lone replica at light load runs through
arrivals and finishes in one go) -- the outcome of stepping, to the last bit.

Figures (same definitions as :func:`specledger.analysis.metrics.latency_stats`):
throughput = output tokens / makespan (0 -> last token); TTFT = first token - arrival; TPOT =
(last - first token) / (tokens - 1); chunk ITL = gaps between a request's emissions (what a
streaming client waits); token ITL adds the zero gaps inside a chunk; longest stall = largest
chunk gap. Little's law holds by construction: mean in-flight = arrival rate x mean latency.
Verify cost: ``verify_ratio`` = V / V_1, the speculative steps' forward seconds over what the same
forwards cost without their candidate rows (the verify premium the cost model assumed);
:func:`break_even_verify_premium` turns a speed-up into the premium at which it would vanish.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specledger.analysis.metrics import MS, tpot
from specledger.analysis.stats import distribution
from specledger.engine.drafters.catalog import PLAIN
from specledger.errors import require
from specledger.records import GammaSpec
from specledger.simulate.arrivals import Arrivals
from specledger.simulate.chains import ChainTable, Draws
from specledger.simulate.dispatch import Dispatcher, Router, round_robin
from specledger.simulate.fastpath import advance
from specledger.simulate.gamma import GammaPlan
from specledger.simulate.replica import Replica
from specledger.simulate.results import SimMetricsDict
from specledger.simulate.state import ServerConfig, SimCounters


@dataclass
class SimResult:
    ledger: SimCounters  # what the simulation counted
    makespan: float
    replicas: int
    label: str = ""

    def metrics(self) -> SimMetricsDict:
        """The point's figures. TTFT, TPOT and latency are :func:`specledger.analysis.metrics.tpot` per request,
        summarised by :func:`specledger.analysis.stats.distribution` as the measured runs' figures are. The
        inter-token gaps (one per chunk, ~10^8 at a million requests, float32) are summarised here, on arrays:
        ``distribution`` would build a Python list of them; token ITL adds the zero gaps inside chunks that the
        simulator does not keep one by one (:func:`_zero_padded_quantile`, :func:`_zero_padded_std`)."""
        c = self.ledger
        ok = ~np.isnan(c.t_last)
        requests = int(ok.sum())
        tokens = int(c.out[ok].sum())
        ttft = distribution((c.t_first - c.arrival)[ok], MS)
        per_token = [tpot(f, last, n) for f, last, n in zip(c.t_first[ok].tolist(), c.t_last[ok].tolist(),
                                                             c.out[ok].tolist())]
        tpots = distribution([x for x in per_token if x is not None], MS)
        latency_s = (c.t_last - c.arrival)[ok]
        latency = distribution(latency_s)  # seconds: its mean is reported in seconds, its quantiles in ms
        gaps = np.concatenate(c.gaps) if c.gaps else np.zeros(0, dtype=np.float32)
        gaps64 = gaps.astype(np.float64)  # moments in float64: independent of the order gaps were appended
        zeros = int(max(0, (c.out[ok] - c.chunks[ok]).sum()))
        arr = c.arrival[ok]
        span = float(arr.max() - arr.min()) if arr.size > 1 else 0.0

        def ms(x: float | int | None) -> float | None:
            return None if x is None else x * MS

        return {
            "requests": requests,
            "tokens": tokens,
            "wall_s": self.makespan,
            "throughput_tok_s": tokens / self.makespan if self.makespan > 0 else math.nan,
            "request_rate_s": requests / self.makespan if self.makespan > 0 else math.nan,
            "ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"],
            "tpot_p50_ms": tpots["p50"], "tpot_p99_ms": tpots["p99"],
            "itl_p50_ms": _gap_quantile(gaps, 50), "itl_p99_ms": _gap_quantile(gaps, 99),
            "itl_std_ms": float(gaps64.std() * MS) if gaps.size else None,
            "itl_token_p99_ms": _zero_padded_quantile(gaps, zeros, 99),
            "itl_token_std_ms": _zero_padded_std(gaps, zeros),
            "longest_stall_ms": float(gaps.max() * MS) if gaps.size else None,
            "latency_p50_ms": ms(latency["p50"]), "latency_p99_ms": ms(latency["p99"]),
            "mean_latency_s": latency["mean"],
            "mean_in_flight": float(latency_s.sum() / self.makespan) if self.makespan > 0 else None,
            "offered_rate_s": (arr.size - 1) / span if span > 0 else None,
            "preemptions": int(c.preemptions.sum()),
            "recompute_s": float(c.recompute_s.sum()),
            "steps": c.steps,
            "mean_batch": c.batch_sum / c.steps if c.steps else None,
            "mean_rows_per_step": c.rows_sum / c.steps if c.steps else None,
            "el": (tokens - requests) / c.rounds if c.rounds else None,
            "acceptance_rate": c.accepted_sum / c.proposed_sum if c.proposed_sum else None,
            "peak_kv_tokens": c.peak_kv_tokens,
            "replicas": self.replicas,
            "verify_s": c.verify_s,
            "verify_base_s": c.verify_base_s,
            "verify_ratio": c.verify_s / c.verify_base_s if c.verify_base_s > 0 else None,
        }


def break_even_verify_premium(speedup: float | None, m: SimMetricsDict) -> float | None:
    """The verify premium r* = T(verify step) / T(the same step without candidates) at which this point's
    throughput speed-up S over plain would fall to 1.0, all else held (``m``: the point's :meth:`SimResult.metrics`).

    With C = replicas x makespan the replica-seconds, V = ``verify_s`` the forward seconds of the
    speculative steps and V_1 = ``verify_base_s`` theirs without the candidate rows: scaling the verify
    forwards by x makes C(x) = (C - V) + x V (the rest -- drafting, scheduling, prefill, plain steps,
    idle -- held), so S(x) = S C / (C - V + x V); S(x*) = 1 gives

        x* = 1 + (S - 1) C / V,     r* = x* V / V_1

    (r* = x* times the ratio the cost model assumed, V / V_1). A user holds r* against their engine's
    measured T(gamma + 1 rows) / T(1 row) without trusting the cost model: above r*, speculation loses.
    Exact when the schedule does not depend on step times (one replica in a closed loop); otherwise
    first-order (arrivals would meet a different batch). r* <= 0: no verify price makes it pay (the
    drafting and other overheads alone cost the speed-up). None without speculative steps."""
    if speedup is None or not m.get("verify_s") or not m.get("verify_base_s"):
        return None
    v, v1 = m["verify_s"], m["verify_base_s"]
    x = 1.0 + (speedup - 1.0) * m["replicas"] * m["wall_s"] / v
    return x * v / v1


def _gap_quantile(gaps: np.ndarray, p: float) -> float | None:
    """The p-th percentile of the chunk gaps, in ms (on their float32 array, as the figures always were)."""
    return float(np.percentile(gaps, p) * MS) if gaps.size else None


def _zero_padded_std(gaps: np.ndarray, zeros: int) -> float | None:
    """Standard deviation of token ITL (chunk gaps plus ``zeros`` zero gaps): sqrt(E[x^2] - E[x]^2)."""
    n = gaps.size + zeros
    if n == 0:
        return None
    g = gaps.astype(np.float64)
    mean, sq = g.sum() / n, (g * g).sum() / n
    return float(np.sqrt(max(sq - mean * mean, 0.0)) * 1e3)


def _zero_padded_quantile(gaps: np.ndarray, zeros: int, p: float) -> float | None:
    """The p-th percentile of token ITL: the chunk gaps plus ``zeros`` zero gaps inside chunks."""
    n = gaps.size + zeros
    if n == 0:
        return None
    rank = p / 100 * (n - 1)
    if rank < zeros:
        return 0.0
    return float(np.quantile(gaps, min(1.0, (rank - zeros) / max(1, gaps.size - 1))) * 1e3) if gaps.size else 0.0


def _bound(replicas: Sequence[Replica], replica: Replica, t_next: float, closed: bool) -> float:
    """Until when ``replica`` may run ahead (its steps must *start* before this): the next open-loop arrival
    ``t_next`` (the loop hands it to the router before any step that starts at or after it). Closed loop
    with several replicas: also the earliest clock among the other busy replicas -- a finish there
    dispatches a request, and the router must see this replica as the step path leaves it then.
    Open-loop replicas meet only through the router at arrival times, so their order in between is free."""
    bound = t_next
    if closed and len(replicas) > 1:
        for r in replicas:
            if r is not replica and r.has_work() and r.clock < bound:
                bound = r.clock
    return bound


def simulate(
    table: ChainTable,
    arrivals: Arrivals,
    n_requests: int,
    cost: Any,
    gamma: GammaSpec = 0,
    drafter: str | None = None,
    config: ServerConfig | None = None,
    replicas: int = 1,
    router: Router | None = None,
    order: np.ndarray | None = None,
    seed: int = 0,
    jitter: bool = True,
    per: str = "request",
    fast: bool = True,
) -> SimResult:
    """Serve ``n_requests`` (request i takes measured request ``order[i]``'s sizes and chain; default
    the table's rows cycled) through ``replicas`` identical servers behind ``router``. ``jitter``: apply
    the cost profile's measured step-to-step noise when it has some (a profile fitted from a serving
    run: :func:`~specledger.simulate.profile.local_noise_quantiles`), so ITL tails are not those of a
    perfectly steady machine. ``per``: what acceptance draws are keyed on
    (:class:`~specledger.simulate.chains.Draws`): "request" (every simulated request a fresh prompt like
    its measured one) or "prompt" (requests replaying one measured prompt accept alike, as greedy
    decoding of the same prompt does). ``fast``: skip from event to event where the batch is fixed
    (:mod:`specledger.simulate.fastpath`; the same outcome as stepping, to the last bit); False steps
    one step at a time throughout (the reference the fast path is tested against)."""
    require(n_requests >= 1, "simulate at least one request")
    require(replicas >= 1, "replicas must be >= 1")
    cfg = config or ServerConfig()
    require(cfg.max_num_seqs >= 1, "max_num_seqs must be >= 1")
    if order is None:
        order = np.arange(n_requests) % table.size
    require(order.shape[0] == n_requests, "order must give one measured request per simulated request")
    if not arrivals.closed:
        require(arrivals.times is not None and arrivals.times.shape[0] >= n_requests,
                "the arrival times cover fewer requests than asked")
    plan = GammaPlan(gamma, cost)
    name = table.drafter if drafter is None else drafter
    if plan.static == 0:
        name = PLAIN.name
    draws = Draws(seed, per)
    counters = SimCounters(table, order, per)
    reps = [Replica(i, cfg, cost, table, plan, name, counters, jitter, draws) for i in range(replicas)]
    pending = Dispatcher(counters, reps, router or round_robin(), arrivals, n_requests)
    if arrivals.closed:
        for _ in range(min(int(arrivals.concurrency or 1), n_requests)):
            pending.dispatch(0.0)
    while pending.done < n_requests:
        if replicas == 1:
            replica = reps[0] if reps[0].has_work() else None
        else:
            busy = [r for r in reps if r.has_work()]
            replica = min(busy, key=lambda r: r.clock) if busy else None
        t_next = pending.next_time()
        t_min = replica.clock if replica is not None else t_next
        if t_next <= t_min and t_next < math.inf:
            pending.dispatch_until(t_min)
            continue
        if replica is None:  # nothing to do and nothing arriving: cannot happen with n_requests left
            break
        if fast:
            finished = advance(replica, _bound(reps, replica, t_next, arrivals.closed), pending)
        else:
            finished = replica.step()
        pending.finish(finished, replica.clock)
    done = pending.done
    counters.verify_s = sum(r.prices.verify_s for r in reps)  # replica by replica: the same floats on every path
    counters.verify_base_s = sum(r.prices.verify_base_s for r in reps)
    makespan = float(np.nanmax(counters.t_last)) if done else 0.0
    return SimResult(counters, makespan, replicas, arrivals.label)
