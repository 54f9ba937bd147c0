"""Continuous batching: each request's greedy output equals its solo plain greedy output, whatever
it is batched with (mixed prompt lengths, drafters, gammas, stops, preemption)."""

from __future__ import annotations

import random

import pytest
import torch

from specledger.engine.batch import BatchEngine, BatchRequest
from specledger.engine.decode import Engine
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.policy import GoodputGamma
from specledger.engine.sampling import SamplingParams


def _requests(n: int, seed: int = 0, max_tokens: int = 24, spacing: float = 0.002) -> list[BatchRequest]:
    """``n`` repetitive random prompts; open-loop arrivals ``spacing`` seconds apart."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        base = [rnd.randrange(64) for _ in range(rnd.randrange(2, 9))]
        prompt = base * rnd.randrange(1, 4) + [rnd.randrange(64) for _ in range(rnd.randrange(0, 6))]
        out.append(BatchRequest(prompt, max_tokens=rnd.randrange(5, max_tokens), request_id=f"r{i}",
                                arrival=spacing * i))
    return out


@pytest.fixture(scope="module")
def solo(target):
    engine = Engine(target)
    return {r.request_id: engine.generate(r.prompt, max_tokens=r.max_tokens).token_ids for r in _requests(10)}


@pytest.mark.parametrize("drafter,gamma", [("none", 0), ("ngram", 3), ("suffix", 5), ("layerskip", 2)])
@pytest.mark.parametrize("concurrency", [1, 4, None])
def test_batched_greedy_equals_solo_plain(target, solo, drafter, gamma, concurrency):
    solo_engine = Engine(target)
    engine = BatchEngine(target, max_batch=4, capacity=128)
    def factory():
        return make_drafter(drafter, solo_engine, layers="1")

    recs = engine.run(_requests(10), factory, gamma, concurrency=concurrency)
    assert len(recs) == 10
    for r in recs:
        assert r.token_ids == solo[r.request_id], r.request_id
        assert sum(rd.committed for rd in r.rounds) + 1 == r.output_tokens
    if concurrency == 4:  # a closed loop admits 4 before its first step, whatever the clock says
        assert max(s.batch_size for s in engine.steps) > 1


@pytest.mark.parametrize("drafter,gamma", [("none", 0), ("ngram", 3)])
def test_open_loop_batches_simultaneous_arrivals(target, solo, drafter, gamma):
    """Open loop, every request arrived at t=0: all are admitted before the first step, so batching is
    certain on any machine (staggered arrivals batch or not depending on the engine's speed)."""
    solo_engine = Engine(target)
    engine = BatchEngine(target, max_batch=4, capacity=128)
    recs = engine.run(_requests(10, spacing=0.0), lambda: make_drafter(drafter, solo_engine), gamma, concurrency=None)
    assert {r.request_id: r.token_ids for r in recs} == solo
    assert max(s.batch_size for s in engine.steps) == 4


def test_kv_budget_preempts_and_recomputes_exactly(target, solo):
    engine = BatchEngine(target, max_batch=4, capacity=128, kv_budget_tokens=70)
    recs = engine.run(_requests(10), lambda: make_drafter("ngram", Engine(target)), 4, concurrency=4)
    assert engine.preemptions > 0
    assert sum(r.extra["preemptions"] for r in recs) == engine.preemptions
    for r in recs:
        assert r.token_ids == solo[r.request_id]
    assert engine.peak_reserved_tokens <= 70 or any(s.batch_size == 1 for s in engine.steps)


def test_step_token_budget_caps_rows(target, solo):
    engine = BatchEngine(target, max_batch=4, capacity=128, step_token_budget=8)
    recs = engine.run(_requests(10), lambda: make_drafter("ngram", Engine(target)), 6, concurrency=4)
    assert max(s.rows for s in engine.steps) <= 8
    for r in recs:
        assert r.token_ids == solo[r.request_id]


def test_per_request_policies_and_sampling_run(target):
    engine = BatchEngine(target, max_batch=3, capacity=128)
    reqs = _requests(6)
    for i, r in enumerate(reqs):
        r.params = SamplingParams(temperature=0.9, seed=i)
    recs = engine.run(reqs, lambda: make_drafter("ngram", Engine(target)), GoodputGamma, concurrency=3)
    assert {r.gamma for r in recs} == {"goodput"}
    again = BatchEngine(target, max_batch=3, capacity=128).run(
        reqs, lambda: make_drafter("ngram", Engine(target)), GoodputGamma, concurrency=1)
    assert len(again) == 6
    with torch.no_grad():
        assert all(0 < r.output_tokens <= 24 for r in recs)


# --- the incremental scheduler (what `specledger serve` runs) ------------------------------------


def _solo_stream(target, tokenizer, req: BatchRequest, drafter: str, gamma: int):
    engine = Engine(target, tokenizer, eos_token_ids=[5])
    return engine.generate(req.prompt, drafter=make_drafter(drafter, engine), gamma=gamma,
                           max_tokens=req.max_tokens, stop=req.stop, ignore_eos=req.ignore_eos)


def _drain(sched, events_by_ticket, max_steps: int = 10000):
    for _ in range(max_steps):
        if not len(sched):
            return
        for ticket, ev in sched.step():
            events_by_ticket.setdefault(ticket, []).append(ev)
    raise AssertionError("the scheduler did not finish")


def _check_stream(events):
    """Per request: chunks, then rounds, end with exactly one record; the chunks spell the output."""
    from specledger.engine.decode import Emitted
    from specledger.records import RequestRecord, RoundRecord

    assert isinstance(events[-1], RequestRecord)
    assert not any(isinstance(e, RequestRecord) for e in events[:-1])
    rec = events[-1]
    chunks = [e for e in events if isinstance(e, Emitted)]
    assert [t for c in chunks for t in c.token_ids] == rec.token_ids
    assert [len(c.token_ids) for c in chunks] == rec.chunks
    assert "".join(c.text for c in chunks) == rec.text
    assert [e for e in events if isinstance(e, RoundRecord)] == rec.rounds
    return rec


def test_scheduler_adds_and_cancels_between_steps_exactly(target, solo, char_tokenizer):
    engine = BatchEngine(target, char_tokenizer, max_batch=3, capacity=128, initial_capacity=16)
    sched = engine.scheduler(stream_text=True)
    reqs = _requests(10)
    events: dict[int, list] = {}
    tickets = {}
    for i, r in enumerate(reqs):  # a new request every other step, more than there are slots
        tickets[sched.add(r, make_drafter("ngram", Engine(target)), 3)] = r.request_id
        for ticket, ev in sched.step():
            events.setdefault(ticket, []).append(ev)
        if i == 4:  # cancel the oldest request still in the scheduler (it holds a slot)
            victim = min(lv.ticket for lv in sched.running)
            assert sched.cancel(victim) and not sched.cancel(victim)
    _drain(sched, events)
    assert engine.cache.capacity > 16  # grown on demand, contents kept
    assert sorted(sched.free_slots) == [0, 1, 2]
    finished = {tickets[t]: _check_stream(evs) for t, evs in events.items() if t != victim}
    assert tickets[victim] not in finished and len(finished) == 9
    for rid, rec in finished.items():
        assert rec.token_ids == solo[rid], rid
    assert max(s.batch_size for s in engine.steps) == 3


@pytest.mark.parametrize("drafter,gamma", [("none", 0), ("ngram", 3)])
def test_batched_stops_match_solo(target, char_tokenizer, drafter, gamma):
    """Stop strings (held back, cut across token boundaries), ignore_eos and max_tokens: every
    request's output, text, stop reason, chunking and rounds equal the solo engine's."""
    reqs = []
    for i, r in enumerate(_requests(8, seed=3, max_tokens=40)):
        plain = _solo_stream(target, char_tokenizer, r, drafter, gamma)
        text = plain.text
        # a stop string from the middle of the plain output (two characters), or one that never occurs
        r.stop = [text[len(text) // 2: len(text) // 2 + 2], "@@@"] if i % 3 and len(text) > 4 else ["@@@"]
        r.ignore_eos = i % 2 == 0
        reqs.append(r)
    engine = BatchEngine(target, char_tokenizer, eos_token_ids=[5], max_batch=4, capacity=128)
    sched = engine.scheduler(stream_text=True)
    events: dict[int, list] = {}
    ids = {sched.add(r, make_drafter(drafter, Engine(target)), gamma): r for r in reqs}
    _drain(sched, events)
    reasons = set()
    for ticket, evs in events.items():
        rec, want = _check_stream(evs), _solo_stream(target, char_tokenizer, ids[ticket], drafter, gamma)
        assert (rec.token_ids, rec.text, rec.stop_reason, rec.chunks) == (
            want.token_ids, want.text, want.stop_reason, want.chunks)
        assert [(r.proposed, r.accepted, r.committed, r.truncated) for r in rec.rounds] == [
            (r.proposed, r.accepted, r.committed, r.truncated) for r in want.rounds]
        assert len(rec.text) <= len(char_tokenizer.decode(rec.token_ids))
        reasons.add(rec.stop_reason)
    assert "stop" in reasons and "length" in reasons


def test_scheduler_checks_requests(target, char_tokenizer):
    from specledger.errors import SpecLedgerError

    sched = BatchEngine(target, max_batch=2, capacity=64).scheduler()
    for bad in (BatchRequest([], 4), BatchRequest([1, 2], 0), BatchRequest([1] * 40, 30),
                BatchRequest([1, 2], 4, stop=["x"])):  # stop strings need a tokenizer
        with pytest.raises(SpecLedgerError):
            sched.add(bad, make_drafter("none", None))
    assert len(sched) == 0 and sched.step() == []


# --- a failure in one request fails that request alone ---------------------------------------------


class _Flaky:
    """Wraps a drafter; its ``hook`` raises on the ``after``-th call (0 = the first)."""

    def __init__(self, inner, hook: str, after: int = 0) -> None:
        self.inner, self.hook, self.after, self.calls = inner, hook, after, 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name != self.hook:
            return attr

        def flaky(*args, **kwargs):
            self.calls += 1
            if self.calls > self.after:
                raise RuntimeError(f"{name} broke")
            return attr(*args, **kwargs)

        return flaky


@pytest.mark.parametrize("hook,after", [("propose", 2), ("commit", 1), ("begin", 0), ("end", 0)])
def test_a_failing_request_fails_alone(target, solo, hook, after):
    """Drafting, verification/commit, prefill or the final record raising in one request: that request
    ends with RequestFailed (its last event), its slot is freed, the others equal their solo outputs."""
    from specledger.engine.batch import RequestFailed
    from specledger.records import RequestRecord

    engine = BatchEngine(target, max_batch=3, capacity=128)
    sched = engine.scheduler()
    reqs = _requests(6)
    tickets = {}
    for i, r in enumerate(reqs):
        d = make_drafter("ngram", Engine(target))
        tickets[sched.add(r, _Flaky(d, hook, after) if i == 1 else d, 3)] = r.request_id
    events: dict[int, list] = {}
    _drain(sched, events)
    bad = next(t for t, rid in tickets.items() if rid == "r1")
    assert isinstance(events[bad][-1], RequestFailed) and f"{hook} broke" in events[bad][-1].error
    assert not any(isinstance(e, (RequestRecord, RequestFailed)) for e in events[bad][:-1])
    for t, evs in events.items():
        if t != bad:
            assert _check_stream(evs).token_ids == solo[tickets[t]], tickets[t]
    assert len(sched) == 0 and sorted(sched.free_slots) == [0, 1, 2]


class _BrokenForward:
    """The target, whose ``n``-th packed forward raises."""

    def __init__(self, model, n: int) -> None:
        self.model, self.n, self.calls = model, n, 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def forward_packed(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.n:
            raise RuntimeError("device lost")
        return self.model.forward_packed(*args, **kwargs)


def test_a_failing_packed_forward_fails_its_step_and_the_scheduler_goes_on(target, solo):
    from specledger.engine.batch import RequestFailed

    engine = BatchEngine(_BrokenForward(target, 3), max_batch=3, capacity=128)
    sched = engine.scheduler()
    reqs = _requests(10)
    for r in reqs[:3]:
        sched.add(r, make_drafter("ngram", Engine(target)), 3)
    events: dict[int, list] = {}
    for _ in range(3):
        for t, ev in sched.step():
            events.setdefault(t, []).append(ev)
    assert all(isinstance(evs[-1], RequestFailed) and "device lost" in evs[-1].error for evs in events.values())
    assert len(events) == 3 and len(sched) == 0 and sorted(sched.free_slots) == [0, 1, 2]
    later = {sched.add(r, make_drafter("ngram", Engine(target)), 3): r.request_id for r in reqs[3:]}
    events = {}
    _drain(sched, events)
    assert {later[t]: _check_stream(evs).token_ids for t, evs in events.items()} == {
        rid: solo[rid] for rid in later.values()}


def test_step_times_add_up(target):
    """One meaning of the round times: a step's t_draft and t_other are the sums of its rounds', every
    round's t_other (own bookkeeping + share of the step's overhead) is >= 0, t_verify the forward."""
    from specledger.records import RoundRecord

    engine = BatchEngine(target, max_batch=3, capacity=128)
    sched = engine.scheduler()
    for r in _requests(5):
        sched.add(r, make_drafter("ngram", Engine(target)), 3)
    while len(sched):
        rounds = [ev for _, ev in sched.step() if isinstance(ev, RoundRecord)]
        if not rounds:
            continue
        step = engine.steps[-1]
        assert len(rounds) == step.batch_size
        assert sum(r.t_draft for r in rounds) == pytest.approx(step.t_draft, rel=1e-9, abs=1e-12)
        assert sum(r.t_other for r in rounds) == pytest.approx(step.t_other, rel=1e-9, abs=1e-12)
        assert all(r.t_other >= 0 and r.t_verify == step.t_forward for r in rounds)
