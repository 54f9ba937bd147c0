"""Event skipping: a replica's steps between two events, computed at once -- exactly the step path's.

Between two events (a request admitted, a request finishing, an arrival the router must place) a
replica's running batch is fixed, so its next steps need no scheduling decisions: with keyed draws
(:class:`~specledger.simulate.chains.Draws`) each request's next S rounds can be drawn at once at the
full gamma G, and the prefix consistency of sampling (P_g = min(P_G, g), K_g = min(K_G, P_g)) turns them
into the rounds the step path would sample one step at a time. For request i (committed o_i of T_i,
rem_i = T_i - o_i), with R_is = K*_is + 1 and c_is = R_i0 + ... + R_is:

    rem_is   = rem_i - c_i(s-1)                         tokens left before step s
    gamma_is = max(min(G, rem_is - 1), 0)               the replica's clamp
    P_is = min(P*_is, gamma_is),  K_is = min(K*_is, P_is),  committed_is = min(R_is, rem_is)
    i finishes in the first step s with c_is >= rem_i

(before its last step R_is < rem_is, so the clamp never changes what is committed). The segment is
steps 0 .. the first step in which any request finishes, cut before the first step that starts at or
after ``bound``, and before the first step whose token budget or KV reservation would bind (those
trim or preempt: the step path prices them). Each step s costs, as :meth:`Replica._step_at` prices it,

    sum_i draft_s(gamma_is, C_s) + step_s(max(R_s, B), B, C_s) x jitter_s + other_s(B)
    R_s = sum_i (P_is + 1) (+ the prompts prefilled in step 0),  C_s = sum_i context_is / B

with the same float operations in the same order (the emission clock is a left-to-right sum; a sum
over requests is numpy's pairwise sum, :func:`_pairwise_sum`; the replica's ``verify_s`` and
``verify_base_s`` are left-to-right sums over its speculative steps, as the step path adds them), so
the ledger is the step path's to the last bit (gap entries are appended per segment, step-major).

Two ways to run a segment, both with that outcome:

* :func:`_run_scalar` -- a small batch (<= SMALL_BATCH running): scalar Python step after step over
  rounds drawn ahead in bulk (:class:`RoundCache`), doing itself, before each step, what the
  simulation loop and the admission do (admission with prefill or chunked prefill; a lone replica
  also takes its arrivals from the engine's :class:`~specledger.simulate.engine.Feed` and hands
  finishes back, so a closed loop's next request joins at once). A lone replica runs on through
  arrivals and finishes -- at light load one call serves the whole run; one of several stops before
  the first step that starts at or after ``bound`` (the router places the next arrival) and, in a
  closed loop, after its first finish. It hands a step to the step path only when it must (a token
  budget that trims or does not take a prompt whole, a KV reservation that preempts, a batch grown
  past SMALL_BATCH).
* :func:`_segment_arrays` -- a large batch: requests x steps arrays up to the first finish, only
  where more than one step is expected before it (else the step path is cheaper).

Applies when: gamma is one static value; the table is sampled (not ``deterministic``); the batch is
not empty. The array segments also need: nothing can be admitted (the queue is empty or every slot
is taken) and nobody finished at admission; requests prefilling (chunked prefill) complete their
prompts in step 0. Anything else returns None: the caller takes one ordinary step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from specledger.cost.pricer import step_s_each
from specledger.errors import require
from specledger.simulate.hardware import DRAFT_MODEL_DRAFTERS, RooflineCost

if TYPE_CHECKING:
    from specledger.simulate.engine import Feed
    from specledger.simulate.replica import Replica

MIN_STEPS, MAX_STEPS = 2, 256
SMALL_BATCH = 128  # up to this many running requests a segment is priced in scalar Python (measured: faster
# than the step path up to ~128 running on a roofline; at 256 the step path's arrays win)
CHUNK = 4096  # requests whose rounds are drawn together (RoundCache)
KEEP_CHUNKS = 4  # chunks kept behind the newest one
AHEAD = 64  # rounds of a request fetched from the RoundCache at once


def step_costs(cost: Any, rows: np.ndarray, batch: int, context: np.ndarray) -> np.ndarray:
    """``cost.step_s(rows_s, batch, context_s)`` for every s: the cost's own ``step_s_many`` when it has
    one, a vectorised copy of :meth:`RooflineCost.step_s` (same operations, same order) for a roofline,
    else one call per step."""
    many = getattr(cost, "step_s_many", None)
    if many is not None:
        return np.asarray(many(rows, batch, context), dtype=np.float64)
    return step_s_each(cost, rows, batch, context)


def draft_costs(cost: Any, drafter: str, gammas: np.ndarray, context: np.ndarray) -> np.ndarray:
    """Drafting time of every request in every step: ``draft_s(drafter, gamma[s, i], context[s])``
    where gamma > 0, else 0 (shape of ``gammas``: steps x requests)."""
    out = np.zeros(gammas.shape)
    if type(cost) is RooflineCost and not (cost.draft_model is not None and drafter in DRAFT_MODEL_DRAFTERS):
        out[gammas > 0] = cost.model_free_draft_s  # a model-free drafter: one price per round
        return out
    ctx = context.tolist()
    for s in range(gammas.shape[0]):
        row = gammas[s]
        for gv in np.unique(row[row > 0]).tolist():
            out[s, row == gv] = float(cost.draft_s(drafter, int(gv), ctx[s]))
    return out


def horizon(rep: Replica, t: float, bound: float, rem: np.ndarray, gamma: int) -> int:
    """Rounds to draw ahead: the steps until the first request is expected to finish (its remaining
    tokens over the mean tokens per round so far) or until ``bound`` at the last step's pace, + 2,
    within MIN_STEPS..MAX_STEPS (too few only costs another segment; too many, unused draws)."""
    L = rep.ledger
    per_round = (L.accepted_sum + L.rounds) / L.rounds if L.rounds else 1.0 + gamma / 2
    n = float(rem.min()) / per_round
    if bound < math.inf and rep.last_dt > 0:
        n = min(n, (bound - t) / rep.last_dt)
    return int(min(MAX_STEPS, max(MIN_STEPS, n + 2)))


def segment(rep: Replica, t: float, finished: list[int], bound: float, feed: Feed | None = None) -> list[int] | None:
    """Run the replica's steps from clock ``t`` (admission done) up to the next event at once; returns
    ``finished`` extended by the requests finished, or None when the segment does not apply (see the
    module docstring) -- then nothing has changed. Small batches (<= SMALL_BATCH) go through
    :func:`_run_scalar` (scalar Python over bulk-drawn rounds: numpy's per-call overhead dominates
    there), larger ones through :func:`_segment_arrays`."""
    plan, table, cfg = rep.plan, rep.table, rep.cfg
    if not plan.vectorised or table.deterministic or rep.policies is not None:
        return None
    b = int(rep.run["rid"].shape[0])
    if b == 0:
        return None
    if feed is not None and b <= SMALL_BATCH:
        return _run_scalar(rep, t, finished, feed, bound)
    if plan.static is None:  # the batch-size schedule: gamma changes with the batch
        return None
    if (rep.waiting and b < cfg.max_num_seqs) or finished:  # requests finished at admission leave with this step
        return None
    return _segment_arrays(rep, t, finished, bound, int(plan.static))


def _segment_arrays(rep: Replica, t: float, finished: list[int], bound: float, gam: int) -> list[int] | None:
    """:func:`segment` on arrays (requests x steps)."""
    table, cfg, run = rep.table, rep.cfg, rep.run
    b = int(run["rid"].shape[0])
    out0, target, ctx0 = run["out"], run["target"], run["ctx"]
    pleft = run["pleft"]
    pre = pleft > 0
    npre = int(np.count_nonzero(pre)) if cfg.chunked_prefill else 0
    rem0 = target - out0
    L = rep.ledger
    if L.rounds and float(rem0.min()) * L.rounds <= L.accepted_sum + L.rounds:
        return None  # someone is expected to finish in this very step: one step is the step path's job
    S = horizon(rep, t, bound, rem0, gam)
    cols = np.arange(S)
    if npre:
        start = pre.astype(np.int64)  # prefilling requests decode from step 1
        dec = cols[None, :] >= start[:, None]
        fresh = pre & (out0 == 0)  # their first token leaves at the end of step 0
    else:
        start = None
        dec = np.ones((b, S), dtype=bool)
        fresh = None
    # draws at the full gamma for rounds nround + (s - start)
    w = min(gam, table.max_gamma)
    if w > 0:
        rounds = run["nround"][:, None] + (cols[None, :] if start is None else cols[None, :] - start[:, None])
        u = rep.draws.uniforms(np.repeat(run["key"], S), rounds.ravel(), w).reshape(2, b, S, w)
        pfull, kfull = table.full_outcomes(run["chain"][:, None], u)
    else:
        pfull = kfull = np.zeros((b, S), dtype=np.int64)
    raw = kfull + 1
    if npre:
        raw = np.where(dec, raw, 0)
        raw[:, 0] += fresh
    cum = np.cumsum(raw, axis=1)
    fin_cols = (cum >= rem0[:, None]).any(axis=0)
    n = int(fin_cols.argmax()) + 1 if fin_cols.any() else S
    raw, cum, pfull, kfull, dec = raw[:, :n], cum[:, :n], pfull[:, :n], kfull[:, :n], dec[:, :n]
    prev = cum - raw  # tokens committed in the segment before step s
    g = np.maximum(np.minimum(gam, rem0[:, None] - prev - 1), 0)
    if npre:
        g[~dec] = 0
    prop = np.minimum(pfull, g)
    acc = np.minimum(kfull, prop)
    nd = dec.sum(axis=0) if npre else np.full(n, b)
    psum = prop.sum(axis=0)
    pre_tokens = int(pleft.sum()) if npre else 0
    # the token budget must not bind (step 0 must fit every pending prompt whole)
    budget = rep._budget
    if budget is not None:
        if pre_tokens > budget - int(nd[0]) - int(psum[0]):
            return None
        over = psum > budget - nd
        if over.any():
            n = int(over.argmax())
            if n == 0:
                return None
    # the KV reservation must not preempt
    ctx = ctx0[:, None] + prev[:, :n]
    need = ctx + (g[:, :n] if cfg.reserve_gamma else prop[:, :n])
    blocks = rep._blocks(need).sum(axis=0)
    if rep._kv_blocks is not None and b > 1:
        over = blocks > rep._kv_blocks
        if over.any():
            n = int(over.argmax())
            if n == 0:
                return None
            ctx, blocks = ctx[:, :n], blocks[:n]
    g, prop, acc, dec, nd, psum = g[:, :n], prop[:, :n], acc[:, :n], dec[:, :n], nd[:n], psum[:n]
    # prices of every step
    ctx_mean = ctx.sum(axis=0) / b
    rows = nd + psum
    if npre:
        rows[0] += pre_tokens
    fwd = step_costs(rep.cost, np.maximum(rows, b), b, ctx_mean).tolist()
    spec = np.flatnonzero(psum > 0)  # speculative steps: also priced without their candidate rows
    base = dict(zip(spec.tolist(), step_costs(rep.cost, np.maximum(rows[spec] - psum[spec], b), b,
                                              ctx_mean[spec]).tolist()))
    if rep.drafter != "none" and gam > 0:
        dcost = draft_costs(rep.cost, rep.drafter, np.ascontiguousarray(g.T), ctx_mean)
        draft = dcost.sum(axis=1).tolist()
        if npre:  # the step path sums over the decoding requests only
            draft[0] = float(dcost[0][dec[:, 0]].sum())
    else:
        draft = [0.0] * n
    noise = rep.forward_noise(n)
    other = float(rep.cost.other_s(b))
    emit: list[float] = []
    tt = t
    for s in range(n):
        if s and tt >= bound:
            break
        f = fwd[s] * noise[s] if noise is not None else fwd[s]
        tt = tt + draft[s] + f + other
        emit.append(tt)
        f1 = base.get(s)
        if f1 is not None:
            rep.verify_s += f
            rep.verify_base_s += f1 * noise[s] if noise is not None else f1
    n = len(emit)
    _commit(rep, t, emit, n, b, raw, cum, prop, acc, dec, rows, blocks, rem0, fresh, npre)
    return rep.retire(finished)


def _commit(rep: Replica, t: float, emit: list[float], n: int, b: int, raw: np.ndarray, cum: np.ndarray,
            prop: np.ndarray, acc: np.ndarray, dec: np.ndarray, rows: np.ndarray, blocks: np.ndarray,
            rem0: np.ndarray, fresh: np.ndarray | None, npre: int) -> None:
    """Write steps 0..n-1 to the run arrays and the ledger, as n calls of the step path would."""
    L, run, cfg = rep.ledger, rep.run, rep.cfg
    dec = dec[:, :n]
    e = np.asarray(emit)
    rid = run["rid"]
    last0 = run["last"]
    # emission gaps: a request decoding in step s waits since its previous emission
    before = np.empty((b, n))
    before[:, 0] = last0
    before[:, 1:] = e[:-1]
    if npre and n > 1:
        recomputed = ~dec[:, 0] & ~fresh  # prefilled in step 0 without emitting (after a preemption)
        before[recomputed, 1] = last0[recomputed]
    gaps = e[None, :] - before
    L.gaps.append(gaps.T[dec.T].astype(np.float32))  # step-major, as the step path appends them
    worst = np.where(dec, gaps, -np.inf).max(axis=1)
    L.max_gap[rid] = np.maximum(L.max_gap[rid], worst)
    steps_dec = dec.sum(axis=1)
    if npre:
        rid_f = rid[fresh]
        L.t_first[rid_f] = e[0]
        L.chunks[rid_f] = 1
        run["pleft"] = np.zeros(b, dtype=np.int64)
    L.chunks[rid] += steps_dec
    added = np.minimum(cum[:, n - 1], rem0)
    run["out"] = run["out"] + added
    run["ctx"] = run["ctx"] + added
    emitted_last = dec[:, n - 1] if not npre or n > 1 else dec[:, 0] | fresh
    run["last"] = np.where(emitted_last, e[n - 1], last0)
    run["nround"] = run["nround"] + steps_dec
    L.steps += n
    L.fast_steps += n
    L.fast_segments += 1
    L.batch_sum += b * n
    L.rows_sum += int(rows[:n].sum())
    L.rounds += int(steps_dec.sum())
    L.proposed_sum += int(prop[:, :n].sum())
    L.accepted_sum += int(acc[:, :n].sum())
    L.peak_kv_tokens = max(L.peak_kv_tokens, int(blocks[:n].max()) * cfg.block_size)
    rep.nstep += n
    rep.last_dt = (emit[-1] - t) / n
    rep.clock = emit[-1]


# ------------------------------------------------------------------------------------------------
class RoundCache:
    """Every request's rounds drawn ahead, CHUNK requests at a time: round r of request i is coded
    P*_ir * 32 + K*_ir (the outcome at the full gamma; keyed draws, so exactly what
    :meth:`ChainTable.sample` gives that round whenever it is taken). A request gets
    ceil(1.3 T / (E[K] + 1)) + 4 rounds (T its output tokens, E[K] its chain's expectation at gamma);
    a request that needs more (token budget trims) has them drawn when asked."""

    def __init__(self, rep: Replica, gamma: int) -> None:
        self.ledger, self.table, self.draws = rep.ledger, rep.table, rep.draws
        self.gamma = gamma
        self.width = min(gamma, self.table.max_gamma)
        require(self.table.max_gamma < 32, "rounds are coded in 5 bits")
        self.chunks: dict[int, tuple[list[int], list[int], np.ndarray]] = {}

    def _outcomes(self, keys: np.ndarray, rounds: np.ndarray, chain: np.ndarray) -> np.ndarray:
        p, k = self.table.full_outcomes(chain, self.draws.uniforms(keys, rounds, self.width))
        return (p * 32 + k).astype(np.int16)

    def _build(self, c: int) -> tuple[list[int], list[int], np.ndarray]:
        L = self.ledger
        lo, hi = c * CHUNK, min(L.n, (c + 1) * CHUNK)
        chain, target = L.chain[lo:hi], L.target[lo:hi]
        _, ek = self.table.expected(chain, np.full(hi - lo, self.width, dtype=np.int64))
        count = np.minimum(np.ceil(1.3 * target / (ek + 1)).astype(np.int64) + 4, target + 1)
        start = np.cumsum(count) - count
        total = int(count.sum())
        keys = np.repeat(L.key[lo:hi], count)
        rounds = np.arange(total) - np.repeat(start, count)
        codes = self._outcomes(keys, rounds, np.repeat(chain, count))
        ent = (start.tolist(), count.tolist(), codes)
        for old in [k for k in self.chunks if k < c - KEEP_CHUNKS]:  # requests long gone (redrawn if ever asked)
            del self.chunks[old]
        self.chunks[c] = ent
        return ent

    def rounds(self, rid: int, r0: int, limit: int | None = None) -> list[int]:
        """Codes of request ``rid``'s rounds r0, r0 + 1, ... (at least one, at most ``limit``, default AHEAD)."""
        limit = limit or AHEAD
        if self.width == 0:
            return [0] * limit
        c = rid // CHUNK
        ent = self.chunks.get(c) or self._build(c)
        i = rid - c * CHUNK
        o, n = ent[0][i], ent[1][i]
        if r0 < n:
            return ent[2][o + r0:o + min(n, r0 + limit)].tolist()
        L = self.ledger
        return self._outcomes(np.full(limit, L.key[rid]), np.arange(r0, r0 + limit),
                              np.full(limit, L.chain[rid])).tolist()


def _pairwise_sum(v: list[float]) -> float:
    """numpy's float64 sum of ``v`` to the last bit: left to right below 8 terms, numpy's own above."""
    if len(v) < 8:
        r = 0.0
        for x in v:
            r += x
        return r
    return float(np.array(v).sum())


def scalar_step(cost: Any) -> Any:
    """``cost.step_s`` as a plain function; for a roofline, :meth:`RooflineTerms.time` of the target with
    the roofline's clamps (same operations, same order: the same float)."""
    if type(cost) is not RooflineCost:
        return cost.step_s
    time = cost.terms().time

    def step_s(total_rows: int, batch: int, context: float) -> float:
        return time(max(1, total_rows), max(1, batch), max(0.0, context))

    return step_s


def _run_scalar(rep: Replica, t: float, finished: list[int], feed: Feed, bound: float = math.inf) -> list[int] | None:
    """A lone replica, step after step in scalar Python while its batch stays small:
    before each step it does what the simulation loop and :meth:`Replica._admit` do (take the arrivals
    up to its clock from ``feed``, jump to the next one when idle, admit waiting requests while a slot
    and the KV budget allow -- a preempted one with its prompt and tokens to recompute), then prices
    and commits the step as :meth:`Replica._step_at` does, and hands finished requests to ``feed`` at
    the step's end (a closed loop's client sends its next request then). It stops -- writing its
    state back to the run arrays -- when nothing is left, and before a step it cannot take here: a
    prompt that does not fit the step's token budget whole, a token budget that trims proposals, a KV
    reservation that preempts, a batch grown past SMALL_BATCH; that step is then the step path's
    (:meth:`Replica._step_at`, admission already done). Returns None (nothing done) when the very
    first step is such a step, else the ids finished and not yet handed to ``feed`` (those of a last
    step-path step).

    One of several replicas: the same, without taking arrivals (the router places them), up to the
    first step that starts at or after ``bound`` (the next arrival; in a closed loop also the earliest
    clock of the other busy replicas). Open loop: finishes are only counted, so it runs on through
    them; closed loop: a finish sends a request the router places, so it stops after the first."""
    L, cfg, run, cost = rep.ledger, rep.cfg, rep.run, rep.cost
    plan = rep.plan
    gam = plan.static
    gammas = rep.fast_gammas
    if gam is None and not gammas:  # the batch-size schedule: every gamma it may ask
        zeros = np.zeros(cfg.max_num_seqs, dtype=np.int64)
        gammas.update((k, int(plan.choose(k, zeros[:k], None)[0])) for k in range(1, cfg.max_num_seqs + 1))
    g_max = gam if gam is not None else max(gammas.values())
    cache = L.round_cache
    if cache is None or cache.gamma != g_max or cache.table is not rep.table:
        cache = L.round_cache = RoundCache(rep, g_max)  # drawn at the largest gamma: prefix-consistent
    held = rep.fast_rounds
    prompt_of, target_of, out_of, last_of, nround_of = L.prompt, L.target, L.out, L.t_last, L.nround
    rid = run["rid"].tolist()
    out, tgt, ctx, last = run["out"].tolist(), run["target"].tolist(), run["ctx"].tolist(), run["last"].tolist()
    pleft, nround = run["pleft"].tolist(), run["nround"].tolist()
    b = len(rid)
    codes: list[list[int]] = []
    base: list[int] = []
    for r, n in zip(rid, nround):
        h = held.get(r)
        if h is None or n - h[0] >= len(h[1]):
            h = held[r] = (n, cache.rounds(r, n))
        codes.append(h[1])
        base.append(h[0])
    worst = [-math.inf] * b
    chn = [0] * b
    columns = (rid, out, tgt, ctx, last, pleft, nround, codes, base, worst, chn)  # one running request per index
    budget, kvb, bs, reserve, max_seqs = rep._budget, rep._kv_blocks, cfg.block_size, cfg.reserve_gamma, cfg.max_num_seqs
    step_s = rep.fast_step_s
    if step_s is None:
        step_s = rep.fast_step_s = scalar_step(cost)
    # a roofline: RooflineTerms.time itself (rb >= b >= 1 and ctx_mean >= 0, so its clamps change nothing)
    roof_time = cost.terms().time if type(cost) is RooflineCost else None
    draft_on = rep.drafter != "none" and g_max > 0
    flat_draft = (cost.model_free_draft_s if type(cost) is RooflineCost
                  and not (cost.draft_model is not None and rep.drafter in DRAFT_MODEL_DRAFTERS) else None)
    flat_sums = None
    flat_full: dict[int, float] = {}
    if flat_draft is not None:
        flat_sums = [0.0]
        for _ in range(7):
            flat_sums.append(flat_sums[-1] + flat_draft)
    others = rep.fast_other_s
    n_pre = sum(1 for x in pleft if x)  # requests prefilling (chunked prefill)
    noise: list[float] = []
    ctx_sum = sum(ctx)
    gaps: list[float] = []
    waiting = rep.waiting
    rows_sum = rounds = prop_sum = acc_sum = peak = batch_sum = 0
    verify_s, verify_base_s = rep.verify_s, rep.verify_base_s
    tt = t
    s = 0
    fallback = False  # stop before a step the step path must take

    lone = len(feed.reps) == 1
    stop_at_finish = feed.closed and not lone
    t_arr = feed.next_time() if lone else math.inf  # the next open-loop arrival this loop takes
    noise_on = rep._noise is not None
    com = [0] * (b + SMALL_BATCH + 1)  # per running request in the step: tokens committed, gamma
    gl = com.copy()
    chunked = cfg.chunked_prefill
    pending = finished  # finished at admission (one-token requests without chunked prefill): reported with the step
    admit = False  # the caller has admitted for the first step
    while True:
        if admit:  # what the simulation loop and the admission do before every step but the first
            if tt >= bound and not lone:
                break
            if not b and not waiting:
                if t_arr == math.inf:
                    break
                a0 = t_arr
                while t_arr <= a0:
                    feed.dispatch(t_arr)
                    t_arr = feed.next_time()
                if tt < a0:
                    tt = a0
            while t_arr <= tt:
                feed.dispatch(t_arr)
                t_arr = feed.next_time()
            if waiting and b < max_seqs:
                reserved = 0
                if kvb is not None:
                    for c in ctx:
                        reserved += c if bs == 1 else -(-c // bs)
                while waiting and b < max_seqs:
                    r = waiting[0]
                    o = int(out_of[r])
                    c = int(prompt_of[r]) + o
                    need = c + 1 if bs == 1 else -(-(c + 1) // bs)
                    if kvb is not None and reserved + need > kvb and b > 0:
                        break
                    waiting.popleft()
                    reserved += need
                    if chunked:  # its prompt goes in with the step (a preempted one recomputes all but a token)
                        pl = c if o == 0 else c - 1
                        if pl:
                            n_pre += 1
                    elif o == 0:  # prefilled now, one after another: the first token leaves when it ends
                        pl = 0
                        tt += rep._prefill_s(c, r)
                        L.t_first[r] = last_of[r] = tt
                        out_of[r] = L.chunks[r] = o = 1
                        if target_of[r] <= 1:
                            pending.append(r)
                            continue
                        c += 1
                    else:  # recomputed after a preemption: KV for all but the last committed token
                        pl = 0
                        dt = rep._prefill_s(c - 1, r)
                        tt += dt
                        L.recompute_s[r] += dt
                    nr = int(nround_of[r])
                    h = held.get(r)
                    if h is None or nr - h[0] >= len(h[1]):
                        h = held[r] = (nr, cache.rounds(r, nr))
                    rid.append(r)
                    out.append(o)
                    tgt.append(int(target_of[r]))
                    ctx.append(c)
                    last.append(float(last_of[r]))
                    pleft.append(pl)
                    nround.append(nr)
                    codes.append(h[1])
                    base.append(h[0])
                    worst.append(-math.inf)
                    chn.append(0)
                    ctx_sum += c
                    b += 1
                if b > SMALL_BATCH:
                    fallback = True
                    break
            if not b:  # every request admitted has finished already (at the end of its prefill)
                if stop_at_finish:
                    break
                feed.finish(pending, tt)
                pending = []
                continue
        admit = True
        # the step: what each request proposes, accepts and commits
        nd = psum = asum = blocks = npos = pre_tokens = 0
        if plan.static is None and b > n_pre:
            gam = gammas[b - n_pre]
        for i in range(b):
            if pleft[i]:
                pre_tokens += pleft[i]
                need = ctx[i]
            else:
                j = nround[i] - base[i]
                cl = codes[i]
                if j >= len(cl):
                    r = rid[i]
                    cl = codes[i] = cache.rounds(r, nround[i])
                    held[r] = (nround[i], cl)
                    base[i] = nround[i]
                    j = 0
                c = cl[j]
                pf, kf = c >> 5, c & 31
                rem = tgt[i] - out[i]
                g = gam if gam < rem - 1 else (rem - 1 if rem > 1 else 0)
                p = pf if pf < g else g
                k = kf if kf < p else p
                nd += 1
                psum += p
                asum += k
                com[i] = k + 1 if k + 1 < rem else rem
                gl[i] = g
                if g:
                    npos += 1
                need = ctx[i] + (g if reserve else p)
            blocks += need if bs == 1 else -(-need // bs)
        if budget is not None and (psum > budget - nd or pre_tokens > budget - nd - psum):
            fallback = True
        elif kvb is not None and b > 1 and blocks > kvb:
            fallback = True
        if fallback:
            if s == 0:
                return None
            break
        rows = nd + psum + pre_tokens
        ctx_mean = ctx_sum / b
        d_sum = 0.0
        if draft_on and npos:
            if flat_sums is not None and nd < 8:
                d_sum = flat_sums[npos]
            elif flat_draft is not None and npos == nd:  # every decoding request drafts: one price, nd times
                d_sum = flat_full.get(nd, -1.0)
                if d_sum < 0:
                    d_sum = flat_full[nd] = _pairwise_sum([flat_draft] * nd)
            else:
                gs = [gl[i] for i in range(b) if not pleft[i]]
                if flat_draft is not None:
                    d_sum = _pairwise_sum([flat_draft if g > 0 else 0.0 for g in gs])
                else:
                    price: dict[int, float] = {}
                    for g in gs:
                        if g > 0 and g not in price:
                            price[g] = float(cost.draft_s(rep.drafter, g, ctx_mean))
                    d_sum = _pairwise_sum([price[g] if g > 0 else 0.0 for g in gs])
        rb = rows if rows > b else b
        f = roof_time(rb, b, ctx_mean) if roof_time is not None else float(step_s(rb, b, ctx_mean))
        if noise_on:
            if s >= len(noise):
                noise.extend(rep.forward_noise(16, len(noise)) or [])
            f *= noise[s]
        if psum:  # a speculative step: also priced without its candidate rows
            r1 = rows - psum if rows - psum > b else b
            f1 = roof_time(r1, b, ctx_mean) if roof_time is not None else float(step_s(r1, b, ctx_mean))
            verify_s += f
            verify_base_s += f1 * noise[s] if noise_on else f1
        other = others.get(b)
        if other is None:
            other = others[b] = float(cost.other_s(b))
        tt = tt + d_sum + f + other
        # commit
        done = False
        for i in range(b):
            if pleft[i]:  # its prompt is in: a fresh request's first token leaves now
                pleft[i] = 0
                if out[i] == 0:
                    L.t_first[rid[i]] = tt
                    out[i] = 1
                    ctx[i] += 1
                    ctx_sum += 1
                    last[i] = tt
                    chn[i] += 1
                    if tgt[i] <= 1:
                        done = True
            else:
                gp = tt - last[i]
                gaps.append(gp)
                if gp > worst[i]:
                    worst[i] = gp
                last[i] = tt
                c = com[i]
                out[i] += c
                ctx[i] += c
                ctx_sum += c
                nround[i] += 1
                chn[i] += 1
                if out[i] >= tgt[i]:
                    done = True
        n_pre = 0  # every prompt in this step is in
        rows_sum += rows
        batch_sum += b
        rounds += nd
        prop_sum += psum
        acc_sum += asum
        if blocks > peak:
            peak = blocks
        s += 1
        if pending and not done:
            if stop_at_finish:
                break
            feed.finish(pending, tt)
            pending = []
        if done:  # finished requests leave; the feed counts them (a closed loop sends the next ones)
            fin = []
            for i in range(b):
                if out[i] >= tgt[i]:
                    r = rid[i]
                    fin.append(r)
                    out_of[r] = out[i]
                    last_of[r] = last[i]
                    if worst[i] > L.max_gap[r]:
                        L.max_gap[r] = worst[i]
                    L.chunks[r] += chn[i]
                    held.pop(r, None)
                    ctx_sum -= ctx[i]
            for i in range(b - 1, -1, -1):  # in place, from the back
                if out[i] >= tgt[i]:
                    for x in columns:
                        del x[i]
            b = len(rid)
            if pending:
                fin = pending + fin
                pending = []
            if stop_at_finish:  # the router must see this replica as it is now: the caller reports them
                pending = fin
                break
            feed.finish(fin, tt)
            if len(gaps) >= 1 << 16:
                L.gaps.append(np.array(gaps, dtype=np.float32))
                gaps = []
    # write the state back
    if gaps:
        L.gaps.append(np.array(gaps, dtype=np.float32))
    ids = np.array(rid, dtype=np.int64)
    if b:
        L.max_gap[ids] = np.maximum(L.max_gap[ids], worst)
        L.chunks[ids] += np.array(chn, dtype=np.int64)
    run["rid"] = ids
    run["out"] = np.array(out, dtype=np.int64)
    run["target"] = np.array(tgt, dtype=np.int64)
    run["ctx"] = np.array(ctx, dtype=np.int64)
    run["last"] = np.array(last, dtype=np.float64)
    run["pleft"] = np.array(pleft, dtype=np.int64)
    run["nround"] = np.array(nround, dtype=np.int64)
    run["chain"] = L.chain[ids]
    run["key"] = L.key[ids]
    L.steps += s
    L.fast_steps += s
    L.fast_segments += 1
    L.batch_sum += batch_sum
    L.rows_sum += rows_sum
    L.rounds += rounds
    L.proposed_sum += prop_sum
    L.accepted_sum += acc_sum
    L.peak_kv_tokens = max(L.peak_kv_tokens, peak * bs)
    rep.verify_s, rep.verify_base_s = verify_s, verify_base_s
    rep.nstep += s
    rep.last_dt = (tt - t) / s
    rep.clock = tt
    return rep._step_at(tt, pending) if fallback else pending
