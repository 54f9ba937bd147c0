"""Keyed acceptance draws, the slot-dependent prefill and the step-to-step noise of a fitted profile."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.records import RequestRecord, RoundRecord
from specledger.simulate.arrivals import closed_loop
from specledger.simulate.chains import ChainTable, Draws, keyed_uniforms
from specledger.simulate.profile import SLOT_TERM, fit_serving_cost
from specledger.simulate.simulator import simulate
from tests.test_simulate import LinearCost, chains


def test_keyed_uniforms_depend_on_key_round_and_position_only():
    keys, rounds = np.array([3, 7, 3]), np.array([0, 5, 0])
    wide = keyed_uniforms(11, keys, rounds, 8)
    narrow = keyed_uniforms(11, keys[1:2], rounds[1:2], 3)
    assert wide.shape == (2, 3, 8)
    np.testing.assert_array_equal(narrow[:, 0], wide[:, 1, :3])  # other rows and the width do not matter
    np.testing.assert_array_equal(wide[:, 0], wide[:, 2])  # same key and round: same draws
    assert not np.array_equal(keyed_uniforms(12, keys, rounds, 8), wide)  # the seed matters
    assert not np.array_equal(keyed_uniforms(11, keys, rounds + 1, 8), wide)  # the round matters
    u = keyed_uniforms(0, np.arange(20_000), np.zeros(20_000, dtype=np.int64), 4).ravel()
    assert 0.0 <= u.min() and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002  # uniform moments
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(0, 2**31), st.lists(st.integers(0, 50), min_size=1, max_size=12))
def test_sampling_is_prefix_consistent_in_gamma(g, seed, rounds):
    """Asked g < G candidates, the outcome is the G outcome cut at g: P_g = min(P_G, g), K_g = min(K_G, P_g)."""
    t = ChainTable.from_chains(chains(n=12, seed=seed % 1000), 16)
    t.fill[:] = 0.8  # the drafter sometimes proposes fewer than asked
    b = len(rounds)
    idx, keys, r = np.arange(b) % t.size, np.arange(b) * 7, np.array(rounds)
    d = Draws(seed)
    p_big, k_big = t.sample(idx, np.full(b, 8), d, keys, r)
    p, k = t.sample(idx, np.full(b, g), d, keys, r)
    np.testing.assert_array_equal(p, np.minimum(p_big, g))
    np.testing.assert_array_equal(k, np.minimum(k_big, p))


def test_keyed_sampling_has_the_chain_distribution():
    """E[K] from keyed draws equals sum_j prod_(i<=j) a_i (fill 1)."""
    t = ChainTable.from_chains(chains(n=1, seed=3), 16)
    n = 40_000
    _, k = t.sample(np.zeros(n, dtype=np.int64), np.full(n, 4), Draws(5), np.arange(n), np.zeros(n, dtype=np.int64))
    expected = np.cumprod(t.accept[0, :4]).sum()
    assert abs(k.mean() - expected) < 4 * k.std() / np.sqrt(n)


def test_per_prompt_draws_make_replays_of_one_prompt_finish_together():
    t = ChainTable.from_chains(chains(n=1, seed=1, out=(40, 41)), 16)
    order = np.zeros(8, dtype=np.int64)  # eight requests replaying one measured prompt
    per_prompt = simulate(t, closed_loop(8), 8, LinearCost(), 4, order=order, per="prompt").ledger
    per_request = simulate(t, closed_loop(8), 8, LinearCost(), 4, order=order, per="request").ledger
    assert len(set(per_prompt.t_last.tolist())) == 1  # lockstep: the same rounds, the same steps
    assert len(set(per_request.t_last.tolist())) > 1
    with pytest.raises(Exception, match="keyed per"):
        Draws(0, "step")


def _records(slot_factor: dict[int, float], jitter: float = 0.0, seed: int = 0) -> list[RequestRecord]:
    """Serving-like records: prefill = (20 ms + 1 ms/token) x slot_factor[S]; rounds of one request at a time."""
    rng = np.random.default_rng(seed)
    out = []
    for s, f in slot_factor.items():
        for i, p in enumerate((40, 80, 160, 240, 320) * 3):
            rds = []
            for j in range(30):
                t = (0.03 + 0.002 * 3) * (1 + jitter * rng.standard_normal()) + 1e-9 * (i * 100 + j)  # unique steps
                rds.append(RoundRecord("ngram", 2, 2, 1, 2, False, 1e-5, t, 1e-4, p + 2 * j, 1))
            n = 1 + 2 * len(rds)
            times = list(np.linspace(0.1, 1.0, n))
            out.append(RequestRecord(f"s{s}-{i}", "ngram", 2, 0.0, 1.0, 0, 0, p, n, "", [], "length",
                                     (0.02 + 0.001 * p) * f, times[0], times[-1], times, [1] + [2] * len(rds),
                                     rds, "code", f"p{i}", extra={"kind": "concurrency", "load": s, "slots": s,
                                                                  "setting": "ngram γ=2", "repeat": 0}))
    return out


def test_prefill_fit_learns_the_slot_count_only_when_the_run_varies_it():
    cost = fit_serving_cost(_records({1: 1.0, 4: 1.1, 16: 1.2}))
    assert SLOT_TERM in cost.prefill.terms
    assert cost.prefill_s(200, slots=16) / cost.prefill_s(200, slots=1) == pytest.approx(1.2, rel=0.03)
    assert cost.prefill_s(200, slots=4) / cost.prefill_s(200, slots=1) == pytest.approx(1.1, rel=0.03)
    one = fit_serving_cost(_records({8: 1.0}))
    assert SLOT_TERM not in one.prefill.terms
    assert one.prefill_s(200, slots=1) == pytest.approx(one.prefill_s(200, slots=64))


def test_step_noise_is_the_measured_step_to_step_jitter():
    steady = fit_serving_cost(_records({4: 1.0}, jitter=0.0))
    noisy = fit_serving_cost(_records({4: 1.0}, jitter=0.05, seed=1))
    q = np.interp([0.1, 0.9], np.linspace(0, 1, 101), noisy.forward_ratios)
    assert 0.90 < q[0] < 0.96 and 1.04 < q[1] < 1.10  # ~N(1, 0.05): P10/P90 at 1 -/+ 0.064
    assert np.interp([0.01, 0.99], np.linspace(0, 1, 101), steady.forward_ratios) == pytest.approx([1, 1], abs=1e-3)


def test_chains_per_gamma_use_the_rounds_measured_at_that_gamma():
    from specledger.simulate.measured_run import tables_per_gamma
    from tests.test_simulate import _record

    recs = [_record(f"p{i}", "ngram", 2, [(2, 2)] * 10) for i in range(3)]  # γ=2: everything accepted
    recs += [_record(f"p{i}", "ngram", 4, [(4, 0)] * 10) for i in range(3)]  # γ=4: nothing accepted
    per = tables_per_gamma(recs, "ngram", [0, 2, 4, 8, "goodput"], 16)
    pooled = tables_per_gamma(recs, "ngram", [2, 4], 16, chains="pooled")
    assert per[2][0].accept[:, 0] == pytest.approx(1.0)
    assert per[4][0].accept[:, 0] == pytest.approx(0.0)
    assert "γ=4 only" in per[4][0].assumption
    assert per[8] is per["goodput"] is per[0]  # unmeasured gamma and policies: every static gamma pooled
    assert 0.0 < per[8][0].accept[0, 0] < 1.0
    assert pooled[2] is pooled[4]
    with pytest.raises(Exception, match="per-gamma or pooled"):
        tables_per_gamma(recs, "ngram", [2], 16, chains="mine")
