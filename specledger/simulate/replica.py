"""One serving replica, simulated a step at a time: continuous batching with speculation.

It follows :class:`specledger.engine.batch.BatchScheduler` (and vLLM v1's scheduler) step for step,
with numpy arrays over the running batch instead of per-token events:

  1. admit waiting requests (preempted ones first, then arrival order) while a sequence slot is
     free (``max_num_seqs``) and the KV budget holds their committed context + 1; without chunked
     prefill each admission runs its prefill now, sequentially (``prefill_s(prompt)``), and its first
     token leaves when that prefill ends; a preempted request recomputes ``prefill_s(context - 1)``;
  2. every decoding request is asked gamma (:class:`~specledger.simulate.gamma.GammaPlan`), capped at
     its remaining tokens - 1; its drafter fills P <= gamma and the target accepts K <= P
     (:meth:`ChainTable.sample`);
  3. a per-step token budget counts gamma + 1 rows per decoding request (plus prefill chunks when
     chunked) and trims the largest proposals first (K is cut with its proposal: K' = min(K, P'));
  4. KV for the candidates is reserved: sum over running requests of blocks(context + P) (or + gamma
     with ``reserve_gamma``, as vLLM reserves lookahead slots whether filled or not); while it
     exceeds the budget the most recently admitted request is preempted (its tokens kept; it waits
     at the front and is recomputed);
  5. the step costs sum_i draft_s(gamma_i) + step_s(rows, B, mean context) + other_s(B) (the forward
     and each prefill times the profile's measured noise when it has some: ``cost.jitter``, fed a
     keyed uniform -- :func:`~specledger.simulate.chains.keyed_stream` on (replica, its step number)
     for the forward, (request, its admission number) for a prefill -- so a step's noise does not
     depend on how the steps are computed); every decoding request emits min(K + 1, remaining) tokens
     at the step's end. A speculative step (some request proposed candidates, sum P > 0) adds its
     forward to the replica's ``verify_s`` and step_s(rows - sum P, B, mean context), times the same
     noise, to its ``verify_base_s`` (:func:`specledger.simulate.simulator.break_even_verify_premium`).

:meth:`Replica.step` takes one step; :func:`specledger.simulate.fastpath.advance` takes the steps up to the
next event at once where it can (the same outcome). The state is a :class:`~specledger.simulate.state.RunningBatch`,
priced by the replica's :class:`~specledger.simulate.pricing.StepPrices`.

Chunked prefill (vLLM v1): admission costs nothing by itself; a prefilling request holds its slot
and prompt KV and takes prefill tokens from what the step's token budget leaves after the decode
rows (in admission order); its first token leaves at the end of the step that completes its prompt.
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

import numpy as np

from specledger.simulate.chains import ChainTable, Draws
from specledger.simulate.gamma import GammaPlan
from specledger.simulate.pricing import StepPrices
from specledger.simulate.state import RunningBatch, ServerConfig, SimCounters


class Admission(NamedTuple):
    """A waiting request taken into the batch (:meth:`Replica.admit_next`)."""

    clock: float  # the replica's clock after its prefill (unchanged with chunked prefill)
    request: int
    context: int  # its context once in the batch
    prefill_left: int  # prompt tokens it still prefills in the steps (chunked prefill; else 0)
    blocks: int  # KV blocks it reserves
    finished: bool  # its one token left with its prefill: it does not join the batch


class Replica:
    """One server: a waiting queue and a running batch."""

    def __init__(self, index: int, cfg: ServerConfig, cost: Any, table: ChainTable, plan: GammaPlan,
                 drafter: str, counters: SimCounters, jitter: bool = True, draws: Draws | None = None) -> None:
        self.index, self.cfg, self.cost, self.table, self.plan = index, cfg, cost, table, plan
        self.drafter, self.counters = drafter, counters
        self.draws = draws or Draws()
        self.prices = StepPrices(cost, drafter, cfg.max_num_seqs, index, self.draws.seed, jitter)
        self.clock = 0.0
        self.waiting: deque[int] = deque()
        self.batch = RunningBatch.empty()
        self.policies: list[Any] | None = None if plan.vectorised else []
        self._parked: dict[int, Any] = {}  # policies of preempted requests
        self.kv_blocks_budget = cfg.kv_blocks_budget()
        self.token_budget = cfg.budget()
        self.steps_taken = 0  # steps this replica has run (the key of its forward noise)
        self.last_dt = 0.0  # duration of its latest step (the fast path's guess of the steps ahead)

    # ----------------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        return self.batch.size

    def outstanding(self) -> int:
        return len(self.waiting) + self.running

    def has_work(self) -> bool:
        return bool(self.waiting) or self.running > 0

    def add(self, rid: int, t: float) -> None:
        if not self.has_work():
            self.clock = max(self.clock, t)
        self.waiting.append(rid)
        self.counters.replica[rid] = self.index

    def forward_noise(self, n: int, ahead: int = 0) -> list[float] | None:
        """Forward multipliers of this replica's steps ``ahead`` .. ``ahead + n - 1`` from now; None without noise."""
        return self.prices.forward_noise(self.steps_taken + ahead, n)

    # ----------------------------------------------------------------------------------------
    def admit_next(self, t: float, running: int, reserved: int) -> Admission | None:
        """Take the first waiting request if a slot is free (``running`` in the batch) and the KV budget holds
        its committed context + 1 over the ``reserved`` blocks (the batch's contexts); None when it cannot.
        Without chunked prefill its prefill runs now (a preempted request recomputes all but its last token)."""
        if not self.waiting or running >= self.cfg.max_num_seqs:
            return None
        c, cfg = self.counters, self.cfg
        rid = self.waiting[0]
        out = int(c.out[rid])
        ctx = int(c.prompt[rid]) + out
        need = ctx + 1 if cfg.block_size == 1 else -(-(ctx + 1) // cfg.block_size)
        if self.kv_blocks_budget is not None and reserved + need > self.kv_blocks_budget and running > 0:
            return None
        self.waiting.popleft()
        if cfg.chunked_prefill:  # its prompt goes in with the steps (a preempted one recomputes all but a token)
            return Admission(t, rid, ctx, ctx if out == 0 else ctx - 1, need, False)
        if out == 0:  # first admission: prompt -> first token
            t += self.prices.prefill(ctx, rid, int(c.preemptions[rid]))
            c.t_first[rid] = c.t_last[rid] = t
            c.out[rid], c.chunks[rid] = 1, 1
            if c.target[rid] <= 1:
                return Admission(t, rid, ctx, 0, need, True)
            return Admission(t, rid, ctx + 1, 0, need, False)
        dt = self.prices.prefill(ctx - 1, rid, int(c.preemptions[rid]))  # recompute after preemption
        c.recompute_s[rid] += dt
        return Admission(t + dt, rid, ctx, 0, need, False)

    def admit(self, t: float) -> tuple[float, list[int]]:
        """Admit waiting requests; returns the clock after their prefills and the finished ids."""
        if not self.waiting:
            return t, []
        running = self.running
        reserved = int(self.cfg.blocks(self.batch.context).sum()) if running else 0
        joined: list[Admission] = []
        finished: list[int] = []
        while (a := self.admit_next(t, running + len(joined), reserved)) is not None:
            t = a.clock
            reserved += a.blocks
            if a.finished:
                finished.append(a.request)
            else:
                joined.append(a)
        if joined:
            ids = np.array([a.request for a in joined], dtype=np.int64)
            self.batch.extend(RunningBatch.joining(
                self.counters, ids, np.array([a.context for a in joined], dtype=np.int64),
                np.array([a.prefill_left for a in joined], dtype=np.int64)))
            if self.policies is not None:
                self.policies.extend(self._policy_for(int(r)) for r in ids)
        return t, finished

    def _policy_for(self, rid: int) -> Any:
        """The request's policy: kept across a preemption (as the engine keeps it), new on first admission."""
        return self._parked.pop(rid, None) or self.plan.new_policy()

    # ----------------------------------------------------------------------------------------
    def step(self) -> list[int]:
        """Advance one step from ``self.clock``; returns the ids of the requests finished in it."""
        t, finished = self.admit(self.clock)
        return self.step_from(t, finished)

    def step_from(self, t: float, finished: list[int]) -> list[int]:
        """The step after admission (at clock ``t``): choose, sample, budget, KV, price, commit."""
        c, cfg = self.counters, self.cfg
        b = self.running
        if b == 0:
            self.clock = t
            return finished
        run = self.batch
        dec = run.prefill_left == 0 if cfg.chunked_prefill else None
        all_dec = dec is None or bool(dec.all())
        di: Any = slice(None) if all_dec else np.flatnonzero(dec)  # the decoding requests (a view when all are)
        nd = b if all_dec else di.shape[0]
        remaining = run.target[di] - run.out[di]
        pols = self.policies if (self.policies is None or all_dec) else [self.policies[i] for i in di]
        g = np.minimum(self.plan.choose(nd, run.context[di], pols), remaining - 1) if nd else np.zeros(0, np.int64)
        g = np.maximum(g, 0)
        chain = run.chain[di]
        if self.table.deterministic and nd:
            ep, ek = self.table.expected(chain, g)
            prop = np.rint(ep).astype(np.int64)
            rid = run.request[di]
            acc_f = c.frac[rid] + ek
            acc = np.minimum(np.floor(acc_f).astype(np.int64), prop)
            c.frac[rid] = acc_f - acc
        else:
            prop, acc = self.table.sample(chain, g, self.draws, run.draw_key[di], run.rounds_done[di])
        # per-step token budget: gamma + 1 rows per decoding request, trim the largest first
        budget = self.token_budget
        if budget is not None and nd:
            prop = _trim(prop, budget - nd)
            acc = np.minimum(acc, prop)
        # KV reservation for candidates; preempt the newest admissions while over budget
        need = run.context.copy()
        need[di] += g if cfg.reserve_gamma else prop
        blocks = cfg.blocks(need)
        kvb = self.kv_blocks_budget
        if kvb is not None and b > 1 and int(blocks.sum()) > kvb:
            keep_n = max(1, int(np.searchsorted(np.cumsum(blocks), kvb, side="right")))
            if all_dec:
                di = np.arange(b)
            elif dec is not None:
                dec = dec[:keep_n]
            self._preempt(keep_n)
            b = keep_n
            sel = di < keep_n
            di, prop, acc, g, remaining = di[sel], prop[sel], acc[sel], g[sel], remaining[sel]
            nd = di.shape[0]
            run = self.batch
            blocks = blocks[:keep_n]
        c.peak_kv_tokens = max(c.peak_kv_tokens, int(blocks.sum()) * cfg.block_size)
        # prefill chunks (chunked prefill) from what the budget leaves
        pre_tokens = 0
        chunk = None
        if not all_dec:
            room = (budget if budget is not None else 1 << 60) - int(nd + prop.sum())
            left = run.prefill_left
            chunk = np.minimum(left, np.maximum(0, room - (np.cumsum(left) - left)))
            pre_tokens = int(chunk.sum())
        # the step's price
        ctx_sum = int(run.context.sum())
        t_draft_each = self.prices.draft_each(g, ctx_sum / b)
        rows = int(nd + prop.sum()) + pre_tokens
        psum = int(prop.sum())
        noise = self.forward_noise(1)
        t_emit = self.prices.price_step(t, float(t_draft_each.sum()), rows, psum, b, ctx_sum,
                                        noise[0] if noise is not None else None)
        self.steps_taken += 1
        # commit
        committed = np.minimum(acc + 1, remaining)
        rid_d = run.request[di]
        gaps = t_emit - run.last_emit[di]
        c.gaps.append(gaps.astype(np.float32))
        c.max_gap[rid_d] = np.maximum(c.max_gap[rid_d], gaps)
        c.chunks[rid_d] += 1
        run.last_emit[di] = t_emit
        run.out[di] += committed
        run.context[di] += committed
        run.rounds_done[di] += 1
        if self.policies is not None:
            t_round = t_draft_each + self.prices.last_forward_s + self.prices.other(b)
            pol = self.policies if all_dec else [self.policies[i] for i in di]
            for p, pp, kk, tr, td in zip(pol, prop.tolist(), acc.tolist(), t_round.tolist(), t_draft_each.tolist()):
                p.observe(pp, kk, tr, t_draft=td)
        if chunk is not None:  # prefills that complete now
            run.prefill_left = run.prefill_left - chunk
            done_pre = np.flatnonzero((run.prefill_left == 0) & ~dec)
            first = done_pre[run.out[done_pre] == 0]
            if first.size:
                rid_f = run.request[first]
                c.t_first[rid_f] = t_emit
                c.chunks[rid_f] = 1
                run.out[first] = 1
                run.context[first] += 1
                run.last_emit[first] = t_emit
        c.steps += 1
        c.batch_sum += b
        c.rows_sum += rows
        c.rounds += nd
        c.proposed_sum += psum
        c.accepted_sum += int(acc.sum())
        self.last_dt = t_emit - t
        self.clock = t_emit
        return self.retire(finished)

    def retire(self, finished: list[int]) -> list[int]:
        """Requests whose output is complete leave the batch (their figures go to the counters); returns
        ``finished`` extended by their ids."""
        run, c = self.batch, self.counters
        done = run.out >= run.target
        if done.any():
            ids = run.request[done]
            c.out[ids] = run.out[done]
            c.t_last[ids] = run.last_emit[done]
            finished.extend(ids.tolist())
            keep = ~done
            run.select(keep)
            if self.policies is not None:
                self.policies = [p for p, k in zip(self.policies, keep.tolist()) if k]
        return finished

    def _preempt(self, keep_n: int) -> None:
        """Preempt running requests keep_n.. (the newest admissions); they wait at the front, tokens kept."""
        c, run = self.counters, self.batch
        gone = run.request[keep_n:]
        c.out[gone] = run.out[keep_n:]
        c.t_last[gone] = run.last_emit[keep_n:]
        c.rounds_done[gone] = run.rounds_done[keep_n:]
        c.preemptions[gone] += 1
        self.waiting.extendleft(reversed(gone.tolist()))  # to the front, the oldest admission first
        run.select(slice(None, keep_n))
        if self.policies is not None:
            self._parked.update(zip(gone.tolist(), self.policies[keep_n:]))
            self.policies = self.policies[:keep_n]


def _trim(prop: np.ndarray, cap: int) -> np.ndarray:
    """Cut the largest proposals first until sum(prop) <= cap (water-filling; cap < 0 means none fit)."""
    total = int(prop.sum())
    if total <= cap:
        return prop
    if cap <= 0:
        return np.zeros_like(prop)
    lo, hi = 0, int(prop.max())
    while lo < hi:  # the largest level t with sum(min(prop, t)) <= cap
        mid = (lo + hi + 1) // 2
        if int(np.minimum(prop, mid).sum()) <= cap:
            lo = mid
        else:
            hi = mid - 1
    out = np.minimum(prop, lo)
    spare = cap - int(out.sum())
    if spare > 0:
        over = np.flatnonzero(prop > lo)[::-1][:spare]
        out[over] += 1
    return out
