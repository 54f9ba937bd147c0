"""Gamma policies: each rule does what its docstring says; any policy keeps greedy output exact."""

from __future__ import annotations

import pytest

from specledger.engine.decode import Engine
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.policy import (
    BatchScheduleGamma,
    EmaGamma,
    GoodputGamma,
    HeuristicGamma,
    StaticGamma,
    make_policy,
)
from specledger.errors import SpecLedgerError


def test_heuristic_adds_two_on_full_accept_and_drops_one_otherwise():
    p = HeuristicGamma(start=4)
    p.observe(4, 4)
    assert p.choose(0) == 6
    p.observe(6, 2)
    assert p.choose(0) == 5
    for _ in range(10):
        p.observe(5, 0)
    assert p.choose(0) == 1
    p.reset()
    assert p.choose(0) == 4


def test_ema_grows_with_acceptance_and_shrinks_without():
    p = EmaGamma(max_gamma=8)
    for _ in range(30):
        p.observe(p.choose(0), p.choose(0))
    assert p.choose(0) == 8
    for _ in range(30):
        p.observe(p.choose(0), 0)
    assert p.choose(0) == 1


def test_batch_schedule_picks_the_largest_key_not_above_the_batch():
    p = BatchScheduleGamma({1: 4, 4: 2, 16: 0})
    assert [p.choose(0, b) for b in (1, 3, 4, 15, 16, 64)] == [4, 4, 2, 2, 0, 0]


@pytest.mark.parametrize(
    "accept_all,c1,expect",
    [(True, 0.001, "max"), (False, 0.5, "zero")],
)
def test_goodput_follows_cost_and_acceptance(accept_all, c1, expect):
    p = GoodputGamma(max_gamma=8, prior=(0.01, c1))
    p.reset()
    for _ in range(50):
        g = max(1, p.choose(0))
        p.observe(g, g if accept_all else 0, 0.01 + c1 * g)
    picks = [p.choose(0) for _ in range(16)]
    if expect == "max":
        assert picks[0] == 8
    else:  # plain steps, with one 1-candidate probe every 8 rounds to keep the acceptance estimate fresh
        assert picks.count(0) == 14 and picks.count(1) == 2


def test_goodput_learns_the_cost_line():
    p = GoodputGamma()
    for g in (1, 4, 2, 6, 3):
        p.observe(g, 0, 0.02 + 0.003 * g)
    c0, c1 = p.cost_line()
    assert c0 == pytest.approx(0.02, rel=1e-6) and c1 == pytest.approx(0.003, rel=1e-6)


def test_make_policy():
    assert isinstance(make_policy("3"), StaticGamma) and make_policy(3).gamma == 3
    assert isinstance(make_policy("goodput"), GoodputGamma)
    with pytest.raises(SpecLedgerError, match="unknown gamma policy"):
        make_policy("fast")


@pytest.mark.parametrize("name", ["heuristic", "ema", "batch", "goodput"])
def test_every_policy_keeps_greedy_output_exact(target, name):
    engine = Engine(target)
    drafter = make_drafter("ngram", engine)
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    plain = engine.generate(prompt, max_tokens=40)
    rec = engine.generate(prompt, drafter=drafter, gamma=make_policy(name), max_tokens=40)
    assert rec.token_ids == plain.token_ids and rec.gamma == name


def test_batched_goodput_tracks_how_much_of_its_ask_the_drafter_fills():
    from specledger.cost.step_cost import StepCost

    p = GoodputGamma(step_cost=StepCost.from_points([1, 16, 64, 256], [0.040, 0.060, 0.120, 0.400]))
    p.reset()
    assert p.fill() == 1.0
    for _ in range(30):
        g = p.choose(100, 8)
        p.observe(min(g, 1), min(g, 1))  # the drafter only ever finds one candidate, always accepted
    assert 0.0 < p.fill() < 0.6
    assert 0 <= p.choose(100, 8) <= p.max_gamma


def test_acceptance_chain_learns_rising_conditional_acceptance():
    from specledger.engine.policy import AcceptanceChain

    c = AcceptanceChain(n=8, forget=1.0)
    for _ in range(200):  # a copying drafter: either the first candidate misses, or all 8 are accepted
        c.observe(8, 0)
        c.observe(8, 8)
    a = c.rates()
    assert a[0] == pytest.approx(0.5, abs=0.02) and all(x > 0.95 for x in a[1:])
    assert c.expected_length(8) == pytest.approx(1 + 0.5 * 8, abs=0.3)  # half the rounds commit 9
    seeded = c.seeded(weight=4.0, first_weight=1.0)
    assert seeded.rates()[0] == pytest.approx(a[0], abs=0.15) and sum(seeded.t) == pytest.approx(1.0 + 4.0 * 7)


def test_goodput_takes_long_drafts_when_acceptance_rises_along_the_draft():
    p = GoodputGamma(max_gamma=8, prior=(0.05, 0.004))  # each candidate costs 8% of a step
    p.reset()
    for i in range(60):
        g = max(1, p.choose(0))
        p.observe(g, 0 if i % 2 else g, 0.05 + 0.004 * g)  # all-or-nothing acceptance
    assert p.choose(0) == 8  # a constant-a model (a ~ 0.5) would stop at 1-2
