"""Continuous batching with speculation: many requests in flight, one packed verify per step.

:class:`BatchScheduler` is the incremental engine: ``add`` a request (with its own drafter and gamma policy) at
any step boundary, ``step`` the batch, ``cancel`` a request. ``step`` returns each request's events in the order
:meth:`specledger.engine.decode.Engine.stream` yields them: ``Emitted`` chunks and ``RoundRecord`` s as they
happen, then one final ``RequestRecord``. :meth:`BatchEngine.run` serves a fixed list of requests by feeding a
scheduler; there is one implementation of a step.

Each step:
  1. admit added requests while a sequence slot is free and the KV budget holds their
     context (prefill each into its slot; its first token is committed then);
  2. every running request's drafter proposes its own gamma (per-request policies, ragged);
     a per-step token budget trims the largest proposals first;
  3. KV for the candidates is reserved (context + gamma per request); if the budget would be exceeded, the most
     recently admitted request is preempted (its slot freed, its tokens kept) and later recomputed by a prefill
     over prompt + output -- preemptions and their recompute time are recorded;
  4. one packed forward (:meth:`Transformer.forward_packed`) verifies everybody;
  5. each request verifies, commits, applies EOS / max_tokens / stop strings; rejected
     candidates' KV is released (the reservation shrinks back to the committed context).

Each request's round (gamma plan, proposal, verification of its rows, cut and commit, RoundRecord, release past
stop strings, final RequestRecord) is :class:`specledger.engine.request.Request`'s, the same code the solo engine
runs; the scheduler owns slots, admission, budgets, the packed forward and the clock. Stops are therefore applied
exactly as solo (text that could still begin a stop string is held back, nothing after a stop is emitted, the round
is marked truncated if tokens were dropped).

Exactness: packed rows are computed bit for bit like solo decoding (row-invariant kernels), so each request's
greedy output equals its solo plain greedy output whatever it is batched with.

Failures: an exception in one request's drafting, verification, stop handling, (re)prefill or
final record ends that request alone: its last event is :class:`RequestFailed`, its slot is
freed, the others in the step go on unchanged. An exception in the packed forward cannot be
blamed on one request: every request of that step gets RequestFailed; the scheduler goes on.

Timing: a round record's t_draft, t_verify and t_other have the meanings stated in
:mod:`specledger.records` (t_verify is the step's packed forward, which everybody waits
for; t_other holds the request's own bookkeeping plus an equal share of the step's overhead);
batch_size is the number of requests that drafted in the step. A request's times (token_times,
ttft) count from its arrival (``t_arrival`` given to ``add``, default the moment it is added).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from specledger.engine.batch_types import BatchEvent, BatchRequest, RequestFailed, StepRecord
from specledger.engine.device import model_device
from specledger.engine.drafters.base import Drafter
from specledger.engine.policy import GammaPolicy, as_policy
from specledger.engine.request import Emitted, Request, StopReleaser, check_request, check_tree_budget
from specledger.engine.tree import DraftTree
from specledger.errors import require
from specledger.records import RequestRecord, RoundRecord

if TYPE_CHECKING:
    from specledger.engine.model import Transformer


class _Live(Request):
    """A request in the scheduler: its :class:`Request` plus ticket, slot and preemption ledger."""

    def __init__(self, ticket: int, req: BatchRequest, drafter: Drafter, policy: GammaPolicy,
                 eos: frozenset[int], releaser: StopReleaser, t_arrival: float, device: Any = "cpu") -> None:
        super().__init__(req.prompt, drafter, policy, req.params, req.max_tokens, eos, releaser, t_arrival,
                         req.request_id, req.category, req.prompt_id, req.tree_budget, device)
        self.ticket, self.req = ticket, req
        self.slot = -1
        self.preemptions = 0
        self.recompute_s = 0.0


@dataclass(slots=True)
class _Plan:
    """One request's part of a step: its candidates, then its verified round."""

    live: _Live
    cand: list[int]
    q: Any
    g: int
    t_draft: float
    rows: tuple[int, int] = (0, 0)  # its rows in the packed forward
    t_own: float = 0.0  # its verification, commit and release after the forward
    chunk: Emitted | None = None
    round: RoundRecord | None = None
    failure: RequestFailed | None = None
    tree: DraftTree | None = None  # a tree round's proposal (``cand`` is its tokens)
    path: list[int] | None = None  # its accepted path


class BatchEngine:
    """A target model with ``max_batch`` sequence slots of ``capacity`` positions each.

    ``initial_capacity``: positions allocated per slot up front (default ``capacity``); the
    slot cache grows (doubling, copied, never past ``capacity``) when a request needs more.
    ``keep_steps``: keep only the newest that many StepRecords (a long-running server); default all.
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer: Any = None,
        eos_token_ids: Sequence[int] = (),
        max_batch: int = 8,
        capacity: int = 1024,
        kv_budget_tokens: int | None = None,
        step_token_budget: int | None = None,
        name: str = "",
        dtype: str = "",
        initial_capacity: int | None = None,
        keep_steps: int | None = None,
    ) -> None:
        require(max_batch >= 1, "max_batch must be >= 1")
        self.model, self.tokenizer = model, tokenizer
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.max_batch, self.capacity = max_batch, capacity
        self.kv_budget = kv_budget_tokens or max_batch * capacity
        self.step_budget = step_token_budget
        self.name, self.dtype = name, dtype
        self.device = model_device(model)
        self.cache = model.new_cache(min(initial_capacity or capacity, capacity), batch_size=max_batch)
        self.steps: list[StepRecord] | deque[StepRecord] = [] if keep_steps is None else deque(maxlen=keep_steps)
        self.preemptions = 0
        self.peak_reserved_tokens = 0

    def ensure_capacity(self, needed: int) -> None:
        """Grow the slot cache to hold ``needed`` positions per slot (valid entries are kept)."""
        current = self.cache.capacity
        if needed <= current:
            return
        require(needed <= self.capacity, f"{needed} positions exceed the slot capacity {self.capacity}")
        grown = self.model.new_cache(min(self.capacity, max(needed, 2 * current)), batch_size=self.max_batch)
        grown.kv[:, :, :, :, :current].copy_(self.cache.kv)
        self.cache = grown

    def decode_text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True) if self.tokenizer is not None else ""

    def scheduler(self, limit: int | None = None, stream_text: bool = False) -> BatchScheduler:
        """An incremental scheduler over this engine's slots (use one scheduler per engine at a time)."""
        return BatchScheduler(self, limit, stream_text)

    # ------------------------------------------------------------------------------------
    def run(
        self,
        requests: Sequence[BatchRequest],
        drafter_factory: Callable[[], Drafter],
        gamma: int | Callable[[], GammaPolicy] = 0,
        concurrency: int | None = None,
    ) -> list[RequestRecord]:
        """Serve ``requests``. ``concurrency`` = closed loop (keep that many in flight; arrival of the
        next request is when one finishes); None = open loop on each request's ``arrival``.
        ``drafter_factory`` builds one drafter per request (drafter state is per request).
        Returns the records in the order the requests finished."""
        perf = time.perf_counter
        for r in requests:
            require(len(r.prompt) + r.max_tokens + 16 <= self.capacity,
                    f"request {r.request_id}: prompt + max_tokens exceed the slot capacity {self.capacity}")
        t_start = perf()
        pending = deque(sorted(requests, key=lambda r: r.arrival) if concurrency is None else requests)
        sched = self.scheduler(concurrency)
        done: list[RequestRecord] = []

        def policy() -> GammaPolicy:
            return gamma() if callable(gamma) and not isinstance(gamma, GammaPolicy) else as_policy(gamma)

        while pending or len(sched):
            if concurrency is None:  # arrivals
                now = perf() - t_start
                while pending and pending[0].arrival <= now:
                    r = pending.popleft()
                    sched.add(r, drafter_factory(), policy(), t_arrival=t_start + r.arrival)
            else:
                while pending and len(sched) < sched.limit:
                    sched.add(pending.popleft(), drafter_factory(), policy())
            for _, ev in sched.step():
                if isinstance(ev, RequestRecord):
                    done.append(ev)
                elif isinstance(ev, RequestFailed):  # an offline run stops on the first failure
                    raise ev.exception if ev.exception is not None else RuntimeError(ev.error)
            if not sched.num_running and pending and concurrency is None:
                time.sleep(max(0.0, min(0.01, pending[0].arrival - (perf() - t_start))))
        return done


class BatchScheduler:
    """Continuous batching, one step at a time, on a :class:`BatchEngine`'s slots.

    Requests may be added and cancelled between any two steps; at most ``limit`` (default and
    at most the engine's ``max_batch``) run in a step, the rest wait in arrival order (a
    preempted request waits at the front). Not thread-safe: one thread calls ``add``, ``step``
    and ``cancel`` (a server feeds it from its own queue). ``stream_text``: compute each
    ``Emitted`` chunk's text (needs the engine's tokenizer); off, chunks carry token ids only
    and the text is decoded once, when the request finishes. ``len(scheduler)`` counts the
    requests added and not yet finished, failed or cancelled.
    """

    def __init__(self, engine: BatchEngine, limit: int | None = None, stream_text: bool = False) -> None:
        self.engine = engine
        self.limit = min(limit or engine.max_batch, engine.max_batch)
        self.stream_text = stream_text and engine.tokenizer is not None
        self.waiting: deque[_Live] = deque()
        self.running: list[_Live] = []
        self.free_slots = list(range(engine.max_batch - 1, -1, -1))
        self._tickets = 0

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def num_running(self) -> int:
        """Requests holding a slot (prefilled, decoding)."""
        return len(self.running)

    def add(
        self,
        request: BatchRequest,
        drafter: Drafter,
        policy: int | GammaPolicy = 0,
        t_arrival: float | None = None,
    ) -> int:
        """Queue ``request`` for admission at the next step; returns its ticket (events carry it).
        ``drafter`` and ``policy`` belong to this request (the policy is reset here)."""
        engine = self.engine
        check_request(len(request.prompt), request.max_tokens, engine.capacity, "the slot capacity",
                      f"request {request.request_id}: " if request.request_id else "")
        check_tree_budget(request.tree_budget, engine.capacity - len(request.prompt) - request.max_tokens,
                          f"request {request.request_id}: " if request.request_id else "")
        stops = [s for s in request.stop if s]
        text = engine.decode_text if (self.stream_text or stops) and engine.tokenizer is not None else None
        releaser = StopReleaser(text, stops)
        policy = as_policy(policy)
        policy.reset()
        engine.ensure_capacity(len(request.prompt) + request.max_tokens)
        self._tickets += 1
        live = _Live(self._tickets, request, drafter, policy, frozenset() if request.ignore_eos else engine.eos,
                     releaser, time.perf_counter() if t_arrival is None else t_arrival, engine.device)
        self.waiting.append(live)
        return live.ticket

    def cancel(self, ticket: int) -> bool:
        """Drop the request (waiting or running; its slot is freed, no record is made); True if found."""
        for live in self.waiting:
            if live.ticket == ticket:
                self.waiting.remove(live)
                return True
        for live in self.running:
            if live.ticket == ticket:
                self.running.remove(live)
                self.free_slots.append(live.slot)
                return True
        return False

    # ------------------------------------------------------------------------------------
    def _retire(self, live: _Live, events: list[BatchEvent], failure: RequestFailed | None = None) -> None:
        """``live`` (holding a slot) leaves: the slot is freed and its last event queued -- its
        RequestRecord, or ``failure`` (also when making the record raises)."""
        if live in self.running:
            self.running.remove(live)
        self.free_slots.append(live.slot)
        if failure is None:
            engine = self.engine
            try:
                last: RequestRecord | RequestFailed = live.finish(
                    time.perf_counter(), engine.decode_text, engine.name, engine.dtype,
                    extra={"preemptions": live.preemptions, "recompute_s": live.recompute_s})
            except Exception as exc:
                last = RequestFailed.of(exc)
        else:
            last = failure
        events.append((live.ticket, last))

    def _prefill(self, live: _Live, events: list[BatchEvent]) -> None:
        """(Re)build the slot's KV for the committed context; commit and emit the first token if new."""
        perf, model = time.perf_counter, self.engine.model
        t0 = perf()
        view = self.engine.cache.slot(live.slot)
        with torch.inference_mode():
            if not live.context:  # first admission: prompt -> first token
                ids = torch.tensor([live.prompt], device=self.engine.device)
                if live.drafter.wants_hidden:  # a learned head drafter reads the prompt's hidden states
                    logits, hidden = model(ids, 0, view, last_only=True, return_hidden=True)
                    live.start(logits[0, -1], hidden[0])
                else:
                    live.start(model(ids, 0, view, last_only=True)[0, -1])
                live.t_prefill = perf() - t0
                chunk = live.release()
                if chunk is not None:
                    events.append((live.ticket, live.stamp(chunk, perf())))
            else:  # recompute after preemption: KV for everything but the last committed token
                ids = torch.tensor([live.context[:-1]], device=self.engine.device)
                if live.drafter.wants_hidden:
                    _, hidden = model(ids, 0, view, last_only=True, return_hidden=True)
                    live.drafter.observe_hidden(0, hidden[0])
                else:
                    model(ids, 0, view, last_only=True)
                if self.engine.device.type == "cuda":  # recompute_s is device time too
                    torch.cuda.synchronize(self.engine.device)
                live.drafter.begin(live.context[:-1], live.params)
                live.recompute_s += perf() - t0

    def _admit(self, events: list[BatchEvent]) -> None:
        """Prefill waiting requests into free slots (KV budget: committed context + room for one step)."""
        engine, waiting, running, free_slots = self.engine, self.waiting, self.running, self.free_slots
        reserved = sum(len(x.context) for x in running)
        while waiting and free_slots and len(running) < self.limit:
            cand = waiting[0]
            need = len(cand.context or cand.prompt) + 1
            if reserved + need > engine.kv_budget and running:
                break
            waiting.popleft()
            cand.slot = free_slots.pop()
            try:
                self._prefill(cand, events)
            except Exception as exc:
                self._retire(cand, events, RequestFailed.of(exc, "prefill: "))
                continue
            reserved += len(cand.context)
            if cand.stop_reason:
                self._retire(cand, events)
            else:
                running.append(cand)

    # ------------------------------------------------------------------------------------
    def step(self) -> list[BatchEvent]:
        """Admit, then (if anything runs) draft, verify in one packed forward, commit and emit.
        Returns the step's events; a request's last event is its ``RequestRecord`` or ``RequestFailed``."""
        perf = time.perf_counter
        events: list[BatchEvent] = []
        self._admit(events)
        if not self.running:
            return events
        t_step = perf()
        b = len(self.running)
        plans = self._draft(b, events)  # per request, ragged gamma
        self._trim_to_budget(plans)
        reserved = self._reserve(plans)
        if not plans:
            return events
        tokens, slots, positions = self._pack(plans)  # one packed verify for everybody
        branched = any(p.tree is not None and not p.tree.is_chain for p in plans)
        wants_hidden = any(p.live.drafter.wants_hidden for p in plans)
        tf = perf()
        try:
            logits, tree_kv, hidden = self._forward(tokens, slots, positions, branched, wants_hidden)
        except Exception as exc:  # not one request's fault: the whole step's requests fail
            for p in plans:
                self._retire(p.live, events, RequestFailed.of(exc, f"packed forward of {len(plans)} requests: "))
            return events
        t_prev = perf()
        t_forward = t_prev - tf
        t_prev = self._verify(plans, logits, tree_kv, hidden, branched, t_forward, b, t_prev)
        # time outside the forward and the requests' own drafting and bookkeeping: shared equally by the rounds
        ok = [p for p in plans if p.failure is None]
        share = max(0.0, t_prev - t_step - t_forward - sum(p.t_draft + p.t_own for p in ok)) / max(1, len(ok))
        self._emit(plans, events, share, t_prev)
        self.engine.steps.append(StepRecord(
            b, len(tokens), len(tokens) - len(plans), t_forward, sum(p.t_draft for p in ok),
            sum(p.round.t_other for p in ok if p.round is not None), reserved,
            sum(len(p.live.context) for p in plans)))
        return events

    def _draft(self, b: int, events: list[BatchEvent]) -> list[_Plan]:
        """Phase 1: every running request proposes its candidates (a chain or a tree) for a batch of ``b``."""
        perf, engine = time.perf_counter, self.engine
        plans: list[_Plan] = []
        for live in list(self.running):
            t0 = perf()
            try:
                tree = None
                if live.tree_budget:
                    n, g = live.plan_tree(live.tree_budget, b, engine.capacity)
                    tree = live.propose_tree(n, g)
                    cand, q = tree.tokens, None
                else:
                    g = live.plan(b, engine.capacity)
                    cand, q = live.propose(g)
            except Exception as exc:
                self._retire(live, events, RequestFailed.of(exc, "drafting: "))
                continue
            plans.append(_Plan(live, cand, q, g, perf() - t0, tree=tree))
        return plans

    def _trim_to_budget(self, plans: list[_Plan]) -> None:
        """Phase 2: the per-step token budget; trim the longest proposals first."""
        if self.engine.step_budget:
            while sum(len(p.cand) + 1 for p in plans) > self.engine.step_budget:
                p = max(plans, key=lambda x: len(x.cand))
                if not p.cand:
                    break
                if p.tree is not None:  # the last node in DFS preorder is a leaf
                    p.tree = p.tree.trimmed(len(p.cand) - 1)
                    p.cand = p.tree.tokens
                    continue
                p.cand = p.cand[:-1]
                p.q = None if p.q is None else p.q[: len(p.cand)]

    def _reserve(self, plans: list[_Plan]) -> int:
        """Phase 3: KV reservation for the candidates; preempt the newest admissions if over budget."""
        engine = self.engine
        reserved = sum(len(p.live.context) + len(p.cand) for p in plans)
        while reserved > engine.kv_budget and len(plans) > 1:
            p = plans.pop()
            lv = p.live
            self.running.remove(lv)
            reserved -= len(lv.context) + len(p.cand)
            self.free_slots.append(lv.slot)
            lv.preemptions += 1
            engine.preemptions += 1
            self.waiting.appendleft(lv)
        engine.peak_reserved_tokens = max(engine.peak_reserved_tokens, reserved)
        return reserved

    @staticmethod
    def _pack(plans: list[_Plan]) -> tuple[list[int], list[int], list[int]]:
        """Phase 4: the packed rows (tokens, slots, positions); each plan's ``rows`` set."""
        tokens: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        for p in plans:
            context, n = p.live.context, len(p.cand) + 1
            p.rows = (len(tokens), len(tokens) + n)
            tokens += [context[-1]] + p.cand
            slots += [p.live.slot] * n
            if p.tree is not None:
                positions += p.tree.positions(len(context) - 1)
            else:
                positions += range(len(context) - 1, len(context) - 1 + n)
        return tokens, slots, positions

    def _forward(self, tokens: list[int], slots: list[int], positions: list[int], branched: bool,
                 wants_hidden: bool) -> tuple[Any, Any, Any]:
        """Phase 5: the one packed forward: (logits, the tree rows' k/v or None, hidden states or None)."""
        engine = self.engine
        hidden = tree_kv = None
        with torch.inference_mode():
            if branched and wants_hidden:  # trees, and a head drafter reads the accepted paths' features
                logits, tree_kv, hidden = engine.model.forward_tree(tokens, slots, positions, engine.cache,
                                                                    return_hidden=True)
            elif branched:  # rows of trees: per-row k/v writes, the accepted paths compacted below
                logits, tree_kv = engine.model.forward_tree(tokens, slots, positions, engine.cache)
            elif wants_hidden:  # a head drafter reads the target's features
                logits, hidden = engine.model.forward_packed(tokens, slots, positions, engine.cache,
                                                             return_hidden=True)
            else:  # chains only (tree rounds that proposed a chain included): the chain pass
                logits = engine.model.forward_packed(tokens, slots, positions, engine.cache)
            if engine.device.type == "cuda":  # where the commit would wait anyway: t_forward is device time
                torch.cuda.synchronize(engine.device)
        return logits, tree_kv, hidden

    def _verify(self, plans: list[_Plan], logits: Any, tree_kv: Any, hidden: Any, branched: bool, t_forward: float,
                b: int, t_prev: float) -> float:
        """Phase 6: each request verifies its rows, commits, applies stops; returns the time it ended."""
        perf, engine = time.perf_counter, self.engine
        for p in plans:
            try:
                rows = logits[p.rows[0] : p.rows[1]]
                wants = hidden is not None and p.live.drafter.wants_hidden
                own_hidden = hidden[p.rows[0] : p.rows[1]] if wants else None
                if p.tree is not None:
                    p.round, p.path = p.live.accept_tree(rows, p.tree, p.g, p.t_draft, t_forward, b,
                                                         budget=p.live.tree_budget, hidden=own_hidden)
                    if branched and p.path:
                        with torch.inference_mode():
                            engine.model.commit_tree_kv(engine.cache, p.live.slot, p.round.context_len,
                                                        tree_kv, [p.rows[0] + i + 1 for i in p.path])
                else:
                    p.round = p.live.accept(rows, p.cand, p.q, p.g, p.t_draft, t_forward, b, hidden=own_hidden)
                p.chunk = p.live.release()
            except Exception as exc:
                p.failure = RequestFailed.of(exc, "verification: ")
            t = perf()
            p.t_own, t_prev = t - t_prev, t
        return t_prev

    def _emit(self, plans: list[_Plan], events: list[BatchEvent], share: float, t_prev: float) -> None:
        """Phase 7: close each round (with its ``share``), emit its chunk and round, retire finished and failed."""
        finished = []
        for p in plans:
            live = p.live
            if p.failure is None:
                try:
                    live.close_round(p.t_own + share)
                except Exception as exc:
                    p.failure = RequestFailed.of(exc, "gamma policy: ")
            if p.failure is not None:
                self._retire(live, events, p.failure)
                continue
            if p.chunk is not None:
                events.append((live.ticket, live.stamp(p.chunk, t_prev)))
            events.append((live.ticket, p.round))
            if live.stop_reason:
                finished.append(live)
        for live in finished:
            self._retire(live, events)
