"""A small batch's steps in scalar Python: :func:`specledger.simulate.fastpath.run_small_batch`'s loop.

Each step goes through the phases of :meth:`specledger.simulate.replica.Replica.step_from`, with the same
outcome to the last bit: before it, what the simulation loop and the admission do (:meth:`ScalarSteps.between`:
arrivals from the dispatcher, :meth:`Replica.admit_next`); then propose (:meth:`ScalarSteps.propose`: each
decoding request's round at its clamped gamma), the limits (:meth:`ScalarSteps.must_hand_over`: a token budget
or KV reservation that would bind hands the step to the step path), the price (the step path's own
:meth:`StepPrices.price_step`), commit (:meth:`ScalarSteps.commit_all` / :meth:`ScalarSteps.commit_mixed`) and
retire (:meth:`ScalarSteps.retire`); :meth:`ScalarSteps.write_back` writes the running batch back.

Speed, not meaning: the batch is kept as lists (:mod:`specledger.simulate.batch_lists`: tokens left, a
constant context base, a round offset, each request's next round wide-coded, so a sum of codes is the
step's (proposed, committed) pair); with one static gamma the commit loop draws each request's next round
(clamps applied) and the next step reads the sums; a step's noiseless prices are looked up by (rows,
candidates, batch, context sum) (:meth:`StepPrices.step_prices`); the KV blocks, sum_i ceil(need_i / bs) <=
(sum_i need_i + b (bs - 1)) // bs, are summed only when that bound could pass the peak or the budget (nd gamma
or sum P bounds the decoding requests' share of the need); gaps of steps that every request took from one emit
time are kept as one value (settle writes them before anything reads them).
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
from specledger.simulate.replica import Admission, Replica
from specledger.simulate.rounds import WIDE, WIDE_MASK, RoundCache

GAPS_FLUSH = 1 << 14  # gap entries kept as (value, repeats) before they go to the counters
_STOP, _NEXT, _STEP = 0, 1, 2  # what ScalarSteps.between says: stop, go round again, take the step


class ScalarSteps:
    """One call of the scalar loop over ``replica`` from clock ``t`` (admission done for the first step)."""

    def __init__(self, replica: Replica, t: float, finished: list[int], dispatcher: Dispatcher, bound: float,
                 small_batch: int, ahead: int) -> None:
        self.replica, self.dispatcher, self.small_batch, self.ahead = replica, dispatcher, small_batch, ahead
        c, cfg, plan, prices = replica.counters, replica.cfg, replica.plan, replica.prices
        self.counters, self.cfg, self.prices = c, cfg, prices
        self.gamma_at = plan.per_batch_size(cfg.max_num_seqs) if plan.static is None else {}  # batch-size schedule
        gamma_max = plan.static if plan.static is not None else max(self.gamma_at.values())
        self.gamma = plan.static or 0  # with the schedule: set step by step (where anyone decodes)
        cache = c.round_cache
        if cache is None or cache.gamma != gamma_max or cache.table is not replica.table:  # drawn at the largest
            cache = c.round_cache = RoundCache(replica.table, replica.draws, gamma_max, c.chain, c.draw_key,
                                               c.target)  # gamma: prefix-consistent
        self.cache, self.held_rounds = cache, cache.held_rounds
        batch = replica.batch
        self.request, self.target, self.rem, self.cbase, self.last_emit, self.prefill_left, self.roff = (
            read_batch(batch))
        # codes[i]: request i's rounds fetched from the cache (wide codes); codes[i][jo[i] + s]: its round in step s
        self.codes: list[list[int]] = []
        self.jo: list[int] = []
        for r, n in zip(self.request, batch.rounds_done.tolist()):
            first, cl = self.held_rounds(r, n, ahead)
            self.codes.append(cl)
            self.jo.append(n - (1 if self.prefill_left[len(self.jo)] else 0) - first)
        self.b = b = len(self.request)
        self.worst_gap, self.chunks, self.nxt = [NO_GAP] * b, [0] * b, [0] * b
        self.columns = (self.request, self.target, self.rem, self.cbase, self.last_emit, self.prefill_left,
                        self.roff, self.codes, self.jo, self.worst_gap, self.chunks, self.nxt)
        kvb = replica.kv_blocks_budget
        self.budget_max = replica.token_budget if replica.token_budget is not None else 1 << 62
        self.bs, self.reserve, self.kv_max = cfg.block_size, cfg.reserve_gamma, kvb if kvb is not None else 1 << 62
        self.peak = 0
        # the KV blocks' upper bound (sum + b (bs - 1)) // bs can pass the peak or the budget only where the sum
        # reaches this: (min(peak, budget) + 1) bs
        self.b_lim = self.bs
        self.n_prefilling = sum(1 for x in self.prefill_left if x)  # prefilling (chunked prefill) in the next step
        self.noise: list[float] | None = [] if prices.noise is not None else None
        self.flat_sums = prices.flat_sums if prices.flat_draft is not None and prices.drafting else None
        self.ctx_sum = sum(self.cbase) - sum(self.rem)
        self.gaps: list[float] = []  # the steps' gap entries, step-major, run-length coded: gaps[j], reps[j] times
        self.reps: list[int] = []
        # totals over the steps: rounds = batch - prefilling, rows = rounds + proposed + prompt tokens,
        # accepted = committed - rounds
        self.batch_sum = self.pre_count = self.pre_sum = self.prop_sum = self.commit_sum = 0
        self.t0 = self.tt = t
        self.s = 0
        self.fallback = False  # stop before a step the step path must take
        lone = len(dispatcher.replicas) == 1
        self.bound = math.inf if lone else bound  # a lone replica takes its arrivals itself
        self.stop_at_finish = dispatcher.closed and not lone
        self.t_arr = dispatcher.next_time() if lone else math.inf  # the next open-loop arrival this loop takes
        self.t_due = min(self.t_arr, self.bound)
        self.gammas = [0] * (b + small_batch + 1)  # per running request: its gamma (where draft_total reads it)
        self.pending = finished  # finished at admission (one-token requests, no chunked prefill): with the step
        # rem above this: gamma is not clamped (a static gamma; the rounds are drawn at a width <= gamma)
        self.unclamped = self.gamma + 1 if not self.gamma_at else 1 << 62
        # ready: every decoding request's nxt is its round in the next step; sum_w: their sum, nodraft: those
        # with gamma 0, pre_tokens: the prompt tokens of the requests prefilling in it
        self.ready = False
        self.sum_w = self.nodraft = self.pre_tokens = 0
        # lazy: every running request emitted at t_emit (not yet in last_emit) and its worst_gap lacks run_max
        self.lazy, self.t_emit, self.run_max = False, -math.inf, -math.inf  # (the largest gap since): settle

    # ----------------------------------------------------------------------------------------
    def run(self) -> list[int] | None:
        """Steps until nothing is left or a step is the step path's; None when the very first one is."""
        first = True
        while True:
            if not first and (self.tt >= self.t_due or self.replica.waiting or not self.b):
                go = self.between()
                if go == _STOP:
                    break
                if go == _NEXT:
                    continue
            first = False
            if not self.ready:
                self.propose()
            b, sum_w = self.b, self.sum_w
            nd = b - self.n_prefilling
            psum = sum_w >> WIDE
            csum = sum_w & WIDE_MASK  # tokens committed: sum (K + 1)
            rows = nd + psum + self.pre_tokens
            if self.must_hand_over(nd, psum, rows):
                self.fallback = True
                if self.s == 0:
                    return None
                break
            self.tt = self.prices.price_step(self.tt, self.draft_sum(nd), rows, psum, b, self.ctx_sum,
                                             self.noise_at(self.s))
            self.ctx_sum += csum
            done = self.commit_all() if not self.n_prefilling and not self.gamma_at else self.commit_mixed()
            self.batch_sum += b
            self.prop_sum += psum
            self.commit_sum += csum
            self.s += 1
            if self.pending and not done:
                if self.stop_at_finish:
                    break
                self.dispatcher.finish(self.pending, self.tt)
                self.pending = []
            if done and self.retire():
                break
        return self.write_back()

    def between(self) -> int:
        """What the simulation loop and the admission do before every step but the first (nothing when no
        arrival, waiting request or bound is due): _STOP, _NEXT (nobody running: round again) or _STEP."""
        if self.tt >= self.bound:
            return _STOP
        dispatcher = self.dispatcher
        if not self.b and not self.replica.waiting:
            if self.t_arr == math.inf:
                return _STOP
            a0 = self.t_arr
            self.t_arr = dispatcher.dispatch_until(a0)
            if self.tt < a0:
                self.tt = a0
        if self.t_arr <= self.tt:
            self.t_arr = dispatcher.dispatch_until(self.tt)
        self.t_due = min(self.t_arr, self.bound)
        if self.replica.waiting and self.b < self.cfg.max_num_seqs:
            self.admit()
            if self.b > self.small_batch:
                self.fallback = True
                return _STOP
        if not self.b:  # every request admitted has finished already (at the end of its prefill)
            if self.stop_at_finish:
                return _STOP
            dispatcher.finish(self.pending, self.tt)
            self.pending = []
            return _NEXT
        return _STEP

    def admit(self) -> None:
        """:meth:`Replica.admit` on the lists: waiting requests join while a slot and the KV budget hold."""
        if self.lazy:  # write what was kept lazily
            settle(self.last_emit, self.worst_gap, self.t_emit, self.run_max)
            self.lazy = False
        reserved, bs = 0, self.bs
        if self.replica.kv_blocks_budget is not None:
            for i in range(self.b):
                c = self.cbase[i] - self.rem[i]
                reserved += c if bs == 1 else -(-c // bs)
        while (a := self.replica.admit_next(self.tt, self.b, reserved)) is not None:
            self.tt = a.clock
            reserved += a.blocks
            if a.finished:
                self.pending.append(a.request)
            else:
                self.join(a)

    def join(self, a: Admission) -> None:
        """Request ``a.request`` joins the lists in step s (prefilling there, or decoding: no round drawn yet)."""
        c, r, s = self.counters, a.request, self.s
        n = int(c.rounds_done[r])
        first, cl = self.held_rounds(r, n, self.ahead)
        left = int(c.target[r]) - int(c.out[r])
        self.request.append(r)
        self.target.append(int(c.target[r]))
        self.rem.append(left)
        self.cbase.append(a.context + left)
        self.last_emit.append(float(c.t_last[r]))
        self.prefill_left.append(a.prefill_left)
        if a.prefill_left:  # it prefills in step s: no round there
            self.n_prefilling += 1
            self.pre_tokens += a.prefill_left
            n -= 1
        else:  # it decodes in step s: the propose loop draws its round
            self.ready = False
        self.roff.append(n - s)
        self.codes.append(cl)
        self.jo.append(n - s - first)
        self.worst_gap.append(NO_GAP)
        self.chunks.append(-s)  # chunks[i] + s: its chunks so far
        self.nxt.append(0)
        self.ctx_sum += a.context
        self.b += 1

    # ----------------------------------------------------------------------------------------
    def round_of(self, i: int, step: int) -> int:
        """Request i's round in ``step`` (wide code at the full gamma), fetching more from the cache when out."""
        try:
            return self.codes[i][self.jo[i] + step]
        except IndexError:
            first, cl = self.held_rounds(self.request[i], self.roff[i] + step, self.ahead)
            self.codes[i] = cl
            self.jo[i] = self.roff[i] - first
            return cl[self.jo[i] + step]

    def propose(self) -> None:
        """Each decoding request's round in this step at this step's (clamped) gamma: ``nxt``, their sum."""
        if self.gamma_at and self.b > self.n_prefilling:
            self.gamma = self.gamma_at[self.b - self.n_prefilling]
        gamma, s, unclamped, rem, nxt, prefill_left = self.gamma, self.s, self.unclamped, self.rem, self.nxt, \
            self.prefill_left
        sum_w = nodraft = pre_tokens = 0
        for i in range(self.b):
            if prefill_left[i]:
                pre_tokens += prefill_left[i]
                continue
            w = self.round_of(i, s)
            r = rem[i]
            if r <= unclamped:
                g = clamp_gamma(gamma, r)
                w = clamped(w, g)
                if not g:
                    nodraft += 1
            nxt[i] = w
            sum_w += w
        self.sum_w, self.nodraft, self.pre_tokens = sum_w, nodraft, pre_tokens

    def must_hand_over(self, nd: int, psum: int, rows: int) -> bool:
        """The step's token budget trims proposals or takes a prompt in part, or its KV reservation preempts
        (the KV blocks summed only where their bound may pass the peak or the budget; a new peak is kept)."""
        if rows > self.budget_max:
            return True
        bs = self.bs
        if self.ctx_sum + (nd * self.gamma if self.reserve else psum) + self.b * (bs - 1) >= self.b_lim:
            blocks = exact_blocks(self.rem, self.cbase, self.prefill_left, self.nxt, self.gamma, self.reserve, bs)
            if self.b > 1 and blocks > self.kv_max:
                return True
            if blocks > self.peak:
                self.peak = blocks
                self.b_lim = (min(blocks, self.kv_max) + 1) * bs
        return False

    def draft_sum(self, nd: int) -> float:
        """:meth:`StepPrices.draft_total` of the step's ``nd`` decoding requests."""
        drafting = nd - self.nodraft if self.gamma else 0
        if not drafting:
            return 0.0
        if self.flat_sums is not None and nd < 8:  # StepPrices.draft_total's first case
            return self.flat_sums[drafting]
        if self.prices.flat_draft is None or drafting < nd:  # draft_total reads them
            fill_gammas(self.gammas, self.rem, self.prefill_left, self.gamma)
        return self.prices.draft_total(nd, drafting, self.gammas, self.prefill_left, self.ctx_sum / self.b)

    def noise_at(self, s: int) -> float | None:
        """Step s's forward noise (the replica's keyed stream, fetched 16 steps at a time); None without."""
        noise = self.noise
        if noise is None:
            return None
        if s >= len(noise):
            noise.extend(self.replica.forward_noise(16, len(noise)) or [])
        return noise[s]

    # ----------------------------------------------------------------------------------------
    def commit_all(self) -> bool:
        """Every request decodes at one gamma: each request's commit, then its next round (clamped where
        rem <= gamma + 1), summed for the next step. True when a request finished."""
        tt, b, rem, nxt, gaps, reps = self.tt, self.b, self.rem, self.nxt, self.gaps, self.reps
        if self.lazy:  # every gap is tt - t_emit (step-major order: b equal entries)
            gp = tt - self.t_emit
            gaps.append(gp)
            reps.append(b)
            if gp > self.run_max:
                self.run_max = gp
        else:
            last_emit, worst_gap = self.last_emit, self.worst_gap
            for i in range(b):
                gp = tt - last_emit[i]
                gaps.append(gp)
                reps.append(1)
                if gp > worst_gap[i]:
                    worst_gap[i] = gp
            self.lazy = True
            self.run_max = -math.inf
        self.t_emit = tt
        s1 = self.s + 1
        gamma, unclamped, codes, jo, mask = self.gamma, self.unclamped, self.codes, self.jo, WIDE_MASK
        done = False
        sum_w = nodraft = 0
        for i in range(b):
            r = rem[i] = rem[i] - (nxt[i] & mask)
            if r <= 0:
                done = True
                continue
            try:  # the request's next round (unclamped >= 1: every r > 0 has one)
                w = codes[i][jo[i] + s1]
            except IndexError:
                w = self.round_of(i, s1)
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
        self.sum_w, self.nodraft, self.ready = sum_w, nodraft, True
        return done

    def commit_mixed(self) -> bool:
        """Requests prefilling, or gamma by batch size: each request's commit (a fresh request whose prompt is
        in emits its first token); the propose loop takes the next step. True when a request finished."""
        tt, rem, prefill_left, last_emit = self.tt, self.rem, self.prefill_left, self.last_emit
        if self.lazy:
            settle(last_emit, self.worst_gap, self.t_emit, self.run_max)
        self.lazy = True  # every request emits at tt (but a preempted one prefilling again)
        done = False
        for i in range(self.b):
            if prefill_left[i]:  # its prompt is in: a fresh request's first token leaves now
                prefill_left[i] = 0
                if rem[i] == self.target[i]:
                    self.counters.t_first[self.request[i]] = tt
                    rem[i] -= 1
                    self.ctx_sum += 1
                    last_emit[i] = tt
                    if rem[i] <= 0:
                        done = True
                else:  # a preempted request's prompt again: no token, no chunk
                    self.chunks[i] -= 1
                    self.lazy = False
            else:
                gp = tt - last_emit[i]
                self.gaps.append(gp)
                self.reps.append(1)
                if gp > self.worst_gap[i]:
                    self.worst_gap[i] = gp
                last_emit[i] = tt
                r = rem[i] = rem[i] - (self.nxt[i] & WIDE_MASK)
                if r <= 0:
                    done = True
        self.t_emit, self.run_max = tt, -math.inf
        self.ready = False
        self.pre_count += self.n_prefilling
        self.pre_sum += self.pre_tokens
        self.n_prefilling = self.pre_tokens = 0  # every prompt in this step is in
        return done

    def retire(self) -> bool:
        """Finished requests leave; the dispatcher counts them (a closed loop sends the next ones). True: stop
        here (one of several replicas in a closed loop: the router must see this replica as it is now)."""
        if self.lazy:  # write what was kept lazily (and keep on: every request emitted at t_emit)
            settle(self.last_emit, self.worst_gap, self.t_emit, self.run_max)
            self.run_max = -math.inf
        c, rem, s = self.counters, self.rem, self.s
        fin = []
        for i in range(self.b):
            if rem[i] <= 0:
                r = self.request[i]
                fin.append(r)
                c.out[r] = self.target[i] - rem[i]
                c.t_last[r] = self.last_emit[i]
                if self.worst_gap[i] > c.max_gap[r]:
                    c.max_gap[r] = self.worst_gap[i]
                c.chunks[r] += self.chunks[i] + s
                self.cache.held.pop(r, None)
                self.ctx_sum -= self.cbase[i] - rem[i]
        for i in range(self.b - 1, -1, -1):  # in place, from the back
            if rem[i] <= 0:
                for x in self.columns:
                    del x[i]
        self.b = len(self.request)
        if self.pending:
            fin = self.pending + fin
            self.pending = []
        if self.stop_at_finish:  # the caller reports them
            self.pending = fin
            return True
        self.dispatcher.finish(fin, self.tt)
        if len(self.gaps) >= GAPS_FLUSH:
            self.flush_gaps()
        return False

    def flush_gaps(self) -> None:
        self.counters.gaps.append(np.repeat(np.array(self.gaps), self.reps).astype(np.float32))
        self.gaps, self.reps = [], []

    def write_back(self) -> list[int]:
        """The lists back into the running batch, the totals into the counters; the step path takes the step
        handed over. Returns the ids finished and not yet handed to the dispatcher."""
        c, replica, s = self.counters, self.replica, self.s
        if self.lazy:
            settle(self.last_emit, self.worst_gap, self.t_emit, self.run_max)
        if self.gaps:
            self.flush_gaps()
        ids = write_batch(replica.batch, c.chain, c.draw_key, self.request, self.target, self.rem, self.cbase,
                          self.last_emit, self.prefill_left, self.roff, s)
        if self.b:
            c.max_gap[ids] = np.maximum(c.max_gap[ids], self.worst_gap)
            c.chunks[ids] += np.array(self.chunks, dtype=np.int64) + s
        c.steps += s
        c.fast_steps += s
        c.fast_segments += 1
        rounds = self.batch_sum - self.pre_count
        c.batch_sum += self.batch_sum
        c.rows_sum += rounds + self.prop_sum + self.pre_sum
        c.rounds += rounds
        c.proposed_sum += self.prop_sum
        c.accepted_sum += self.commit_sum - rounds
        c.peak_kv_tokens = max(c.peak_kv_tokens, self.peak * self.bs)
        replica.steps_taken += s
        replica.last_dt = (self.tt - self.t0) / s
        replica.clock = self.tt
        return replica.step_from(self.tt, self.pending) if self.fallback else self.pending
