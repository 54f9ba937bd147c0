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
     noise, to its ``verify_base_s`` (:func:`specledger.simulate.engine.break_even_verify_premium`).

:meth:`Replica.advance` takes the steps up to the next event at once where it can
(:mod:`specledger.simulate.fastpath`, the same outcome); :meth:`Replica.step` takes one.

Chunked prefill (vLLM v1): admission costs nothing by itself; a prefilling request holds its slot
and prompt KV and takes prefill tokens from what the step's token budget leaves after the decode
rows (in admission order); its first token leaves at the end of the step that completes its prompt.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from specledger.simulate.chains import (
    STREAM_PREFILL_JITTER,
    STREAM_STEP_JITTER,
    ChainTable,
    Draws,
    keyed_stream,
)
from specledger.simulate.fastpath import segment
from specledger.simulate.gamma import GammaPlan


@dataclass(frozen=True)
class ServerConfig:
    """The scheduler's knobs (vLLM names where they exist)."""

    max_num_seqs: int = 8
    max_num_batched_tokens: int | None = None  # rows per step: gamma + 1 per decoding request (+ prefill)
    kv_budget_tokens: int | None = None  # None: unlimited
    block_size: int = 1  # KV is reserved in blocks of this many tokens (vLLM: 16)
    chunked_prefill: bool = False
    reserve_gamma: bool = False  # reserve KV for the gamma asked (vLLM's lookahead slots), not what was proposed

    def budget(self) -> int | None:
        if self.max_num_batched_tokens is None and self.chunked_prefill:
            return 2048
        return self.max_num_batched_tokens


class Ledger:
    """Per-request outcome arrays shared by the replicas of one simulation (index = request id)."""

    def __init__(self, table: ChainTable, order: np.ndarray, per: str = "request") -> None:
        n = order.shape[0]
        self.n = n
        self.chain = order.astype(np.int64)
        # what a request's acceptance draws are keyed on (chains.Draws): itself, or the measured prompt it replays
        self.key = self.chain.copy() if per == "prompt" else np.arange(n, dtype=np.int64)
        self.nround = np.zeros(n, dtype=np.int64)  # rounds decoded so far (kept across a preemption)
        self.prompt = table.prompt_tokens[self.chain]
        self.target = table.output_tokens[self.chain]
        self.arrival = np.full(n, np.nan)
        self.t_first = np.full(n, np.nan)
        self.t_last = np.full(n, np.nan)
        self.out = np.zeros(n, dtype=np.int64)
        self.chunks = np.zeros(n, dtype=np.int64)
        self.max_gap = np.zeros(n)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.recompute_s = np.zeros(n)
        self.frac = np.zeros(n)
        self.replica = np.full(n, -1, dtype=np.int64)
        self.gaps: list[np.ndarray] = []
        self.steps = 0
        self.batch_sum = 0
        self.rows_sum = 0
        self.proposed_sum = 0
        self.accepted_sum = 0
        self.rounds = 0
        self.peak_kv_tokens = 0
        # speculative steps (some request verifies candidates): their forward seconds, and what the same
        # steps' forwards cost without the candidate rows (the break-even verify premium's V and V_1);
        # each replica sums its own (its steps come in one order on every path), these are their totals
        self.verify_s = 0.0
        self.verify_base_s = 0.0
        self.fast_steps = 0  # steps priced by the event-skipping segments (fastpath), of ``steps``
        self.fast_segments = 0
        self.round_cache: Any = None  # fastpath.RoundCache: requests' acceptance draws, drawn ahead in bulk


_FIELDS = ("rid", "ctx", "out", "target", "chain", "last", "pleft", "key", "nround")


class Replica:
    """One server: a waiting queue and a running batch (arrays in admission order)."""

    def __init__(self, index: int, cfg: ServerConfig, cost: Any, table: ChainTable, plan: GammaPlan,
                 drafter: str, ledger: Ledger, jitter: bool = True, draws: Draws | None = None) -> None:
        self.index, self.cfg, self.cost, self.table, self.plan = index, cfg, cost, table, plan
        self.drafter, self.ledger = drafter, ledger
        self.draws = draws or Draws()
        self.clock = 0.0
        self.waiting: deque[int] = deque()
        self.run = {f: np.zeros(0, dtype=np.float64 if f == "last" else np.int64) for f in _FIELDS}
        self.policies: list[Any] | None = None if plan.vectorised else []
        self._parked: dict[int, Any] = {}  # policies of preempted requests
        self._prefill: dict[int, float] = {}
        self._kv_blocks = (None if cfg.kv_budget_tokens is None
                           else max(1, cfg.kv_budget_tokens // cfg.block_size))
        self._budget = cfg.budget()
        # a fitted profile whose prefill depends on the server's slot count (a serving fit, CostModel.slot_dependent_prefill)
        self._slots_kw = {"slots": cfg.max_num_seqs} if getattr(cost, "slot_dependent_prefill", False) else {}
        # a measured profile's step-time noise (u -> multipliers), if it carries one (CostModel.has_noise)
        noise = getattr(cost, "jitter", None) if getattr(cost, "has_noise", True) else None
        self._noise = noise if noise is not None and jitter else None
        self.nstep = 0  # steps this replica has run (the key of its forward jitter)
        self.last_dt = 0.0  # duration of its latest step (the fast path's horizon guess)
        self.verify_s = 0.0  # its speculative steps' forward seconds (Ledger.verify_s: the replicas' total)
        self.verify_base_s = 0.0  # and theirs without the candidate rows
        # the fast path's caches (fastpath._run_scalar): each request's drawn rounds (first round, codes),
        # the plan's gamma per decoding batch size, other_s per batch size, step_s as a plain function
        self.fast_rounds: dict[int, tuple[int, list[int]]] = {}
        self.fast_gammas: dict[int, int] = {}
        self.fast_other_s: dict[int, float] = {}
        self.fast_step_s: Any = None

    # ----------------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        return int(self.run["rid"].shape[0])

    def outstanding(self) -> int:
        return len(self.waiting) + self.running

    def has_work(self) -> bool:
        return bool(self.waiting) or self.running > 0

    def add(self, rid: int, t: float) -> None:
        if not self.has_work():
            self.clock = max(self.clock, t)
        self.waiting.append(rid)
        self.ledger.replica[rid] = self.index

    def _blocks(self, tokens: np.ndarray | int) -> Any:
        b = self.cfg.block_size
        return tokens if b == 1 else -(-tokens // b)

    def _prefill_s(self, tokens: int, rid: int) -> float:
        """Prefill time, times the profile's prefill noise keyed on (request, admission number)."""
        s = self._prefill.get(tokens)
        if s is None:
            s = self._prefill[tokens] = float(self.cost.prefill_s(int(tokens), **self._slots_kw))
        if self._noise is None:
            return s
        u = keyed_stream(self.draws.seed, STREAM_PREFILL_JITTER, np.array([rid]),
                         np.array([self.ledger.preemptions[rid]]))
        return s * self._noise(float(u[0]))[1]

    def forward_noise(self, n: int, ahead: int = 0) -> list[float] | None:
        """Forward multipliers of this replica's steps ``ahead`` .. ``ahead + n - 1`` from now (keyed on
        (replica, step number)); None without noise."""
        if self._noise is None:
            return None
        first = self.nstep + ahead
        u = keyed_stream(self.draws.seed, STREAM_STEP_JITTER, np.full(n, self.index), np.arange(first, first + n))
        return [self._noise(x)[0] for x in u.tolist()]

    # ----------------------------------------------------------------------------------------
    def _admit(self, t: float) -> tuple[float, list[int]]:
        """Admit waiting requests; returns the clock after their prefills and the finished ids."""
        if not self.waiting:
            return t, []
        L, cfg, run = self.ledger, self.cfg, self.run
        n_run = self.running
        reserved = int(self._blocks(run["ctx"]).sum()) if n_run else 0
        new: list[tuple[int, int, int]] = []  # (rid, ctx, pleft)
        finished: list[int] = []
        while self.waiting and n_run + len(new) < cfg.max_num_seqs:
            rid = self.waiting[0]
            ctx = int(L.prompt[rid] + L.out[rid])
            need = int(self._blocks(ctx + 1))
            if self._kv_blocks is not None and reserved + need > self._kv_blocks and (n_run + len(new)) > 0:
                break
            self.waiting.popleft()
            reserved += need
            if cfg.chunked_prefill:
                new.append((rid, ctx, ctx if L.out[rid] == 0 else ctx - 1))
                continue
            if L.out[rid] == 0:  # first admission: prompt -> first token
                t += self._prefill_s(ctx, rid)
                L.t_first[rid] = L.t_last[rid] = t
                L.out[rid], L.chunks[rid] = 1, 1
                if L.target[rid] <= 1:
                    finished.append(rid)
                    continue
                new.append((rid, ctx + 1, 0))
            else:  # recompute after preemption: KV for all but the last committed token
                dt = self._prefill_s(ctx - 1, rid)
                t += dt
                L.recompute_s[rid] += dt
                new.append((rid, ctx, 0))
        if new:
            ids = np.array([x[0] for x in new], dtype=np.int64)
            add = {"rid": ids, "ctx": np.array([x[1] for x in new], dtype=np.int64), "out": L.out[ids],
                   "target": L.target[ids], "chain": L.chain[ids], "last": L.t_last[ids],
                   "pleft": np.array([x[2] for x in new], dtype=np.int64), "key": L.key[ids], "nround": L.nround[ids]}
            for f in _FIELDS:
                run[f] = np.concatenate([run[f], add[f]])
            if self.policies is not None:
                self.policies.extend(self._policy_for(int(r)) for r in ids)
        return t, finished

    def _policy_for(self, rid: int) -> Any:
        """The request's policy: kept across a preemption (as the engine keeps it), new on first admission."""
        return self._parked.pop(rid, None) or self.plan.new_policy()

    # ----------------------------------------------------------------------------------------
    def step(self) -> list[int]:
        """Advance one step from ``self.clock``; returns the ids of the requests finished in it."""
        t, finished = self._admit(self.clock)
        return self._step_at(t, finished)

    def advance(self, bound: float = math.inf, feed: Any = None) -> list[int]:
        """Advance one step, or -- where :func:`specledger.simulate.fastpath.segment` applies -- every
        step up to the next event at once: the steps that start before ``bound`` (the next arrival the
        router must place), up to and including the first in which a request finishes. The outcome is
        the one :meth:`step` called that many times gives. A lone replica is given the ``feed``
        (:class:`specledger.simulate.engine.Feed`) and may take arrivals and report finishes itself.
        Returns the finished ids not yet reported to the feed."""
        t, finished = self._admit(self.clock)
        if self.running:
            done = segment(self, t, finished, bound, feed)
            if done is not None:
                return done
        return self._step_at(t, finished)

    def _step_at(self, t: float, finished: list[int]) -> list[int]:
        """The step after admission (at clock ``t``): choose, sample, budget, KV, price, commit."""
        L, cfg, cost = self.ledger, self.cfg, self.cost
        b = self.running
        if b == 0:
            self.clock = t
            return finished
        run = self.run
        dec = run["pleft"] == 0 if cfg.chunked_prefill else None
        all_dec = dec is None or bool(dec.all())
        di: Any = slice(None) if all_dec else np.flatnonzero(dec)  # the decoding requests (a view when all are)
        nd = b if all_dec else di.shape[0]
        remaining = run["target"][di] - run["out"][di]
        pols = self.policies if (self.policies is None or all_dec) else [self.policies[i] for i in di]
        g = np.minimum(self.plan.choose(nd, run["ctx"][di], pols), remaining - 1) if nd else np.zeros(0, np.int64)
        g = np.maximum(g, 0)
        chain = run["chain"][di]
        if self.table.deterministic and nd:
            ep, ek = self.table.expected(chain, g)
            prop = np.rint(ep).astype(np.int64)
            rid = run["rid"][di]
            acc_f = L.frac[rid] + ek
            acc = np.minimum(np.floor(acc_f).astype(np.int64), prop)
            L.frac[rid] = acc_f - acc
        else:
            prop, acc = self.table.sample(chain, g, self.draws, run["key"][di], run["nround"][di])
        # per-step token budget: gamma + 1 rows per decoding request, trim the largest first
        budget = self._budget
        if budget is not None and nd:
            prop = _trim(prop, budget - nd)
            acc = np.minimum(acc, prop)
        # KV reservation for candidates; preempt the newest admissions while over budget
        need = run["ctx"].copy()
        need[di] += g if cfg.reserve_gamma else prop
        blocks = self._blocks(need)
        if self._kv_blocks is not None and b > 1 and int(blocks.sum()) > self._kv_blocks:
            keep_n = max(1, int(np.searchsorted(np.cumsum(blocks), self._kv_blocks, side="right")))
            if all_dec:
                di = np.arange(b)
            elif dec is not None:
                dec = dec[:keep_n]
            self._preempt(keep_n)
            b = keep_n
            sel = di < keep_n
            di, prop, acc, g, remaining = di[sel], prop[sel], acc[sel], g[sel], remaining[sel]
            nd = di.shape[0]
            run = self.run
            blocks = blocks[:keep_n]
        L.peak_kv_tokens = max(L.peak_kv_tokens, int(blocks.sum()) * cfg.block_size)
        # prefill chunks (chunked prefill) from what the budget leaves
        pre_tokens = 0
        chunk = None
        if not all_dec:
            room = (budget if budget is not None else 1 << 60) - int(nd + prop.sum())
            pleft = run["pleft"]
            chunk = np.minimum(pleft, np.maximum(0, room - (np.cumsum(pleft) - pleft)))
            pre_tokens = int(chunk.sum())
        # cost of the step
        ctx_mean = float(run["ctx"].sum()) / b
        t_draft_each = np.zeros(nd)
        if nd and self.drafter != "none" and g.max() > 0:
            counts = np.bincount(g)
            for gv in np.flatnonzero(counts[1:]) + 1:
                t_draft_each[g == gv] = float(cost.draft_s(self.drafter, int(gv), ctx_mean))
        rows = int(nd + prop.sum()) + pre_tokens
        t_fwd = float(cost.step_s(max(rows, b), b, ctx_mean))
        noise = self.forward_noise(1)
        if noise is not None:
            t_fwd *= noise[0]
        psum = int(prop.sum())
        if psum:  # a speculative step: its forward, and the same step's without the candidate rows
            t_base = float(cost.step_s(max(rows - psum, b), b, ctx_mean))
            self.verify_s += t_fwd
            self.verify_base_s += t_base * noise[0] if noise is not None else t_base
        self.nstep += 1
        t_other = float(cost.other_s(b))
        t_emit = t + float(t_draft_each.sum()) + t_fwd + t_other
        # commit
        committed = np.minimum(acc + 1, remaining)
        rid_d = run["rid"][di]
        gaps = t_emit - run["last"][di]
        L.gaps.append(gaps.astype(np.float32))
        L.max_gap[rid_d] = np.maximum(L.max_gap[rid_d], gaps)
        L.chunks[rid_d] += 1
        run["last"][di] = t_emit
        run["out"][di] += committed
        run["ctx"][di] += committed
        run["nround"][di] += 1
        if self.policies is not None:
            t_round = t_draft_each + t_fwd + t_other
            pol = self.policies if all_dec else [self.policies[i] for i in di]
            for p, pp, kk, tr, td in zip(pol, prop.tolist(), acc.tolist(), t_round.tolist(), t_draft_each.tolist()):
                p.observe(pp, kk, tr, t_draft=td)
        if chunk is not None:  # prefills that complete now
            run["pleft"] = run["pleft"] - chunk
            done_pre = np.flatnonzero((run["pleft"] == 0) & ~dec)
            first = done_pre[run["out"][done_pre] == 0]
            if first.size:
                rid_f = run["rid"][first]
                L.t_first[rid_f] = t_emit
                L.chunks[rid_f] = 1
                run["out"][first] = 1
                run["ctx"][first] += 1
                run["last"][first] = t_emit
        L.steps += 1
        L.batch_sum += b
        L.rows_sum += rows
        L.rounds += nd
        L.proposed_sum += psum
        L.accepted_sum += int(acc.sum())
        self.last_dt = t_emit - t
        self.clock = t_emit
        return self.retire(finished)

    def retire(self, finished: list[int]) -> list[int]:
        """Requests whose output is complete leave the batch (their figures go to the ledger); returns
        ``finished`` extended by their ids."""
        run, L = self.run, self.ledger
        done = run["out"] >= run["target"]
        if done.any():
            ids = run["rid"][done]
            L.out[ids] = run["out"][done]
            L.t_last[ids] = run["last"][done]
            finished.extend(ids.tolist())
            keep = ~done
            for f in _FIELDS:
                run[f] = run[f][keep]
            if self.policies is not None:
                self.policies = [p for p, k in zip(self.policies, keep.tolist()) if k]
        return finished

    def _preempt(self, keep_n: int) -> None:
        """Preempt running requests keep_n.. (the newest admissions); they wait at the front, tokens kept."""
        L, run = self.ledger, self.run
        gone = run["rid"][keep_n:]
        L.out[gone] = run["out"][keep_n:]
        L.t_last[gone] = run["last"][keep_n:]
        L.nround[gone] = run["nround"][keep_n:]
        L.preemptions[gone] += 1
        self.waiting.extendleft(reversed(gone.tolist()))  # to the front, the oldest admission first
        for f in _FIELDS:
            run[f] = run[f][:keep_n]
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
