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
trim or preempt: the step path takes them). Each step s costs what
:class:`~specledger.simulate.pricing.StepPrices` charges the step path,

    sum_i draft_s(gamma_is, C_s) + step_s(max(R_s, B), B, C_s) x jitter_s + other_s(B)
    R_s = sum_i (P_is + 1) (+ the prompts prefilled in step 0),  C_s = sum_i context_is / B

priced by the same :meth:`StepPrices.end_of_step` (a sum over requests is numpy's pairwise sum,
:func:`~specledger.simulate.pricing.pairwise_sum`; the replica's ``verify_s`` and ``verify_base_s`` are
left-to-right sums over its speculative steps), so the counters are the step path's to the last bit (gap
entries are appended per segment, step-major).

Two ways to run a segment, both with that outcome:

* :func:`run_small_batch` -- a small batch (<= SMALL_BATCH running): scalar Python step after step over
  rounds drawn ahead in bulk (:class:`~specledger.simulate.rounds.RoundCache`), taking before each step
  what the simulation loop and the admission take (:meth:`Replica.admit_next`; a lone replica also takes
  its arrivals from the :class:`~specledger.simulate.dispatch.Dispatcher` and hands finishes back, so a
  closed loop's next request joins at once). A lone replica runs on through
  arrivals and finishes -- at light load one call serves the whole run; one of several stops before
  the first step that starts at or after ``bound`` (the router places the next arrival) and, in a
  closed loop, after its first finish. It hands a step to the step path only when it must (a token
  budget that trims or does not take a prompt whole, a KV reservation that preempts, a batch grown
  past SMALL_BATCH).
* :func:`specledger.simulate.segment_arrays.run_segment` -- a large batch: requests x steps arrays up to the first finish, only
  where more than one step is expected before it (else the step path is cheaper).

Applies when: gamma is one static value (or, in scalar Python, the batch-size schedule); the table is sampled (not ``deterministic``); the batch is
not empty. The array segments also need: nothing can be admitted (the queue is empty or every slot
is taken) and nobody finished at admission; requests prefilling (chunked prefill) complete their
prompts in step 0. Anything else returns None: the caller takes one ordinary step.
"""

from __future__ import annotations

import math

import numpy as np

from specledger.simulate.batch_lists import (
    NO_GAP,
    clamp_gamma,
    clamped,
    exact_blocks,
    fill_gammas,
    read_batch,
    settle,
    write_batch,
)
from specledger.simulate.dispatch import Dispatcher
from specledger.simulate.replica import Replica
from specledger.simulate.rounds import WIDE, WIDE_MASK, RoundCache
from specledger.simulate.segment_arrays import run_segment

SMALL_BATCH = 128  # up to this many running requests a segment is priced in scalar Python (measured: faster
# than the step path up to ~128 running on a roofline; at 256 the step path's arrays win; at most 2047: a sum of
# wide round codes, rounds.WIDE)
AHEAD = 64  # rounds of a request fetched from the RoundCache at once
STEP_CACHE_MAX = 1 << 20  # step prices kept (StepPrices.step_cache) before the cache starts afresh


def advance(replica: Replica, bound: float = math.inf, dispatcher: Dispatcher | None = None) -> list[int]:
    """Advance ``replica`` one step or, where event skipping applies, every step up to the next event at once:
    the steps that start before ``bound`` (the next arrival the router must place), up to and including the
    first in which a request finishes. The outcome is the one :meth:`Replica.step` called that many times
    gives. A lone replica is given the ``dispatcher`` and may take arrivals and report finishes itself.
    Returns the finished ids not yet reported to the dispatcher."""
    t, finished = replica.admit(replica.clock)
    b = replica.running
    if b and replica.plan.vectorised and not replica.table.deterministic and replica.policies is None:
        done = None
        if dispatcher is not None and b <= SMALL_BATCH:
            done = run_small_batch(replica, t, finished, dispatcher, bound)
        elif (replica.plan.static is not None and not finished  # finished at admission: they leave with a step
              and not (replica.waiting and b < replica.cfg.max_num_seqs)):
            done = run_segment(replica, t, finished, bound, int(replica.plan.static))
        if done is not None:
            return done
    return replica.step_from(t, finished)


def run_small_batch(replica: Replica, t: float, finished: list[int], dispatcher: Dispatcher,
                    bound: float = math.inf) -> list[int] | None:
    """A replica, step after step in scalar Python while its batch stays small: before each step it does what
    the simulation loop and :meth:`Replica.admit` do (take the arrivals up to its clock from ``dispatcher``,
    jump to the next one when idle, admit waiting requests with :meth:`Replica.admit_next`), then prices the
    step with the replica's :class:`~specledger.simulate.pricing.StepPrices` and commits it as
    :meth:`Replica.step_from` does, and hands finished requests to ``dispatcher`` at the step's end (a closed
    loop's client sends its next request then). It stops -- writing the running batch back -- when nothing
    is left, and before a step it cannot take here: a prompt that does not fit the step's token budget
    whole, a token budget that trims proposals, a KV reservation that preempts, a batch grown past
    SMALL_BATCH; that step is then the step path's (admission already done). Returns None (nothing done)
    when the very first step is such a step, else the ids finished and not yet handed to ``dispatcher``.

    One of several replicas: the same, without taking arrivals (the router places them), up to the
    first step that starts at or after ``bound`` (the next arrival; in a closed loop also the earliest
    clock of the other busy replicas). Open loop: finishes are only counted, so it runs on through
    them; closed loop: a finish sends a request the router places, so it stops after the first.

    Speed, not meaning: the batch is kept as lists (:mod:`specledger.simulate.batch_lists`: tokens left, a
    constant context base, a round offset, each request's next round wide-coded, so a sum of codes is the
    step's (proposed, committed) pair); with one static gamma the commit loop draws each request's next round
    (clamps applied) and the next step reads the sums; a step's noiseless prices are looked up by (rows,
    candidates, batch, context sum) (:attr:`StepPrices.step_cache`; the mean context is sum / batch, so the
    key fixes the floats); the KV blocks, sum_i ceil(need_i / bs) <= (sum_i need_i + b (bs - 1)) // bs, are
    summed only when that bound could pass the peak or the budget (nd gamma or sum P bounds the decoding
    requests' share of the need); gaps of steps that every request took from one emit time are kept as one
    value (settle writes them before anything reads them)."""
    counters, cfg, plan, prices = replica.counters, replica.cfg, replica.plan, replica.prices
    gamma = plan.static
    gamma_at = plan.per_batch_size(cfg.max_num_seqs) if gamma is None else {}  # the batch-size schedule
    gamma_max = gamma if gamma is not None else max(gamma_at.values())
    if gamma is None:
        gamma = 0  # set step by step from the schedule (where anyone decodes)
    cache = counters.round_cache
    if cache is None or cache.gamma != gamma_max or cache.table is not replica.table:  # drawn at the largest
        cache = counters.round_cache = RoundCache(replica.table, replica.draws, gamma_max, counters.chain,
                                                  counters.draw_key, counters.target)  # gamma: prefix-consistent
    held_rounds = cache.held_rounds
    target_of, out_of, last_of, t_first = counters.target, counters.out, counters.t_last, counters.t_first
    batch = replica.batch
    request, target, rem, cbase, last_emit, prefill_left, roff = read_batch(batch)
    b = len(request)
    codes: list[list[int]] = []  # each request's rounds fetched from the cache (wide codes): codes[i][jo[i] + s] is
    # its round in step s
    jo: list[int] = []
    for r, n in zip(request, batch.rounds_done.tolist()):
        first, cl = held_rounds(r, n, AHEAD)
        codes.append(cl)
        jo.append(n - (1 if prefill_left[len(jo)] else 0) - first)
    worst_gap, chunks, nxt = [NO_GAP] * b, [0] * b, [0] * b
    columns = (request, target, rem, cbase, last_emit, prefill_left, roff, codes, jo, worst_gap, chunks, nxt)
    budget, kvb, bs, reserve = replica.token_budget, replica.kv_blocks_budget, cfg.block_size, cfg.reserve_gamma
    n_prefilling = sum(1 for x in prefill_left if x)  # requests prefilling (chunked prefill) in the next step
    noise: list[float] = []
    noise_on = prices.noise is not None
    # StepPrices.price_step inlined (the same floats): its forward functions, draft sums and per-step rest;
    # its verify sums are kept here (left to right, as there) and written back at the end
    fwd, fwd_two = prices.forward_one, prices.forward_two
    flat_sums = prices.flat_sums if prices.flat_draft is not None and prices.drafting else None
    need_gammas = prices.flat_draft is None
    step_cache = prices.step_cache
    verify_s, verify_base_s, last_f = prices.verify_s, prices.verify_base_s, prices.last_forward_s
    ctx_sum = sum(cbase) - sum(rem)
    gaps: list[float] = []  # the steps' gap entries, step-major, run-length coded: gaps[j] repeated reps[j] times
    reps: list[int] = []
    waiting = replica.waiting
    # totals over the steps: rounds = batch - prefilling, rows = rounds + proposed + prompt tokens,
    # accepted = committed - rounds
    batch_sum = pre_count = pre_sum = prop_sum = commit_sum = peak = 0
    budget_max = budget if budget is not None else 1 << 62
    bs1, kv_max = bs - 1, kvb if kvb is not None else 1 << 62
    # the KV blocks' upper bound (sum + b (bs - 1)) // bs can pass the peak or the budget only where the sum
    # reaches this: (min(peak, budget) + 1) bs
    b_lim = bs
    mask = WIDE_MASK
    tt = t
    s = 0
    fallback = False  # stop before a step the step path must take
    lone = len(dispatcher.replicas) == 1
    if lone:
        bound = math.inf  # it takes its arrivals itself
    stop_at_finish = dispatcher.closed and not lone
    t_arr = dispatcher.next_time() if lone else math.inf  # the next open-loop arrival this loop takes
    t_due = min(t_arr, bound)
    gammas = [0] * (b + SMALL_BATCH + 1)  # per running request in the step: its gamma (where draft_total reads it)
    pending = finished  # finished at admission (one-token requests without chunked prefill): reported with the step
    admit = False  # the caller has admitted for the first step
    # rem above this: gamma is not clamped (a static gamma; the rounds are drawn at a width <= gamma)
    unclamped = gamma + 1 if not gamma_at else 1 << 62
    # ready: every decoding request's nxt is its round in the next step; sum_w: their sum, nodraft: those
    # with gamma 0, pre_tokens: the prompt tokens of the requests prefilling in it
    ready = False
    sum_w = nodraft = pre_tokens = 0
    # lazy: every running request emitted at t_emit (not yet in last_emit) and its worst_gap lacks run_max
    lazy, t_emit, run_max = False, -math.inf, -math.inf  # (the largest gap since): settle writes them
    while True:
        if admit and (tt >= t_due or waiting or not b):  # what the simulation loop and the admission do
            # before every step but the first (nothing when no arrival, waiting or bound is due)
            if tt >= bound:
                break
            if not b and not waiting:
                if t_arr == math.inf:
                    break
                a0 = t_arr
                t_arr = dispatcher.dispatch_until(a0)
                if tt < a0:
                    tt = a0
            if t_arr <= tt:
                t_arr = dispatcher.dispatch_until(tt)
            t_due = min(t_arr, bound)
            if waiting and b < cfg.max_num_seqs:
                if lazy:  # write what was kept lazily
                    settle(last_emit, worst_gap, t_emit, run_max)
                    lazy = False
                reserved = 0
                if kvb is not None:
                    for i in range(b):
                        c = cbase[i] - rem[i]
                        reserved += c if bs == 1 else -(-c // bs)
                while (a := replica.admit_next(tt, b, reserved)) is not None:
                    tt = a.clock
                    reserved += a.blocks
                    r = a.request
                    if a.finished:
                        pending.append(r)
                        continue
                    n = int(counters.rounds_done[r])
                    first, cl = held_rounds(r, n, AHEAD)
                    left = int(target_of[r]) - int(out_of[r])
                    request.append(r)
                    target.append(int(target_of[r]))
                    rem.append(left)
                    cbase.append(a.context + left)
                    last_emit.append(float(last_of[r]))
                    prefill_left.append(a.prefill_left)
                    if a.prefill_left:  # it prefills in step s: no round there
                        n_prefilling += 1
                        pre_tokens += a.prefill_left
                        n -= 1
                    else:  # it decodes in step s: the propose loop draws its round
                        ready = False
                    roff.append(n - s)
                    codes.append(cl)
                    jo.append(n - s - first)
                    worst_gap.append(NO_GAP)
                    chunks.append(-s)  # chunks[i] + s: its chunks so far
                    nxt.append(0)
                    ctx_sum += a.context
                    b += 1
                if b > SMALL_BATCH:
                    fallback = True
                    break
            if not b:  # every request admitted has finished already (at the end of its prefill)
                if stop_at_finish:
                    break
                dispatcher.finish(pending, tt)
                pending = []
                continue
        admit = True
        # the step: what each request proposes, accepts and commits
        if not ready:  # propose: each decoding request's round in this step at this step's gamma
            if gamma_at and b > n_prefilling:
                gamma = gamma_at[b - n_prefilling]
            sum_w = nodraft = pre_tokens = 0
            for i in range(b):
                if prefill_left[i]:
                    pre_tokens += prefill_left[i]
                    continue
                try:
                    w = codes[i][jo[i] + s]
                except IndexError:
                    first, cl = held_rounds(request[i], roff[i] + s, AHEAD)
                    codes[i] = cl
                    jo[i] = roff[i] - first
                    w = cl[jo[i] + s]
                r = rem[i]
                if r <= unclamped:
                    g = clamp_gamma(gamma, r)
                    w = clamped(w, g)
                    if not g:
                        nodraft += 1
                nxt[i] = w
                sum_w += w
        nd = b - n_prefilling
        psum = sum_w >> WIDE
        csum = sum_w & mask  # tokens committed: sum (K + 1)
        rows = nd + psum + pre_tokens
        if rows > budget_max:  # the token budget trims proposals or takes a prompt in part
            fallback = True
        elif ctx_sum + (nd * gamma if reserve else psum) + b * bs1 >= b_lim:  # KV blocks: summed where their
            blocks = exact_blocks(rem, cbase, prefill_left, nxt, gamma, reserve, bs)  # bound may pass
            if b > 1 and blocks > kv_max:  # the peak or the budget
                fallback = True
            elif blocks > peak:
                peak = blocks
                b_lim = (min(peak, kv_max) + 1) * bs
        if fallback:
            if s == 0:
                return None
            break
        drafting = nd - nodraft if gamma else 0
        if not drafting:
            d_sum = 0.0
        elif flat_sums is not None and nd < 8:  # StepPrices.draft_total's first case
            d_sum = flat_sums[drafting]
        else:
            if need_gammas or drafting < nd:  # draft_total reads them
                fill_gammas(gammas, rem, prefill_left, gamma)
            d_sum = prices.draft_total(nd, drafting, gammas, prefill_left, ctx_sum / b)
        # StepPrices.price_step: forward (and, speculative, the forward without the candidates) x noise, then
        # the per-step rest; the noiseless prices depend on (rows, candidates, batch, context sum) alone
        key = (rows, psum, b, ctx_sum)
        pr = step_cache.get(key)
        if pr is None:
            if len(step_cache) >= STEP_CACHE_MAX:
                step_cache.clear()
            ctx_mean = ctx_sum / b
            f, fb = fwd_two(rows, rows - psum, b, ctx_mean) if psum else (fwd(rows, b, ctx_mean), 0.0)
            pr = step_cache[key] = (f, fb, prices.other(b))
        f, fb, ot = pr
        if noise_on:
            if s >= len(noise):
                noise.extend(replica.forward_noise(16, len(noise)) or [])
            nz = noise[s]
            f = f * nz
            if psum:
                verify_s += f
                verify_base_s += fb * nz
        elif psum:
            verify_s += f
            verify_base_s += fb
        last_f = f
        tt = tt + d_sum + f + ot
        # commit
        done = False
        ctx_sum += csum
        if not n_prefilling and not gamma_at:  # every request decodes, one gamma: each request's commit, then
            # its next round (clamped where rem <= gamma + 1), summed for the next step
            if lazy:  # every gap is tt - t_emit (step-major order: b equal entries)
                gp = tt - t_emit
                gaps.append(gp)
                reps.append(b)
                if gp > run_max:
                    run_max = gp
            else:
                for i in range(b):
                    gp = tt - last_emit[i]
                    gaps.append(gp)
                    reps.append(1)
                    if gp > worst_gap[i]:
                        worst_gap[i] = gp
                lazy = True
                run_max = -math.inf
            t_emit = tt
            s1 = s + 1
            sum_w = nodraft = 0
            for i in range(b):
                r = rem[i] = rem[i] - (nxt[i] & mask)
                if r <= 0:
                    done = True
                    continue
                try:  # the request's next round (unclamped >= 1: every r > 0 has one)
                    w = codes[i][jo[i] + s1]
                except IndexError:
                    first, cl = held_rounds(request[i], roff[i] + s1, AHEAD)
                    codes[i] = cl
                    jo[i] = roff[i] - first
                    w = cl[0]
                if r > unclamped:
                    nxt[i] = w
                    sum_w += w
                else:  # a clamped round
                    g = gamma if gamma < r - 1 else r - 1
                    if not g:
                        nodraft += 1
                    p = w >> WIDE  # batch_lists.clamped, inlined
                    k = (w & mask) - 1
                    if p > g:
                        p = g
                    if k > p:
                        k = p
                    w = nxt[i] = p << WIDE | (k + 1)
                    sum_w += w
            ready = True
        else:  # requests prefilling, or gamma by batch size: the propose loop takes the next step
            if lazy:
                settle(last_emit, worst_gap, t_emit, run_max)
            lazy = True  # every request emits at tt (but a preempted one prefilling again)
            for i in range(b):
                if prefill_left[i]:  # its prompt is in: a fresh request's first token leaves now
                    prefill_left[i] = 0
                    if rem[i] == target[i]:
                        t_first[request[i]] = tt
                        rem[i] -= 1
                        ctx_sum += 1
                        last_emit[i] = tt
                        if rem[i] <= 0:
                            done = True
                    else:  # a preempted request's prompt again: no token, no chunk
                        chunks[i] -= 1
                        lazy = False
                else:
                    gp = tt - last_emit[i]
                    gaps.append(gp)
                    reps.append(1)
                    if gp > worst_gap[i]:
                        worst_gap[i] = gp
                    last_emit[i] = tt
                    r = rem[i] = rem[i] - (nxt[i] & mask)
                    if r <= 0:
                        done = True
            t_emit, run_max = tt, -math.inf
            ready = False
            pre_count += n_prefilling
            pre_sum += pre_tokens
            n_prefilling = pre_tokens = 0  # every prompt in this step is in
        batch_sum += b
        prop_sum += psum
        commit_sum += csum
        s += 1
        if pending and not done:
            if stop_at_finish:
                break
            dispatcher.finish(pending, tt)
            pending = []
        if done:  # finished requests leave; the dispatcher counts them (a closed loop sends the next ones)
            if lazy:  # write what was kept lazily (and keep on: every request emitted at t_emit)
                settle(last_emit, worst_gap, t_emit, run_max)
                run_max = -math.inf
            fin = []
            for i in range(b):
                if rem[i] <= 0:
                    r = request[i]
                    fin.append(r)
                    out_of[r] = target[i] - rem[i]
                    last_of[r] = last_emit[i]
                    if worst_gap[i] > counters.max_gap[r]:
                        counters.max_gap[r] = worst_gap[i]
                    counters.chunks[r] += chunks[i] + s
                    cache.held.pop(r, None)
                    ctx_sum -= cbase[i] - rem[i]
            for i in range(b - 1, -1, -1):  # in place, from the back
                if rem[i] <= 0:
                    for x in columns:
                        del x[i]
            b = len(request)
            if pending:
                fin = pending + fin
                pending = []
            if stop_at_finish:  # the router must see this replica as it is now: the caller reports them
                pending = fin
                break
            dispatcher.finish(fin, tt)
            if len(gaps) >= 1 << 14:
                counters.gaps.append(np.repeat(np.array(gaps), reps).astype(np.float32))
                gaps, reps = [], []
    # write the running batch back
    if lazy:
        settle(last_emit, worst_gap, t_emit, run_max)
    prices.verify_s, prices.verify_base_s, prices.last_forward_s = verify_s, verify_base_s, last_f
    if gaps:
        counters.gaps.append(np.repeat(np.array(gaps), reps).astype(np.float32))
    ids = write_batch(batch, counters.chain, counters.draw_key, request, target, rem, cbase, last_emit,
                      prefill_left, roff, s)
    if b:
        counters.max_gap[ids] = np.maximum(counters.max_gap[ids], worst_gap)
        counters.chunks[ids] += np.array(chunks, dtype=np.int64) + s
    counters.steps += s
    counters.fast_steps += s
    counters.fast_segments += 1
    rounds = batch_sum - pre_count
    counters.batch_sum += batch_sum
    counters.rows_sum += rounds + prop_sum + pre_sum
    counters.rounds += rounds
    counters.proposed_sum += prop_sum
    counters.accepted_sum += commit_sum - rounds
    counters.peak_kv_tokens = max(counters.peak_kv_tokens, peak * bs)
    replica.steps_taken += s
    replica.last_dt = (tt - t) / s
    replica.clock = tt
    return replica.step_from(tt, pending) if fallback else pending
