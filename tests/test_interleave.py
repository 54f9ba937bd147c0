"""Requests run side by side (one round of each in turn) decode exactly what they decode alone, and each is
timed as if alone: its clock stops while the others run."""

from __future__ import annotations

import time

import pytest

from specledger.engine.decode import Engine
from specledger.engine.drafters.layerskip import LayerSkipDrafter
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.interleave import PausableClock, run_interleaved
from specledger.engine.sampling import SamplingParams
from specledger.mainjob.job import Job, job_groups

PROMPT = [5, 9, 2, 7, 5, 9, 2, 7, 1, 3, 5, 9, 2]

SETTINGS = [  # (drafter, gamma, temperature, tree budget)
    ("none", 0, 0.0, 0), ("ngram", 2, 0.0, 0), ("suffix", 4, 0.0, 0), ("layerskip", 2, 0.0, 0),
    ("ngram", 4, 0.0, 8), ("layerskip", 3, 0.0, 6), ("ngram", 3, 0.9, 0), ("layerskip", 2, 0.9, 0), ("none", 0, 0.9, 0),
]


def _drafter(name: str, engine: Engine):
    return LayerSkipDrafter(engine.model, [0]) if name == "layerskip" else make_drafter(name, engine)


def _kwargs(engine: Engine, drafter: str, gamma: int, temperature: float, budget: int) -> dict:
    return dict(drafter=_drafter(drafter, engine), gamma=gamma, max_tokens=24, tree_budget=budget,
                params=SamplingParams(temperature=temperature, seed=3))


def test_interleaved_requests_decode_exactly_what_they_decode_alone(target):
    engine = Engine(target)
    alone = [engine.generate(PROMPT, **_kwargs(engine, *s)) for s in SETTINGS]
    twins = [engine.sibling() for _ in SETTINGS]
    side_by_side = run_interleaved([
        (lambda clock, e=e, s=s: e.stream(PROMPT, clock=clock, **_kwargs(e, *s))) for e, s in zip(twins, SETTINGS)
    ])
    assert [r.token_ids for r in side_by_side] == [r.token_ids for r in alone]
    assert [len(r.rounds) for r in side_by_side] == [len(r.rounds) for r in alone]
    greedy = [r.token_ids for r, s in zip(side_by_side, SETTINGS) if s[2] == 0.0]
    assert all(ids == greedy[0] for ids in greedy)  # and greedy speculation is plain greedy


def test_side_by_side_prefills_in_passes_and_decodes_what_one_pass_decodes(target):
    """Unshared, SideBySide runs prefills in PREFILL_CHUNK passes, one per turn: a long prompt's outputs and rounds
    are those of a one-pass prefill, and each request's prefill time counts only its own passes."""
    from specledger.engine.interleave import PREFILL_CHUNK, SideBySide

    engine = Engine(target)
    prompt = (PROMPT * 30)[: 3 * PREFILL_CHUNK + 5]
    settings = SETTINGS[:4]
    alone = [engine.generate(prompt, **_kwargs(engine, *s)) for s in settings]
    wall = time.perf_counter()
    records = SideBySide(share_prefill=False).run([(engine, prompt, _kwargs(engine, *s)) for s in settings])
    wall = time.perf_counter() - wall
    assert [r.token_ids for r in records] == [r.token_ids for r in alone]
    assert [[rd.accepted for rd in r.rounds] for r in records] == [[rd.accepted for rd in r.rounds] for r in alone]
    assert sum(r.total_time for r in records) <= wall * 1.05


def test_settings_of_one_prompt_share_one_prefill_and_decode_what_they_decode_alone(target, monkeypatch):
    """One prefill per (engine, prompt) group: every setting (sampled, trees and a layer-skip draft included)
    decodes exactly what it decodes alone, each record says it shared the prefill, and counts it in its time."""
    from specledger.engine.interleave import SideBySide

    engine = Engine(target)
    prompt = (PROMPT * 20)[:150]
    alone = [engine.generate(prompt, **_kwargs(engine, *s)) for s in SETTINGS]
    calls = []
    real = Engine.prefill
    monkeypatch.setattr(Engine, "prefill", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    records = SideBySide().run([(engine, prompt, _kwargs(engine, *s)) for s in SETTINGS]
                               + [(engine, PROMPT, _kwargs(engine, *SETTINGS[0]))])
    assert len(calls) == 1  # the lone request on PROMPT prefills on its own
    assert [r.token_ids for r in records[:-1]] == [r.token_ids for r in alone]
    assert [[rd.accepted for rd in r.rounds] for r in records[:-1]] == [[rd.accepted for rd in r.rounds] for r in alone]
    assert all(r.extra.get("prefill_shared") for r in records[:-1]) and not records[-1].extra.get("prefill_shared")
    assert all(0 < r.t_prefill <= r.ttft <= r.total_time for r in records)


def test_a_prefill_of_another_prompt_is_not_used(target):
    engine = Engine(target)
    other = engine.sibling().prefill(PROMPT[:-1], 8)
    rec = engine.generate(PROMPT, max_tokens=8, prefilled=other)
    assert rec.token_ids == engine.generate(PROMPT, max_tokens=8).token_ids and "prefill_shared" not in rec.extra


def test_each_request_is_timed_as_if_alone():
    """Two streams that each spend 0.1 s per round: interleaved, each one's total is its own 0.3 s, not the
    0.6 s of wall time the pair took (a clock that kept running while suspended would count both)."""
    from specledger.records import RequestRecord, RoundRecord

    def slow_stream(clock):
        t0 = clock()
        for _ in range(3):
            time.sleep(0.1)
            yield RoundRecord.__new__(RoundRecord)
        record = RequestRecord.__new__(RequestRecord)
        record.total_time = clock() - t0
        yield record

    wall = time.perf_counter()
    a, b = run_interleaved([slow_stream, slow_stream])
    wall = time.perf_counter() - wall
    assert wall >= 0.59
    for rec in (a, b):
        assert 0.29 <= rec.total_time < 0.45


def test_a_pausable_clock_stands_still_while_suspended():
    clock = PausableClock()
    clock.suspend()
    before = clock()
    time.sleep(0.05)
    assert clock() - before < 0.01
    clock.resume()
    time.sleep(0.02)
    assert clock() - before >= 0.019


@pytest.mark.parametrize("interleave", [True, False])
def test_job_groups_are_one_prompt_and_temperature(interleave):
    jobs = [Job("a", "none", 0, 0.0), Job("a", "ngram", 2, 0.0), Job("b", "none", 0, 0.0), Job("a", "none", 0, 0.8)]
    groups = job_groups(jobs, interleave)
    if interleave:
        assert [[j.key for j in g] for g in groups] == [[jobs[0].key, jobs[1].key], [jobs[2].key], [jobs[3].key]]
    else:
        assert [len(g) for g in groups] == [1, 1, 1, 1]


def test_job_groups_are_at_most_width_wide():
    jobs = [Job("a", "none", 0, 0.0)] + [Job("a", "ngram", g, 0.0) for g in range(1, 10)]
    assert [len(g) for g in job_groups(jobs, True, width=4)] == [4, 4, 2]
