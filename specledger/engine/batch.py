"""Continuous batching with speculation: many requests in flight, one packed verify per step.

Each step:
  1. admit arrived requests while a sequence slot is free and the KV budget holds their
     context (prefill each into its slot; its first token is emitted then);
  2. every running request's drafter proposes its own gamma (per-request policies, ragged);
     a per-step token budget trims the largest proposals first;
  3. KV for the candidates is reserved (context + gamma per request); if the budget would be
     exceeded, the most recently admitted request is preempted (its slot freed, its tokens
     kept) and later recomputed by a prefill over prompt + output -- preemptions and their
     recompute time are recorded;
  4. one packed forward (:meth:`Transformer.forward_packed`) verifies everybody;
  5. each request verifies, commits, applies EOS / max_tokens; rejected candidates' KV is
     released (the reservation shrinks back to the committed context).

Exactness: packed rows are computed bit for bit like solo decoding (row-invariant kernels),
so each request's greedy output equals its solo plain greedy output whatever it is batched with.

Timing per round record: t_draft is the request's own drafting time, t_verify the step's
packed forward (everybody waits for it), t_other the step's remaining overhead; batch_size is
the number of requests in the step. Stop strings are not supported here (EOS and max_tokens are).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specledger.engine.decode import _cut_at_stop
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


@dataclass
class _Live:
    req: BatchRequest
    drafter: Drafter
    policy: GammaPolicy
    rng: torch.Generator
    t_arrival: float  # absolute perf_counter time
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


class BatchEngine:
    """A target model with ``max_batch`` sequence slots of ``capacity`` positions each."""

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
    ) -> None:
        require(max_batch >= 1, "max_batch must be >= 1")
        self.model, self.tokenizer = model, tokenizer
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.max_batch, self.capacity = max_batch, capacity
        self.kv_budget = kv_budget_tokens or max_batch * capacity
        self.step_budget = step_token_budget
        self.name, self.dtype = name, dtype
        self.cache = model.new_cache(capacity, batch_size=max_batch)
        self.steps: list[StepRecord] = []
        self.preemptions = 0
        self.peak_reserved_tokens = 0

    # ------------------------------------------------------------------------------------
    def _prefill(self, live: _Live, perf: Callable[[], float]) -> None:
        """(Re)build the slot's KV for the committed context; emit the first token if new."""
        t0 = perf()
        view = self.cache.slot(live.slot)
        with torch.inference_mode():
            if not live.out:  # first admission: prompt -> first token
                logits = self.model(torch.tensor([live.req.prompt]), 0, view, last_only=True)[0, -1]
                p = live.req.params
                first = int(logits.argmax()) if p.greedy else int(
                    torch.multinomial(probs_from_logits(logits, p), 1, generator=live.rng))
                live.drafter.begin(live.req.prompt, p)
                kept, live.stop_reason = _cut_at_stop([first], 0, live.req.max_tokens, self.eos)
                live.out = list(kept)
                live.context = live.req.prompt + live.out
                live.t_prefill = perf() - t0
                now = perf() - live.t_arrival
                live.token_times.append(now)
                live.chunks.append(1)
            else:  # recompute after preemption: KV for everything but the last committed token
                self.model(torch.tensor([live.context[:-1]]), 0, view, last_only=True)
                live.drafter.begin(live.context[:-1], live.req.params)
                live.recompute_s += perf() - t0

    def _finish(self, live: _Live) -> RequestRecord:
        live.drafter.end(live.req.prompt, live.out)
        text = self.tokenizer.decode(live.out, skip_special_tokens=True) if self.tokenizer is not None else ""
        p = live.req.params
        return RequestRecord(
            request_id=live.req.request_id, drafter=live.drafter.name,
            gamma=live.policy.name if not live.policy.name.isdigit() else int(live.policy.name),
            temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=p.seed,
            prompt_tokens=len(live.req.prompt), output_tokens=len(live.out), text=text, token_ids=live.out,
            stop_reason=live.stop_reason, t_prefill=live.t_prefill, ttft=live.token_times[0],
            total_time=live.token_times[-1], token_times=live.token_times, chunks=live.chunks,
            rounds=live.rounds, category=live.req.category, prompt_id=live.req.prompt_id,
            model=self.name, dtype=self.dtype,
            extra={"preemptions": live.preemptions, "recompute_s": live.recompute_s},
        )

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
        ``drafter_factory`` builds one drafter per request (drafter state is per request)."""
        perf = time.perf_counter
        for r in requests:
            require(len(r.prompt) + r.max_tokens + 16 <= self.capacity,
                    f"request {r.request_id}: prompt + max_tokens exceed the slot capacity {self.capacity}")
        t_start = perf()
        pending = deque(sorted(requests, key=lambda r: r.arrival) if concurrency is None else requests)
        waiting: deque[_Live] = deque()
        running: list[_Live] = []
        free_slots = list(range(self.max_batch - 1, -1, -1))
        done: list[RequestRecord] = []
        limit = min(concurrency or self.max_batch, self.max_batch)

        def make_live(r: BatchRequest) -> _Live:
            policy = gamma() if callable(gamma) and not isinstance(gamma, GammaPolicy) else as_policy(gamma)
            policy.reset()
            seed = r.params.seed if r.params.seed is not None else 0
            return _Live(r, drafter_factory(), policy, torch.Generator().manual_seed(seed), perf())

        while pending or waiting or running:
            now = perf() - t_start
            # arrivals
            if concurrency is None:
                while pending and pending[0].arrival <= now:
                    live = make_live(pending.popleft())
                    live.t_arrival = t_start + live.req.arrival
                    waiting.append(live)
            else:
                while pending and len(running) + len(waiting) < limit:
                    waiting.append(make_live(pending.popleft()))
            # admission (KV budget: committed context + room for one step)
            reserved = sum(len(x.context) for x in running)
            while waiting and free_slots and len(running) < limit:
                cand = waiting[0]
                need = len(cand.context or cand.req.prompt) + 1
                if reserved + need > self.kv_budget and running:
                    break
                waiting.popleft()
                cand.slot = free_slots.pop()
                self._prefill(cand, perf)
                reserved += len(cand.context)
                if cand.stop_reason:
                    free_slots.append(cand.slot)
                    done.append(self._finish(cand))
                else:
                    running.append(cand)
            if not running:
                if pending and concurrency is None:
                    time.sleep(max(0.0, min(0.01, pending[0].arrival - (perf() - t_start))))
                continue

            # drafting (per request, ragged gamma)
            t_step = perf()
            b = len(running)
            proposals: list[tuple[_Live, list[int], Any, float, int]] = []
            for live in running:
                remaining = live.req.max_tokens - len(live.out)
                g = min(live.policy.choose(len(live.context), b), remaining - 1, self.capacity - len(live.context))
                g = max(g, 0)
                td = perf()
                prop = live.drafter.propose(live.context, g, live.req.params, live.rng) if g > 0 else None
                cand = prop.tokens[:g] if prop is not None else []
                q = prop.q[: len(cand)] if prop is not None and prop.q is not None else None
                proposals.append((live, cand, q, perf() - td, g))
            # per-step token budget: trim the longest proposals first
            if self.step_budget:
                while sum(len(c) + 1 for _, c, *_ in proposals) > self.step_budget:
                    i = max(range(len(proposals)), key=lambda j: len(proposals[j][1]))
                    if not proposals[i][1]:
                        break
                    lv, c, q, td, g = proposals[i]
                    proposals[i] = (lv, c[:-1], None if q is None else q[: len(c) - 1], td, g)
            # KV reservation for candidates; preempt the newest admissions if over budget
            reserved = sum(len(lv.context) + len(c) for lv, c, *_ in proposals)
            while reserved > self.kv_budget and len(proposals) > 1:
                lv, c, *_ = proposals.pop()
                running.remove(lv)
                reserved -= len(lv.context) + len(c)
                free_slots.append(lv.slot)
                lv.preemptions += 1
                self.preemptions += 1
                waiting.appendleft(lv)
            self.peak_reserved_tokens = max(self.peak_reserved_tokens, reserved)
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
                logits = self.model.forward_packed(tokens, slots, positions, self.cache)
            t_forward = perf() - tf

            # verify, commit, stops
            to = perf()
            finished_now = []
            for (lv, c, q, td, g), (r0, r1) in zip(proposals, spans):
                lg = logits[r0:r1]
                p = lv.req.params
                k, new = verify_greedy(lg, c) if p.greedy else verify_sampling(probs_from_logits(lg, p), c, q, lv.rng)
                kept, lv.stop_reason = _cut_at_stop(new, len(lv.out), lv.req.max_tokens, self.eos)
                lv.out.extend(kept)
                ctx_len = len(lv.context)
                lv.context.extend(kept)
                lv.drafter.commit(lv.context)
                lv.rounds.append(RoundRecord(lv.drafter.name, g, len(c), k, len(kept), len(kept) < len(new),
                                             td, t_forward, 0.0, ctx_len, b))
                if lv.stop_reason:
                    finished_now.append(lv)
            t_other = perf() - to
            emit = perf()
            for lv, *_ in proposals:
                rd = lv.rounds[-1]
                rd.t_other = t_other
                lv.policy.observe(rd.proposed, rd.accepted, rd.t_round, t_draft=rd.t_draft)
                n = lv.rounds[-1].committed
                if n:
                    lv.token_times.extend([emit - lv.t_arrival] * n)
                    lv.chunks.append(n)
            for lv in finished_now:
                running.remove(lv)
                free_slots.append(lv.slot)
                done.append(self._finish(lv))
            self.steps.append(StepRecord(b, len(tokens), len(tokens) - len(proposals), t_forward, t_draft_total,
                                         t_other, reserved, sum(len(lv.context) for lv, *_ in proposals)))
        return done
