"""A large batch's steps up to the next finish, priced at once as requests x steps arrays.

The outcome is :meth:`specledger.simulate.replica.Replica.step_from` taken that many times, to the last bit
(see :mod:`specledger.simulate.fastpath` for why and when it applies)."""

from __future__ import annotations

import math

import numpy as np

from specledger.simulate.replica import Replica

MIN_STEPS, MAX_STEPS = 2, 256


def steps_to_draw(replica: Replica, t: float, bound: float, remaining: np.ndarray, gamma: int) -> int:
    """Rounds to draw ahead: the steps until the first request is expected to finish (its remaining
    tokens over the mean tokens per round so far) or until ``bound`` at the last step's pace, + 2,
    within MIN_STEPS..MAX_STEPS (too few only costs another segment; too many, unused draws)."""
    c = replica.counters
    per_round = (c.accepted_sum + c.rounds) / c.rounds if c.rounds else 1.0 + gamma / 2
    n = float(remaining.min()) / per_round
    if bound < math.inf and replica.last_dt > 0:
        n = min(n, (bound - t) / replica.last_dt)
    return int(min(MAX_STEPS, max(MIN_STEPS, n + 2)))


def run_segment(replica: Replica, t: float, finished: list[int], bound: float, gamma: int) -> list[int] | None:
    """The replica's steps from clock ``t`` (admission done, nothing admissible) up to the first finish,
    cut before the first step that starts at or after ``bound`` and before a step whose token budget or
    KV reservation would bind; None (nothing done) when not even one step can be taken so, or when a
    request is expected to finish in the very first step (one step is the step path's job)."""
    table, cfg, run, c = replica.table, replica.cfg, replica.batch, replica.counters
    b = run.size
    out0, target, ctx0 = run.out, run.target, run.context
    prefill_left = run.prefill_left
    pre = prefill_left > 0
    npre = int(np.count_nonzero(pre)) if cfg.chunked_prefill else 0
    rem0 = target - out0
    if c.rounds and float(rem0.min()) * c.rounds <= c.accepted_sum + c.rounds:
        return None
    n_steps = steps_to_draw(replica, t, bound, rem0, gamma)
    cols = np.arange(n_steps)
    if npre:
        start = pre.astype(np.int64)  # prefilling requests decode from step 1
        dec = cols[None, :] >= start[:, None]
        fresh = pre & (out0 == 0)  # their first token leaves at the end of step 0
    else:
        start = None
        dec = np.ones((b, n_steps), dtype=bool)
        fresh = None
    # draws at the full gamma for rounds rounds_done + (s - start)
    w = min(gamma, table.max_gamma)
    if w > 0:
        rounds = run.rounds_done[:, None] + (cols[None, :] if start is None else cols[None, :] - start[:, None])
        u = replica.draws.uniforms(np.repeat(run.draw_key, n_steps), rounds.ravel(), w).reshape(2, b, n_steps, w)
        pfull, kfull = table.full_outcomes(run.chain[:, None], u)
    else:
        pfull = kfull = np.zeros((b, n_steps), dtype=np.int64)
    raw = kfull + 1
    if npre:
        raw = np.where(dec, raw, 0)
        raw[:, 0] += fresh
    cum = np.cumsum(raw, axis=1)
    fin_cols = (cum >= rem0[:, None]).any(axis=0)
    n = int(fin_cols.argmax()) + 1 if fin_cols.any() else n_steps
    raw, cum, pfull, kfull, dec = raw[:, :n], cum[:, :n], pfull[:, :n], kfull[:, :n], dec[:, :n]
    prev = cum - raw  # tokens committed in the segment before step s
    g = np.maximum(np.minimum(gamma, rem0[:, None] - prev - 1), 0)
    if npre:
        g[~dec] = 0
    prop = np.minimum(pfull, g)
    acc = np.minimum(kfull, prop)
    nd = dec.sum(axis=0) if npre else np.full(n, b)
    psum = prop.sum(axis=0)
    pre_tokens = int(prefill_left.sum()) if npre else 0
    # the token budget must not bind (step 0 must fit every pending prompt whole)
    budget = replica.token_budget
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
    blocks = cfg.blocks(need).sum(axis=0)
    kvb = replica.kv_blocks_budget
    if kvb is not None and b > 1:
        over = blocks > kvb
        if over.any():
            n = int(over.argmax())
            if n == 0:
                return None
            ctx, blocks = ctx[:, :n], blocks[:n]
    g, prop, acc, dec, nd, psum = g[:, :n], prop[:, :n], acc[:, :n], dec[:, :n], nd[:n], psum[:n]
    # prices of every step
    prices = replica.prices
    ctx_mean = ctx.sum(axis=0) / b
    rows = nd + psum
    if npre:
        rows[0] += pre_tokens
    fwd = prices.forwards(rows, b, ctx_mean).tolist()
    spec = np.flatnonzero(psum > 0)  # speculative steps: also priced without their candidate rows
    base = dict(zip(spec.tolist(), prices.forwards(rows[spec] - psum[spec], b, ctx_mean[spec]).tolist()))
    if prices.drafting and gamma > 0:
        dcost = prices.drafts(np.ascontiguousarray(g.T), ctx_mean)
        draft = dcost.sum(axis=1).tolist()
        if npre:  # the step path sums over the decoding requests only
            draft[0] = float(dcost[0][dec[:, 0]].sum())
    else:
        draft = [0.0] * n
    noise = replica.forward_noise(n)
    emit: list[float] = []
    tt = t
    for s in range(n):
        if s and tt >= bound:
            break
        tt = prices.end_of_step(tt, draft[s], fwd[s], base.get(s), noise[s] if noise is not None else None, b)
        emit.append(tt)
    n = len(emit)
    _commit(replica, t, emit, n, b, cum, prop, acc, dec, rows, blocks, rem0, fresh, npre)
    return replica.retire(finished)


def _commit(replica: Replica, t: float, emit: list[float], n: int, b: int, cum: np.ndarray, prop: np.ndarray,
            acc: np.ndarray, dec: np.ndarray, rows: np.ndarray, blocks: np.ndarray, rem0: np.ndarray,
            fresh: np.ndarray | None, npre: int) -> None:
    """Write steps 0..n-1 to the running batch and the counters, as n calls of the step path would."""
    c, run, cfg = replica.counters, replica.batch, replica.cfg
    dec = dec[:, :n]
    e = np.asarray(emit)
    rid = run.request
    last0 = run.last_emit
    # emission gaps: a request decoding in step s waits since its previous emission
    before = np.empty((b, n))
    before[:, 0] = last0
    before[:, 1:] = e[:-1]
    if npre and n > 1:
        recomputed = ~dec[:, 0] & ~fresh  # prefilled in step 0 without emitting (after a preemption)
        before[recomputed, 1] = last0[recomputed]
    gaps = e[None, :] - before
    c.gaps.append(gaps.T[dec.T].astype(np.float32))  # step-major, as the step path appends them
    worst = np.where(dec, gaps, -np.inf).max(axis=1)
    c.max_gap[rid] = np.maximum(c.max_gap[rid], worst)
    steps_dec = dec.sum(axis=1)
    if npre:
        rid_f = rid[fresh]
        c.t_first[rid_f] = e[0]
        c.chunks[rid_f] = 1
        run.prefill_left = np.zeros(b, dtype=np.int64)
    c.chunks[rid] += steps_dec
    added = np.minimum(cum[:, n - 1], rem0)
    run.out = run.out + added
    run.context = run.context + added
    emitted_last = dec[:, n - 1] if not npre or n > 1 else dec[:, 0] | fresh
    run.last_emit = np.where(emitted_last, e[n - 1], last0)
    run.rounds_done = run.rounds_done + steps_dec
    c.steps += n
    c.fast_steps += n
    c.fast_segments += 1
    c.batch_sum += b * n
    c.rows_sum += int(rows[:n].sum())
    c.rounds += int(steps_dec.sum())
    c.proposed_sum += int(prop[:, :n].sum())
    c.accepted_sum += int(acc[:, :n].sum())
    c.peak_kv_tokens = max(c.peak_kv_tokens, int(blocks[:n].max()) * cfg.block_size)
    replica.steps_taken += n
    replica.last_dt = (emit[-1] - t) / n
    replica.clock = emit[-1]
