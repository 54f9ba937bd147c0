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

with the same float operations in the same order (the emission clock is a left-to-right sum), so the
ledger is the step path's to the last bit (gap entries are appended per segment, step-major).

Applies when: gamma is one static value; the table is sampled (not ``deterministic``); the batch is
not empty; nothing can be admitted (the queue is empty or every slot is taken); requests prefilling
(chunked prefill) complete their prompts in step 0. Anything else returns None: the caller takes one
ordinary step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from specledger.simulate.hardware import RooflineCost

if TYPE_CHECKING:
    from specledger.simulate.replica import Replica

MIN_STEPS, MAX_STEPS = 2, 256


def step_costs(cost: Any, rows: np.ndarray, batch: int, context: np.ndarray) -> np.ndarray:
    """``cost.step_s(rows_s, batch, context_s)`` for every s: the cost's own ``step_s_many`` when it has
    one, a vectorised copy of :meth:`RooflineCost.step_s` (same operations, same order) for a roofline,
    else one call per step."""
    many = getattr(cost, "step_s_many", None)
    if many is not None:
        return np.asarray(many(rows, batch, context), dtype=np.float64)
    if type(cost) is RooflineCost:
        return _roofline_step(cost, np.maximum(rows, 1), max(1, batch), np.maximum(context, 0.0))
    return np.array([cost.step_s(r, batch, c) for r, c in zip(rows.tolist(), context.tolist())], dtype=np.float64)


def _roofline_step(cost: RooflineCost, rows: np.ndarray, batch: int, context: np.ndarray) -> np.ndarray:
    """:meth:`RooflineCost._step` on arrays (tests check it against the scalar one)."""
    m, hw = cost.model, cost.hw
    m_kv = m.kv_bytes_per_token
    byt = m.weight_bytes + batch * context * m_kv + rows * m_kv
    flops = 2 * m.params * rows + 4 * m.layers * m.heads * m.head_dim * rows * context
    return np.maximum(flops / (hw.peak_tflops * 1e12 * cost.eff_compute),
                      byt / (hw.hbm_bandwidth_gb_s * 1e9 * cost.eff_memory)) + hw.launch_overhead_s


def draft_costs(cost: Any, drafter: str, gammas: np.ndarray, context: np.ndarray) -> np.ndarray:
    """Drafting time of every request in every step: ``draft_s(drafter, gamma[s, i], context[s])``
    where gamma > 0, else 0 (shape of ``gammas``: steps x requests)."""
    out = np.zeros(gammas.shape)
    if type(cost) is RooflineCost and not (cost.draft_model is not None and drafter in ("model", "draft_model")):
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


def segment(rep: Replica, t: float, finished: list[int], bound: float) -> list[int] | None:
    """Run the replica's steps from clock ``t`` (admission done) up to the next event at once; returns
    ``finished`` extended by the requests finished, or None when the segment does not apply (see the
    module docstring) -- then nothing has changed."""
    plan, table, cfg = rep.plan, rep.table, rep.cfg
    if plan.static is None or table.deterministic or rep.policies is not None:
        return None
    run = rep.run
    b = int(run["rid"].shape[0])
    if b == 0 or (rep.waiting and b < cfg.max_num_seqs):
        return None
    gam = int(plan.static)
    out0, target, ctx0 = run["out"], run["target"], run["ctx"]
    pleft = run["pleft"]
    pre = pleft > 0
    npre = int(np.count_nonzero(pre)) if cfg.chunked_prefill else 0
    rem0 = target - out0
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
        chain = run["chain"]
        filled = np.cumprod(u[0] < table.fill[chain, None, :w], axis=2)
        pfull = filled.sum(axis=2)
        kfull = np.cumprod((u[1] < table.accept[chain, None, :w]) & (filled > 0), axis=2).sum(axis=2)
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
