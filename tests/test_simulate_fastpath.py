"""Event skipping (simulate/fastpath.py) gives the step path's outcome: same metrics, same ledger."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specledger.cost.roofline import ModelConfig, roofline
from specledger.simulate import fastpath
from specledger.simulate.arrivals import closed_loop, poisson, replay
from specledger.simulate.chains import ChainTable, Draws, keyed_stream
from specledger.simulate.cluster import least_outstanding
from specledger.simulate.dispatch import round_robin
from specledger.simulate.pricing import draft_costs, scalar_step, step_costs
from specledger.simulate.pricing import pairwise_sum as _pairwise_sum
from specledger.simulate.profile import fit_serving_cost
from specledger.simulate.simulator import break_even_verify_premium, simulate
from specledger.simulate.state import ServerConfig
from tests.test_simulate import LinearCost, chains
from tests.test_simulate_draws import _records

LEDGER = ("t_first", "t_last", "out", "chunks", "preemptions", "max_gap", "recompute_s", "nround")
COUNTERS = ("steps", "batch_sum", "rows_sum", "rounds", "proposed_sum", "accepted_sum", "peak_kv_tokens",
            "verify_s", "verify_base_s")  # the floats too: to the last bit


@pytest.fixture(autouse=True, params=["scalar", "arrays"])
def segment_kind(request, monkeypatch):
    """Every test runs with small batches in scalar Python (the default) and with every batch on arrays."""
    if request.param == "arrays":
        monkeypatch.setattr(fastpath, "SMALL_BATCH", 0)
    return request.param


def table(n=20, seed=0, fill=1.0, **kw):
    t = ChainTable.from_chains(chains(n=n, seed=seed, **kw), 16)
    t.fill[:, 2:] = fill  # fill < 1: the drafter sometimes proposes fewer than asked
    return t


class NoisyCost(LinearCost):
    """LinearCost with a profile's jitter: forward x (0.8 + 0.4 u), prefill x (0.9 + 0.2 u)."""

    def jitter(self, u):
        return 0.8 + 0.4 * u, 0.9 + 0.2 * u


def both(t, arr, n, cost, gamma=4, **kw):
    return simulate(t, arr, n, cost, gamma, fast=False, **kw), simulate(t, arr, n, cost, gamma, fast=True, **kw)


def assert_same(slow, fast):
    """Metrics equal (floats to rel 1e-9), ledgers equal, gap multisets equal."""
    ms, mf = slow.metrics(), fast.metrics()
    assert ms.keys() == mf.keys()
    for k, v in ms.items():
        w = mf[k]
        if isinstance(v, float) and isinstance(w, float):
            assert (math.isnan(v) and math.isnan(w)) or w == pytest.approx(v, rel=1e-9, abs=1e-12), k
        else:
            assert v == w, k
    a, b = slow.ledger, fast.ledger
    for f in LEDGER:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    for f in COUNTERS:
        assert getattr(a, f) == getattr(b, f), f
    np.testing.assert_array_equal(np.sort(np.concatenate(a.gaps)), np.sort(np.concatenate(b.gaps)))


@pytest.mark.parametrize("c", [1, 4, 16])
def test_closed_loop(c):
    slow, fast = both(table(fill=0.8), closed_loop(c), 120, LinearCost(c=1e-6, d=1e-4),
                      config=ServerConfig(max_num_seqs=16))
    assert_same(slow, fast)
    assert fast.ledger.fast_steps > 0 and slow.ledger.fast_steps == 0


@pytest.mark.parametrize("jitter", [False, True])
def test_poisson_light_load_skips_most_steps(jitter):
    slow, fast = both(table(fill=0.8), poisson(3.0, 200, seed=1), 200, NoisyCost(), jitter=jitter,
                      config=ServerConfig(max_num_seqs=16))
    assert_same(slow, fast)
    L = fast.ledger
    assert L.fast_steps > 0.8 * L.steps  # the segments carry the run; the step path only admission steps
    assert L.fast_segments < 0.5 * L.fast_steps


def test_jitter_is_keyed_and_changes_the_steps():
    t = table()
    on = simulate(t, poisson(3.0, 100, seed=1), 100, NoisyCost(), 4, jitter=True).metrics()
    off = simulate(t, poisson(3.0, 100, seed=1), 100, NoisyCost(), 4, jitter=False).metrics()
    assert on["tpot_p50_ms"] != off["tpot_p50_ms"]
    u = keyed_stream(3, 1, np.array([0, 0, 1]), np.array([5, 5, 5]))
    assert u[0] == u[1] != u[2] and 0 <= u.min() < 1
    assert keyed_stream(3, 2, np.array([0]), np.array([5]))[0] != u[0]  # streams differ


def test_fitted_profile_with_noise():
    cost = fit_serving_cost(_records({1: 1.0, 4: 1.1}, jitter=0.05, seed=2))
    for chunked in (False, True):
        cfg = ServerConfig(max_num_seqs=8, chunked_prefill=chunked, max_num_batched_tokens=4096)
        assert_same(*both(table(fill=0.9), poisson(4.0, 150, seed=2), 150, cost, 2, drafter="ngram", config=cfg))


def test_replay_arrivals():
    arr = replay(np.concatenate([np.zeros(10), np.linspace(1, 5, 40), np.full(10, 6.0)]))
    assert_same(*both(table(), arr, 60, LinearCost(), config=ServerConfig(max_num_seqs=8)))


@pytest.mark.parametrize("route", [round_robin, least_outstanding])
@pytest.mark.parametrize("arr", [closed_loop(6), poisson(6.0, 150, seed=4)], ids=["closed", "poisson"])
def test_two_replicas(route, arr):
    assert_same(*both(table(fill=0.7), arr, 150, NoisyCost(), replicas=2, router=route(),
                      config=ServerConfig(max_num_seqs=4)))


def test_tight_kv_budget_falls_back_and_preempts():
    cfg = ServerConfig(max_num_seqs=16, kv_budget_tokens=1200, block_size=16)
    slow, fast = both(table(n=10, out=(80, 120), prompt=(100, 150)), closed_loop(16), 80, LinearCost(), config=cfg)
    assert slow.metrics()["preemptions"] > 0
    assert_same(slow, fast)
    assert 0 < fast.ledger.fast_steps < fast.ledger.steps


def test_kv_reserve_gamma_and_blocks():
    cfg = ServerConfig(max_num_seqs=8, kv_budget_tokens=3000, block_size=16, reserve_gamma=True)
    assert_same(*both(table(fill=0.6), closed_loop(8), 100, LinearCost(), 6, config=cfg))


@pytest.mark.parametrize("budget", [None, 64, 300])
def test_chunked_prefill(budget):
    cfg = ServerConfig(max_num_seqs=8, chunked_prefill=True, max_num_batched_tokens=budget, kv_budget_tokens=4000,
                       block_size=16)
    slow, fast = both(table(fill=0.8), poisson(5.0, 120, seed=5), 120, NoisyCost(d=1e-4), config=cfg)
    assert_same(slow, fast)
    assert fast.ledger.fast_steps > 0


def test_token_budget_binding():
    cfg = ServerConfig(max_num_seqs=16, max_num_batched_tokens=40)  # 16 x (4 + 1) rows would need 80
    slow, fast = both(table(), closed_loop(16), 100, LinearCost(), config=cfg)
    assert slow.ledger.rows_sum / slow.ledger.steps <= 40
    assert_same(slow, fast)


def test_per_request_policy_takes_the_step_path():
    slow, fast = both(table(), closed_loop(4), 40, LinearCost(), "heuristic")
    assert_same(slow, fast)
    assert fast.ledger.fast_steps == 0


def test_deterministic_table_takes_the_step_path():
    t = table().mean_only(deterministic=True)
    slow, fast = both(t, closed_loop(4), 40, LinearCost())
    assert_same(slow, fast)
    assert fast.ledger.fast_steps == 0


@pytest.mark.parametrize("per", ["prompt", "request"])
def test_keyed_per_prompt_and_request(per):
    order = np.arange(80) % 5
    assert_same(*both(table(), poisson(4.0, 80, seed=6), 80, LinearCost(), order=order, per=per))


@pytest.mark.parametrize("chunk", [False, True])
def test_plain_decoding(chunk):
    slow, fast = both(table(), poisson(4.0, 100, seed=7), 100, LinearCost(), 0,
                      config=ServerConfig(max_num_seqs=8, chunked_prefill=chunk))
    assert_same(slow, fast)
    assert fast.ledger.fast_steps > 0.5 * fast.ledger.steps


def test_one_token_requests_and_gamma_beyond_the_table():
    short = table(out=(1, 4))
    mixed = table(out=(20, 60))
    mixed.output_tokens[::3] = 1  # a one-token request among long ones: it finishes at its admission
    cases = ((short, poisson(10.0, 80, seed=8)), (short, closed_loop(1)), (short, closed_loop(3)),
             (mixed, closed_loop(3)))
    for chunk in (False, True):
        for t, arr in cases:
            assert_same(*both(t, arr, 80, LinearCost(), 20, config=ServerConfig(max_num_seqs=4, chunked_prefill=chunk)))


def test_roofline_h200_like_the_benchmark():
    model = ModelConfig(8.03e9, 32, 32, 8, 128, name="8b")
    cost = roofline("h200", model)
    cfg = ServerConfig(max_num_seqs=256, max_num_batched_tokens=8192, kv_budget_tokens=cost.kv_budget_tokens(),
                       block_size=16, chunked_prefill=True)
    t = table(n=30, fill=0.8, out=(50, 400), prompt=(100, 2000))
    slow, fast = both(t, poisson(20.0, 300, seed=9), 300, cost, drafter="ngram", config=cfg)
    assert_same(slow, fast)
    assert fast.ledger.fast_steps > 0.6 * fast.ledger.steps
    premium = [break_even_verify_premium(1.1, r.metrics()) for r in (slow, fast)]
    assert premium[0] is not None and premium[0] == premium[1]  # the same floats, the same premium
    assert_same(*both(t, closed_loop(64), 300, cost, drafter="ngram", config=cfg))


def test_vectorised_costs_match_the_scalar_ones():
    cost = roofline("h100", ModelConfig(8.03e9, 32, 32, 8, 128),)
    rows, ctx = np.array([1, 5, 40, 3000]), np.array([0.0, 17.5, 900.25, 4000.0])
    np.testing.assert_array_equal(cost.step_s_many(rows, 7, ctx), [cost.step_s(r, 7, c) for r, c in zip(rows, ctx)])
    np.testing.assert_array_equal(step_costs(cost, rows, 7, ctx),
                                  [cost.step_s(int(r), 7, c) for r, c in zip(rows, ctx)])
    step = scalar_step(cost)
    assert [step(int(r), 7, c) for r, c in zip(rows, ctx)] == [cost.step_s(int(r), 7, c) for r, c in zip(rows, ctx)]
    g = np.array([[0, 1, 4], [2, 2, 0]])
    lin = LinearCost(d=1e-3)
    np.testing.assert_array_equal(draft_costs(lin, "ngram", g, ctx[:2]), g * 1e-3)
    np.testing.assert_array_equal(draft_costs(cost, "ngram", g, ctx[:2]), np.where(g > 0, cost.model_free_draft_s, 0))


def test_scalar_helpers_match_numpy():
    cost = roofline("h200", ModelConfig(8.03e9, 32, 32, 8, 128))
    f = scalar_step(cost)
    for r, b, c in [(1, 1, 0.0), (9, 3, 417.3333333333333), (2000, 256, 3012.25)]:
        assert f(r, b, c) == cost.step_s(r, b, c)
    rng = np.random.default_rng(0)
    for n in (1, 3, 7, 8, 9, 30, 200):
        v = (rng.random(n) * 1e-4).tolist()
        assert _pairwise_sum(v) == float(np.array(v).sum())


def test_round_cache_draws_what_sampling_draws(segment_kind):
    if segment_kind == "arrays":
        pytest.skip("the array segments draw their own rounds")
    t = table(fill=0.7)
    r = simulate(t, closed_loop(2), 10, LinearCost(), 6, seed=3)
    cache = r.ledger.round_cache
    assert cache is not None
    for rid in (0, 7):
        codes = cache.rounds(rid, 0, 200)  # past the rounds drawn ahead: drawn when asked
        n = len(codes)
        p, k = t.sample(np.full(n, r.ledger.chain[rid]), np.full(n, 6), Draws(3), np.full(n, rid), np.arange(n))
        assert codes == (p * 32 + k).tolist()


def test_requests_that_run_out_of_drawn_rounds(monkeypatch, segment_kind):
    """A request whose rounds drawn ahead run out gets the next ones drawn where it stands."""
    if segment_kind == "arrays":
        pytest.skip("the array segments draw their own rounds")
    monkeypatch.setattr(fastpath, "AHEAD", 3)
    t = table(fill=0.8, out=(60, 200))
    for c in (1, 3):
        for replicas in (1, 2):
            assert_same(*both(t, closed_loop(c), 12, LinearCost(), 8, replicas=replicas))


def chunked(**kw):
    return ServerConfig(**{"max_num_seqs": 8, "chunked_prefill": True, "max_num_batched_tokens": 2048, **kw})


def test_lone_replica_runs_through_arrivals_and_finishes(segment_kind):
    """One replica, chunked prefill, light load: a handful of fast-path calls serve every request."""
    slow, fast = both(table(fill=0.8), poisson(2.0, 300, seed=11), 300, NoisyCost(d=1e-4), config=chunked())
    assert_same(slow, fast)
    if segment_kind == "scalar":
        assert fast.ledger.fast_segments < 10 and fast.ledger.fast_steps == fast.ledger.steps


@pytest.mark.parametrize("c", [1, 5, 12])
def test_lone_replica_closed_loop(c):
    assert_same(*both(table(fill=0.8), closed_loop(c), 150, NoisyCost(), config=chunked(max_num_seqs=8)))


def test_lone_replica_readmits_preempted_requests():
    cfg = chunked(max_num_seqs=12, kv_budget_tokens=1100, block_size=16)
    slow, fast = both(table(n=10, out=(60, 120), prompt=(100, 150), fill=0.8), closed_loop(12), 60, LinearCost(),
                      config=cfg)
    assert slow.metrics()["preemptions"] > 0
    assert_same(slow, fast)


def test_lone_replica_hands_big_batches_and_long_prompts_to_the_step_path(monkeypatch):
    monkeypatch.setattr(fastpath, "SMALL_BATCH", 3)  # a burst grows the batch past it
    arr = replay(np.concatenate([np.linspace(0, 1, 20), np.linspace(3, 3.1, 10), np.linspace(6, 9, 20)]))
    cfg = chunked(max_num_batched_tokens=160)  # prompts of 50..200 tokens: some take two steps
    slow, fast = both(table(fill=0.8), arr, 50, LinearCost(), config=cfg)
    assert_same(slow, fast)
    assert 0 < fast.ledger.fast_steps < fast.ledger.steps


def test_lone_replica_with_reserved_gamma_and_tight_kv_on_poisson():
    cfg = chunked(max_num_seqs=6, kv_budget_tokens=900, block_size=16, reserve_gamma=True)
    assert_same(*both(table(n=8, out=(40, 90), prompt=(100, 200), fill=0.9), poisson(8.0, 120, seed=12), 120,
                      NoisyCost(), 6, config=cfg))


def test_roofline_with_a_draft_model():
    """The draft model's price depends on the step's mean context: the segments price it per step."""
    draft = ModelConfig(1.2e9, 16, 32, 8, 64, name="1b")
    cost = roofline("h100", ModelConfig(8.03e9, 32, 32, 8, 128, name="8b"), draft_model=draft)
    t = table(n=30, fill=0.8, out=(50, 300), prompt=(100, 1500))
    for cfg in (ServerConfig(max_num_seqs=32), ServerConfig(max_num_seqs=32, chunked_prefill=True)):
        for arr in (poisson(15.0, 200, seed=13), closed_loop(30)):
            assert_same(*both(t, arr, 200, cost, 3, drafter="model", config=cfg))


@pytest.mark.parametrize("chunk", [False, True])
def test_replicas_run_on_through_finishes_until_the_next_arrival(chunk, segment_kind):
    cfg = ServerConfig(max_num_seqs=6, chunked_prefill=chunk, kv_budget_tokens=1500, block_size=16)
    t = table(n=12, fill=0.8, out=(20, 120), prompt=(50, 300))
    t.output_tokens[::4] = 1
    slow, fast = both(t, poisson(12.0, 200, seed=14), 200, NoisyCost(), replicas=3, router=least_outstanding(),
                      config=cfg)
    assert_same(slow, fast)
    assert slow.metrics()["preemptions"] > 0
    if segment_kind == "scalar":
        assert fast.ledger.fast_steps > 0.3 * fast.ledger.steps


@pytest.mark.parametrize("chunk", [False, True])
def test_batch_size_schedule(chunk, segment_kind):
    """gamma from the batch size (the engine's "batch" policy): the scalar loop asks it per step."""
    cfg = ServerConfig(max_num_seqs=12, chunked_prefill=chunk)
    for arr in (poisson(6.0, 150, seed=15), closed_loop(10)):
        slow, fast = both(table(fill=0.8), arr, 150, LinearCost(d=1e-4), "batch", config=cfg)
        assert_same(slow, fast)
        if segment_kind == "scalar":
            assert fast.ledger.fast_steps == fast.ledger.steps
    L = slow.ledger
    assert 0 < L.proposed_sum < 3 * L.rounds  # c=10: mostly gamma 2 (8 <= batch < 16)
