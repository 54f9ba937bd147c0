"""Continuous batching with speculation: many requests in flight, one packed verify per step.

:class:`BatchScheduler` is the incremental engine: ``add`` a request (with its own drafter and
gamma policy) at any step boundary, ``step`` the batch, ``cancel`` a request. ``step`` returns
each request's events in the order :meth:`specledger.engine.decode.Engine.stream` yields them:
``Emitted`` chunks and ``RoundRecord`` s as they happen, then one final ``RequestRecord``.
:meth:`BatchEngine.run` serves a fixed list of requests by feeding a scheduler; there is one
implementation of a step.

Each step:
  1. admit added requests while a sequence slot is free and the KV budget holds their
     context (prefill each into its slot; its first token is committed then);
  2. every running request's drafter proposes its own gamma (per-request policies, ragged);
     a per-step token budget trims the largest proposals first;
  3. KV for the candidates is reserved (context + gamma per request); if the budget would be
     exceeded, the most recently admitted request is preempted (its slot freed, its tokens
     kept) and later recomputed by a prefill over prompt + output -- preemptions and their
     recompute time are recorded;
  4. one packed forward (:meth:`Transformer.forward_packed`) verifies everybody;
  5. each request verifies, commits, applies EOS / max_tokens / stop strings; rejected
     candidates' KV is released (the reservation shrinks back to the committed context).

Stops: EOS (unless the request ignores it) and max_tokens cut the committed span; stop strings
are applied with :class:`~specledger.engine.decode.StopReleaser` exactly as the solo engine
applies them (text that could still begin a stop string is held back, nothing after a stop is
emitted, the round is marked truncated if tokens were dropped).

Exactness: packed rows are computed bit for bit like solo decoding (row-invariant kernels),
so each request's greedy output equals its solo plain greedy output whatever it is batched with.

Timing per round record: t_draft is the request's own drafting time, t_verify the step's
packed forward (everybody waits for it), t_other the step's remaining overhead; batch_size is
the number of requests in the step. A request's times (token_times, ttft) count from its
arrival (``t_arrival`` given to ``add``, default the moment it is added).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from specledger.engine.decode import Emitted, StopReleaser, _cut_at_stop
from specledger.engine.drafters.base import Drafter
from specledger.engine.policy import GammaPolicy, as_policy
from specledger.engine.sampling import SamplingParams, probs_from_logits
from specledger.engine.trace import RequestRecord, RoundRecord
from specledger.engine.verify import verify_greedy, verify_sampling
from specledger.errors import require


@dataclass
class BatchRequest:
    prompt: list[int]
    max_tokens: int = 128
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""
    arrival: float = 0.0  # seconds after the run starts (open loop); ignored in closed loop
    category: str = ""
    prompt_id: str = ""
    stop: Sequence[str] = ()  # stop strings (need the engine's tokenizer)
    ignore_eos: bool = False


@dataclass
class _Live:
    ticket: int
    req: BatchRequest
    drafter: Drafter
    policy: GammaPolicy
    rng: torch.Generator
    t_arrival: float  # absolute perf_counter time
    eos: frozenset[int]
    releaser: StopReleaser
    slot: int = -1
    context: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    t_prefill: float = 0.0
    preemptions: int = 0
    recompute_s: float = 0.0
    stop_reason: str = ""
    gamma: int = 0


@dataclass
class StepRecord:
    batch_size: int
    rows: int  # tokens in the packed forward = sum over requests of (candidates + 1)
    candidates: int
    t_forward: float
    t_draft: float
    t_other: float
    kv_reserved_tokens: int
    context_tokens: int


#: (ticket from :meth:`BatchScheduler.add`, one of that request's events)
BatchEvent = tuple[int, Union[Emitted, RoundRecord, RequestRecord]]


class BatchEngine:
    """A target model with ``max_batch`` sequence slots of ``capacity`` positions each.

    ``initial_capacity``: positions allocated per slot up front (default ``capacity``); the
    slot cache grows (doubling, copied, never past ``capacity``) when a request needs more.
    ``keep_steps``: keep only the newest that many StepRecords (a long-running server); default all.
    """

    def __init__(
        self,
        model: Any,
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
            done.extend(ev for _, ev in sched.step() if isinstance(ev, RequestRecord))
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
    requests added and not yet finished or cancelled.
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
        n_prompt = len(request.prompt)
        require(n_prompt > 0, "the prompt is empty; give at least one token")
        require(request.max_tokens >= 1, f"max_tokens must be >= 1, got {request.max_tokens}")
        require(n_prompt + request.max_tokens <= engine.capacity,
                f"request {request.request_id}: prompt ({n_prompt}) + max_tokens ({request.max_tokens}) "
                f"exceed the slot capacity {engine.capacity}")
        stops = [s for s in request.stop if s]
        text = engine.decode_text if (self.stream_text or stops) and engine.tokenizer is not None else None
        releaser = StopReleaser(text, stops)
        policy = as_policy(policy)
        policy.reset()
        seed = request.params.seed if request.params.seed is not None else 0
        engine.ensure_capacity(n_prompt + request.max_tokens)
        self._tickets += 1
        live = _Live(self._tickets, request, drafter, policy, torch.Generator().manual_seed(seed),
                     time.perf_counter() if t_arrival is None else t_arrival,
                     frozenset() if request.ignore_eos else engine.eos, releaser)
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
    @staticmethod
    def _release(live: _Live) -> Emitted | None:
        """The chunk ``live`` may release now, if any (a stop string may cut its output and last round)."""
        released, delta, dropped, live.stop_reason = live.releaser.advance(live.out, live.stop_reason)
        if dropped and live.rounds:
            live.rounds[-1].truncated = True
            live.rounds[-1].committed -= dropped
        return Emitted(released, delta, 0.0) if released else None

    @staticmethod
    def _emit(live: _Live, chunk: Emitted, now: float, events: list[BatchEvent]) -> None:
        """Stamp ``chunk`` with ``now`` (absolute), record its tokens' times and queue it."""
        chunk.t = now - live.t_arrival
        live.token_times.extend([chunk.t] * len(chunk.token_ids))
        live.chunks.append(len(chunk.token_ids))
        events.append((live.ticket, chunk))

    def _prefill(self, live: _Live, events: list[BatchEvent]) -> None:
        """(Re)build the slot's KV for the committed context; commit and emit the first token if new."""
        perf, model = time.perf_counter, self.engine.model
        t0 = perf()
        view = self.engine.cache.slot(live.slot)
        with torch.inference_mode():
            if not live.out:  # first admission: prompt -> first token
                logits = model(torch.tensor([live.req.prompt]), 0, view, last_only=True)[0, -1]
                p = live.req.params
                first = int(logits.argmax()) if p.greedy else int(
                    torch.multinomial(probs_from_logits(logits, p), 1, generator=live.rng))
                live.drafter.begin(live.req.prompt, p)
                kept, live.stop_reason = _cut_at_stop([first], 0, live.req.max_tokens, live.eos)
                live.out = list(kept)
                live.context = live.req.prompt + live.out
                live.t_prefill = perf() - t0
                chunk = self._release(live)
                if chunk is not None:
                    self._emit(live, chunk, perf(), events)
            else:  # recompute after preemption: KV for everything but the last committed token
                model(torch.tensor([live.context[:-1]]), 0, view, last_only=True)
                live.drafter.begin(live.context[:-1], live.req.params)
                live.recompute_s += perf() - t0

    def _finish(self, live: _Live) -> RequestRecord:
        live.drafter.end(live.req.prompt, live.out)
        engine = self.engine
        text = live.releaser.text if live.releaser.decode is not None else engine.decode_text(live.out)
        p = live.req.params
        last = live.token_times[-1] if live.token_times else time.perf_counter() - live.t_arrival
        return RequestRecord(
            request_id=live.req.request_id, drafter=live.drafter.name,
            gamma=live.policy.name if not live.policy.name.isdigit() else int(live.policy.name),
            temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=p.seed,
            prompt_tokens=len(live.req.prompt), output_tokens=len(live.out), text=text, token_ids=live.out,
            stop_reason=live.stop_reason, t_prefill=live.t_prefill,
            ttft=live.token_times[0] if live.token_times else last,
            total_time=last, token_times=live.token_times, chunks=live.chunks,
            rounds=live.rounds, category=live.req.category, prompt_id=live.req.prompt_id,
            model=engine.name, dtype=engine.dtype,
            extra={"preemptions": live.preemptions, "recompute_s": live.recompute_s},
        )

    def _admit(self, events: list[BatchEvent]) -> None:
        """Prefill waiting requests into free slots (KV budget: committed context + room for one step)."""
        engine, waiting, running, free_slots = self.engine, self.waiting, self.running, self.free_slots
        reserved = sum(len(x.context) for x in running)
        while waiting and free_slots and len(running) < self.limit:
            cand = waiting[0]
            need = len(cand.context or cand.req.prompt) + 1
            if reserved + need > engine.kv_budget and running:
                break
            waiting.popleft()
            cand.slot = free_slots.pop()
            self._prefill(cand, events)
            reserved += len(cand.context)
            if cand.stop_reason:
                free_slots.append(cand.slot)
                events.append((cand.ticket, self._finish(cand)))
            else:
                running.append(cand)

    # ------------------------------------------------------------------------------------
    def step(self) -> list[BatchEvent]:
        """Admit, then (if anything runs) draft, verify in one packed forward, commit and emit.
        Returns the step's events; a request's last event is its ``RequestRecord``."""
        perf = time.perf_counter
        engine, running = self.engine, self.running
        events: list[BatchEvent] = []
        self._admit(events)
        if not running:
            return events

        # drafting (per request, ragged gamma)
        t_step = perf()
        b = len(running)
        proposals: list[tuple[_Live, list[int], Any, float, int]] = []
        for live in running:
            remaining = live.req.max_tokens - len(live.out)
            g = min(live.policy.choose(len(live.context), b), remaining - 1, engine.capacity - len(live.context))
            g = max(g, 0)
            td = perf()
            prop = live.drafter.propose(live.context, g, live.req.params, live.rng) if g > 0 else None
            cand = prop.tokens[:g] if prop is not None else []
            q = prop.q[: len(cand)] if prop is not None and prop.q is not None else None
            proposals.append((live, cand, q, perf() - td, g))
        # per-step token budget: trim the longest proposals first
        if engine.step_budget:
            while sum(len(c) + 1 for _, c, *_ in proposals) > engine.step_budget:
                i = max(range(len(proposals)), key=lambda j: len(proposals[j][1]))
                if not proposals[i][1]:
                    break
                lv, c, q, td, g = proposals[i]
                proposals[i] = (lv, c[:-1], None if q is None else q[: len(c) - 1], td, g)
        # KV reservation for candidates; preempt the newest admissions if over budget
        reserved = sum(len(lv.context) + len(c) for lv, c, *_ in proposals)
        while reserved > engine.kv_budget and len(proposals) > 1:
            lv, c, *_ = proposals.pop()
            running.remove(lv)
            reserved -= len(lv.context) + len(c)
            self.free_slots.append(lv.slot)
            lv.preemptions += 1
            engine.preemptions += 1
            self.waiting.appendleft(lv)
        engine.peak_reserved_tokens = max(engine.peak_reserved_tokens, reserved)
        t_draft_total = perf() - t_step

        # one packed verify for everybody
        tokens: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        spans = []
        for lv, c, *_ in proposals:
            start = len(lv.context) - 1
            row0 = len(tokens)
            tokens += [lv.context[-1]] + c
            slots += [lv.slot] * (len(c) + 1)
            positions += list(range(start, start + len(c) + 1))
            spans.append((row0, row0 + len(c) + 1))
        tf = perf()
        with torch.inference_mode():
            logits = engine.model.forward_packed(tokens, slots, positions, engine.cache)
        t_forward = perf() - tf

        # verify, commit, stops
        to = perf()
        finished_now = []
        chunks: list[Emitted | None] = []
        for (lv, c, q, td, g), (r0, r1) in zip(proposals, spans):
            lg = logits[r0:r1]
            p = lv.req.params
            k, new = verify_greedy(lg, c) if p.greedy else verify_sampling(probs_from_logits(lg, p), c, q, lv.rng)
            kept, lv.stop_reason = _cut_at_stop(new, len(lv.out), lv.req.max_tokens, lv.eos)
            lv.out.extend(kept)
            ctx_len = len(lv.context)
            lv.context.extend(kept)
            lv.drafter.commit(lv.context)
            lv.rounds.append(RoundRecord(lv.drafter.name, g, len(c), k, len(kept), len(kept) < len(new),
                                         td, t_forward, 0.0, ctx_len, b))
            chunks.append(self._release(lv))  # stamped below, once the step's overhead is known
            if lv.stop_reason:
                finished_now.append(lv)
        t_other = perf() - to
        emit = perf()
        for (lv, *_), chunk in zip(proposals, chunks):
            rd = lv.rounds[-1]
            rd.t_other = t_other
            lv.policy.observe(rd.proposed, rd.accepted, rd.t_round, t_draft=rd.t_draft)
            if chunk is not None:
                self._emit(lv, chunk, emit, events)
            events.append((lv.ticket, rd))
        for lv in finished_now:
            running.remove(lv)
            self.free_slots.append(lv.slot)
            events.append((lv.ticket, self._finish(lv)))
        engine.steps.append(StepRecord(b, len(tokens), len(tokens) - len(proposals), t_forward, t_draft_total,
                                       t_other, reserved, sum(len(lv.context) for lv, *_ in proposals)))
        return events
