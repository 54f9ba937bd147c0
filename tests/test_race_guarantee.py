"""The decisions' guarantee under the race's many looks (issue 47): every paired interval is a confidence sequence
(:mod:`specledger.analysis.sequential`), so over a whole race two settings of equal speed are called different, or
speculation that pays is called off, with probability at most α; the per-look t interval before it was not.

Simulated races (tests/race_sim.py) use the documented per-prompt spread, the real race loop
(:func:`specledger.mainjob.race.race`: 2 initial prompts, 2 more per round, at most 48) and the real decision rule
(:func:`specledger.gates.verdicts.verdicts`). ``benchmarks/bench_race_guarantee.py`` prints the same figures for
more races and spreads."""

from __future__ import annotations

import math
import statistics

import numpy as np
import race_sim as rs

from specledger.analysis.paired import RatioInterval, t_quantile
from specledger.analysis.sequential import MIXTURE_RHO2, cs_multiplier
from specledger.gates.slo import SLO
from specledger.gates.verdict_rules import prompts_to_settle

ALPHA = SLO().decision_alpha


def _binomial_ceiling(p: float, n: int) -> float:
    """``p + 3·√(p(1 − p)/n)``: what an observed rate of n trials may reach when the true rate is at most p."""
    return p + 3 * math.sqrt(p * (1 - p) / n)


def test_the_multiplier_is_lais_mixture_inverted_and_tends_to_the_robbins_boundary():
    """On the boundary x̄ − m_n·s/√n the scale-invariant mixture martingale equals 1/α exactly; below 4 prompts
    it cannot reach 1/α at all; for large n the multiplier is the asymptotic CS's Robbins normal mixture; it is
    wider than the per-look t everywhere (the price of looking at every round)."""
    rng = np.random.default_rng(7)
    for n in (4, 6, 10, 48, 500):
        x = rng.normal(size=n)
        mu = x.mean() - cs_multiplier(n, ALPHA) * x.std(ddof=1) / math.sqrt(n)
        y = x - mu
        growth = (1 + n * MIXTURE_RHO2) ** -0.5 * (1 - MIXTURE_RHO2 * y.sum() ** 2
                                                  / ((1 + n * MIXTURE_RHO2) * (y @ y))) ** (-n / 2)
        assert math.isclose(growth, 1 / ALPHA, rel_tol=1e-6), (n, growth)
    assert all(cs_multiplier(n, ALPHA) == math.inf for n in (0, 1, 2, 3))
    n = 10**6
    robbins = math.sqrt((1 + n * MIXTURE_RHO2) / (n * MIXTURE_RHO2) * 2 * math.log(math.sqrt(1 + n * MIXTURE_RHO2)
                                                                                  / ALPHA))
    assert math.isclose(cs_multiplier(n, ALPHA), robbins, rel_tol=1e-3)
    assert all(cs_multiplier(n, ALPHA) > t_quantile(1 - ALPHA, n - 1) for n in range(4, 200))


def test_normal_per_prompt_values_leave_the_sequence_at_most_alpha_over_every_look():
    """20,000 paths of 48 normal values, every n from 2 to 48 looked at: the mean ever outside its interval in at
    most α of them; the per-look t interval (two-sided 1 − α at each look) misses in far more."""
    rng = np.random.default_rng(11)
    paths, horizon = 20_000, 48
    x = rng.normal(size=(paths, horizon))
    n = np.arange(1, horizon + 1)
    mean = np.cumsum(x, axis=1) / n
    sd = np.sqrt(np.maximum(np.cumsum(x * x, axis=1) - n * mean**2, 0) / np.maximum(n - 1, 1))
    se = sd[:, 1:] / np.sqrt(n[1:])
    cs = np.array([cs_multiplier(int(k), ALPHA) for k in n[1:]])
    per_look = np.array([t_quantile(1 - ALPHA / 2, int(k) - 1) for k in n[1:]])
    missed = (np.abs(mean[:, 1:]) > cs * se).any(axis=1).mean()
    missed_per_look = (np.abs(mean[:, 1:]) > per_look * se).any(axis=1).mean()
    assert missed <= ALPHA, missed
    assert missed_per_look > 4 * ALPHA, missed_per_look


def test_races_of_equal_settings_call_them_different_at_most_alpha_and_the_per_look_t_did_not():
    """1,000 races of two settings of equal speed (S 1.10 each): a "winner" (one called faster) or "off"
    (speculation called not worth it) at most α, with a binomial allowance; the rule before (Student's t at
    1 − α per look) on 400 of the same races called one of them far more often."""
    data = rs.draw(1.10, 1.10, 1000, seed=47)
    new = [rs.one_race(data, r) for r in range(1000)]
    undo = rs.with_multiplier(rs.per_look_t)
    try:
        old = [rs.one_race(data, r) for r in range(400)]
    finally:
        undo()
    rate, rate_old = rs.false_calls(new), rs.false_calls(old)
    print(f"false winner/off calls, equal settings: confidence sequence {rate:.3f} (1,000 races), "
          f"per-look t {rate_old:.3f} (400 races)")
    assert rate <= _binomial_ceiling(ALPHA, 1000), rate
    assert rate_old > ALPHA and rate_old > rate, (rate_old, rate)


def test_races_of_settings_10_percent_apart_find_the_faster_one_most_of_the_time():
    """300 races of S 1.21 against S 1.10: the faster setting is deployed as the winner within the race's
    48 prompts most of the time, and nothing else is ever called."""
    data = rs.draw(1.21, 1.10, 300, seed=48)
    out = [rs.one_race(data, r) for r in range(300)]
    found = [o.prompts for o in out if o.resolution == "winner" and o.setting == rs.A.name]
    print(f"10 % apart: winner found in {len(found) / len(out):.3f} of races, median "
          f"{statistics.median(found):.0f} prompts")
    assert len(found) / len(out) > 0.5
    assert not [o for o in out if o.resolution != "open" and o.setting != rs.A.name]


def test_prompts_to_settle_follows_the_sequence_multiplier():
    """The estimate is the first k at which the sequence's half-width, at today's spread, fits the room."""
    iv = RatioInterval(1.02, 1.02 * math.exp(-0.08), 1.02 * math.exp(0.08), 8)
    k = prompts_to_settle(iv, 0.05)
    sd = 0.08 * math.sqrt(8) / cs_multiplier(8, ALPHA)
    room = math.log(1.05) - math.log(1.02)
    assert cs_multiplier(k, ALPHA) * sd / math.sqrt(k) <= room < cs_multiplier(k - 1, ALPHA) * sd / math.sqrt(k - 1)
