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


def _requests(n: int, seed: int = 0, max_tokens: int = 24) -> list[BatchRequest]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        base = [rnd.randrange(64) for _ in range(rnd.randrange(2, 9))]
        prompt = base * rnd.randrange(1, 4) + [rnd.randrange(64) for _ in range(rnd.randrange(0, 6))]
        out.append(BatchRequest(prompt, max_tokens=rnd.randrange(5, max_tokens), request_id=f"r{i}",
                                arrival=0.002 * i))
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
    if concurrency != 1:
        assert max(s.batch_size for s in engine.steps) > 1


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
