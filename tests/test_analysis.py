"""Analysis against hand computation on synthetic traces with known K patterns and round costs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import plain_rounds, request_from_rounds, spec_rounds

from specledger.analysis import (
    analyze_run,
    analyze_scenario,
    conditional_acceptance,
    curve_best_gamma,
    describe_cost,
    k_histogram,
    latency_stats,
    paired_speedup_bootstrap,
    round_stats,
    totals,
    verify_points,
)
from specledger.analysis.scenario import ScenarioKey, key_of
from specledger.records import RoundRecord

KEY = ScenarioKey("code", 0.0, "ngram", 2)


def _spec(pid: str, t_prefill: float = 0.0, pattern=(0, 1, 2, 2)):
    """γ=2, K pattern 0,1,2,2 -> 9 tokens in 4 rounds of 2 + 12 + 1 = 15 ms."""
    return request_from_rounds(
        f"s-{pid}",
        pid,
        spec_rounds("ngram", 2, list(pattern), 0.002, 0.012, 0.001),
        category="code",
        t_prefill=t_prefill,
    )


def _base(pid: str, t_prefill: float = 0.0, n: int = 9):
    return request_from_rounds(f"b-{pid}", pid, plain_rounds(n, 0.010), category="code", t_prefill=t_prefill)


def test_tokens_per_second_comes_from_totals_not_the_mean_of_request_speeds():
    fast = request_from_rounds("a", "p0", plain_rounds(10, 0.01))  # 10 tokens in 0.1 s: 100 tok/s
    slow = request_from_rounds("b", "p1", plain_rounds(90, 0.1))  # 90 tokens in 9 s: 10 tok/s
    t = totals([fast, slow])
    assert t["tokens_per_s"] == pytest.approx(100 / 9.1)
    assert t["mean_of_request_speeds"] == pytest.approx(55.0)


def test_el_acceptance_chain_and_histogram_exclude_truncated_rounds():
    rounds = spec_rounds("ngram", 2, [0, 1, 2, 2, 2], 0.002, 0.012, 0.001, truncate_last_to=1)
    stats = round_stats([request_from_rounds("r", "p", rounds)])
    assert stats["el_full"] == pytest.approx((1 + 2 + 3 + 3) / 4)
    assert stats["truncated_rounds"] == 1
    assert stats["committed_in_rounds"] == 10
    chain = conditional_acceptance(rounds)
    assert [c["a"] for c in chain] == pytest.approx([3 / 4, 2 / 3])
    assert [c["per_position_rate"] for c in chain] == pytest.approx([3 / 4, 2 / 4])
    assert k_histogram(rounds) == [1, 1, 2]
    assert stats["el_chain"] == pytest.approx(1 + 3 / 4 + 3 / 4 * 2 / 3)
    assert stats["acceptance_rate"] == pytest.approx(5 / 8)


def test_conditional_acceptance_only_counts_rounds_that_proposed_the_position():
    # A model-free drafter proposing 1 candidate cannot reject position 2.
    rounds = spec_rounds("ngram", 2, [1, 1, 0, 2], 0.0, 0.01, proposed=[1, 1, 2, 2])
    chain = conditional_acceptance(rounds)
    assert chain[0]["a"] == pytest.approx(3 / 4)
    assert chain[1]["at_risk"] == 1 and chain[1]["a"] == pytest.approx(1.0)


def test_speedup_and_predicted_speedup_match_hand_computation():
    spec = [_spec(f"p{i}") for i in range(5)]
    base = [_base(f"p{i}") for i in range(5)]
    s = analyze_scenario(KEY, spec, base)
    # spec: 9 tokens / 60 ms = 150 tok/s; plain: 9 / 90 ms = 100 tok/s.
    assert s["speedup"] == pytest.approx(1.5)
    assert s["speedup_ci"] == pytest.approx([1.5, 1.5])
    assert s["t0_ms"] == pytest.approx(10.0)
    rec = s["reconciliation"]
    assert rec["predicted_speedup"] == pytest.approx(10 * 2.25 / 15)
    assert rec["residual"] == pytest.approx(0.0, abs=1e-12)
    assert s["why"] == []


def test_prefill_explains_the_residual_between_predicted_and_measured():
    spec = [_spec(f"p{i}", t_prefill=0.03) for i in range(3)]
    base = [_base(f"p{i}", t_prefill=0.03) for i in range(3)]
    rec = analyze_scenario(KEY, spec, base)["reconciliation"]
    measured = (9 / 0.09) / (9 / 0.12)
    assert rec["measured_speedup"] == pytest.approx(measured)
    assert rec["predicted_speedup"] == pytest.approx(1.5)
    assert rec["outside_rounds_factor"] == pytest.approx(measured / 1.5)
    assert rec["prefill_share_spec"] == pytest.approx(0.03 / 0.09)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=2, max_size=12),
    st.floats(0.0, 0.05),
    st.floats(0.001, 0.01),
)
def test_predicted_times_factors_equals_measured(pattern, prefill, t_draft):
    """measured S = predicted S × boundary factor × outside-rounds factor, exactly."""
    rounds = spec_rounds("ngram", 3, pattern, t_draft, 0.012, 0.001, truncate_last_to=1)
    spec = [request_from_rounds("s", "p", rounds, category="code", t_prefill=prefill)]
    base = [_base("p", t_prefill=prefill, n=7)]
    rec = analyze_scenario(ScenarioKey("code", 0.0, "ngram", 3), spec, base)["reconciliation"]
    if rec["predicted_speedup"] is None:  # only the truncated round: nothing to predict from
        return
    product = rec["predicted_speedup"] * rec["boundary_factor"] * rec["outside_rounds_factor"]
    assert product == pytest.approx(rec["measured_speedup"], rel=1e-9)


def test_paired_bootstrap_is_seeded_and_brackets_a_proportional_pairing():
    rng = np.random.default_rng(1)
    bt = rng.integers(10, 100, 30).astype(float)
    bs = bt * rng.uniform(0.01, 0.02, 30)
    st_, ss = bt, bs / 2.0  # exactly twice as fast on every prompt
    point, low, high = paired_speedup_bootstrap(st_, ss, bt, bs, n_resamples=300, seed=3)
    assert (point, low, high) == pytest.approx((2.0, 2.0, 2.0))
    noisy = ss * rng.uniform(0.8, 1.2, 30)
    a = paired_speedup_bootstrap(st_, noisy, bt, bs, n_resamples=300, seed=3)
    b = paired_speedup_bootstrap(st_, noisy, bt, bs, n_resamples=300, seed=3)
    assert a == b and a[1] < a[0] < a[2]


def test_latency_stats_ttft_tpot_itl_and_stall():
    # rounds of 10 ms committing 3, 1, 2 tokens after a 5 ms prefill
    rounds = spec_rounds("ngram", 2, [2, 0, 1], 0.0, 0.010)
    lat = latency_stats([request_from_rounds("r", "p", rounds, t_prefill=0.005)])
    assert lat["ttft_ms"]["p50"] == pytest.approx(15.0)
    assert lat["tpot_ms"]["p50"] == pytest.approx(20.0 / 5)
    assert lat["itl_chunk_ms"]["n"] == 2 and lat["itl_chunk_ms"]["max"] == pytest.approx(10.0)
    assert lat["itl_token_ms"]["n"] == 5 and lat["itl_token_ms"]["p50"] == pytest.approx(0.0)
    assert lat["longest_stall_ms"] == pytest.approx(10.0)
    assert lat["tokens_per_chunk"]["mean"] == pytest.approx(2.0)


def _verify_rounds(coef, interaction=0.0):
    out = []
    for n in range(0, 9):
        for ctx in (50, 200, 800, 1600):
            t = coef[0] + coef[1] * n + coef[2] * ctx + interaction * n * ctx
            out.append(RoundRecord("m", max(n, 1), n, 0, 1, False, 0.001 + 0.0005 * max(n, 1), t, 0.0, ctx))
    return out


def test_cost_table_scores_the_one_run_cost_model_per_drafter():
    from specledger.cost.costmodel import fit_cost_model
    from specledger.cost.surface import CostSurface, SurfacePoint

    records = [request_from_rounds("s", "p", _verify_rounds((0.005, 0.001, 1e-5)), category="code")]
    linear = fit_cost_model(records, n_boot=0)  # no surface: the linear form, exact on this data
    table = describe_cost(linear, "m", records[0].rounds)
    assert table["verify"]["r2"] == pytest.approx(1.0) and table["verify"]["rms_ms"] == pytest.approx(0, abs=1e-6)
    assert "no measured surface" in table["verify"]["form"] and table["verify"]["n_obs"] == 36
    assert table["draft"]["r2"] == pytest.approx(1.0)  # t_draft = 1 ms + 0.5 ms per candidate asked
    pts = verify_points(linear, records[0].rounds)
    assert [p["n"] for p in pts] == list(range(9))
    assert all(p["fit_verify_ms"] == pytest.approx(p["t_verify_ms"]) for p in pts)
    # with a surface, the verify row is the surface's shape times one level: priced by the same object
    surface = CostSurface([SurfacePoint(1, r, c, 0.005 + 0.001 * (r - 1) + 1e-5 * c) for r in range(1, 10)
                           for c in (50, 1600)], "test")
    on_surface = fit_cost_model(records, n_boot=0, surface=surface)
    row = describe_cost(on_surface, "m", records[0].rounds)["verify"]
    assert "Σ" in row["form"] and row["coef"]["surface"] == pytest.approx(1.0, rel=1e-3)


def _a08_histograms():
    """K histograms whose pooled conditional acceptance is exactly 0.8 at every position."""
    return {1: [1, 4], 2: [5, 4, 16], 4: [125, 100, 80, 64, 256]}


def _a08_run():
    records = [request_from_rounds("b", "p", plain_rounds(50, 0.010), category="code")]
    for gamma, hist in _a08_histograms().items():
        ks = [k for k, c in enumerate(hist) for _ in range(c)]
        # draft 2 ms per candidate, verify 10 ms + 1 ms per candidate: T_round = 10 + 3γ ms
        rounds = spec_rounds("m", gamma, ks, 0.002 * gamma, 0.010 + 0.001 * gamma)
        records.append(request_from_rounds(f"s{gamma}", "p", rounds, category="code"))
    return records


def test_optimal_gamma_from_fitted_costs_and_measured_chain():
    records = _a08_run()
    run = analyze_run(records)
    (opt,) = run["optimal_gamma"]
    assert opt["predicted_best_gamma"] == 3
    assert opt["measured_best_gamma"] == 4 and opt["agree"] is False


def test_best_gamma_is_zero_when_nothing_pays():
    curve = [{"gamma": 0, "speedup": 1.0}, {"gamma": 1, "speedup": 0.7}, {"gamma": 2, "speedup": math.nan}]
    assert curve_best_gamma(curve) == 0


def test_one_optimal_gamma_ties_to_the_smaller_gamma_and_never_picks_nan():
    from specledger.ledger.speedup import best_gamma, best_point

    assert best_point([(1, 1.2), (2, math.nan), (3, 1.2), (4, 1.1)]) == (1, 1.2)
    assert best_gamma([(4, 1.3), (2, 1.3)]) == 2 and best_gamma([(0, math.nan), (3, math.nan)]) == 0


def test_measured_speedup_is_the_ledgers_s_and_nan_without_full_rounds():
    from specledger.ledger.speedup import speedup, speedup_or_nan

    assert speedup_or_nan(10.0, 2.5, 12.5) == speedup(10.0, 2.5, 12.5) == 2.0
    assert math.isnan(speedup_or_nan(10.0, math.nan, 12.5)) and math.isnan(speedup_or_nan(10.0, 2.5, 0.0))


def test_why_names_draft_cost_when_drafting_eats_the_gain():
    spec = [request_from_rounds("s", "p", spec_rounds("big", 2, [2, 2, 2], 0.030, 0.011), category="code")]
    base = [_base("p", n=9)]
    s = analyze_scenario(ScenarioKey("code", 0.0, "big", 2), spec, base)
    assert s["speedup"] < 1
    assert s["why"] and "Main cause: draft cost" in s["why"][-1]
    assert "slows down" in s["why"][0]


def test_why_blames_low_el_when_nothing_is_accepted():
    spec = [request_from_rounds("s", "p", spec_rounds("ng", 2, [0] * 9, 0.0001, 0.0105), category="code")]
    s = analyze_scenario(ScenarioKey("code", 0.0, "ng", 2), spec, [_base("p")])
    assert "low E[L]" in s["why"][-1]


def test_scenarios_are_paired_by_prompt_and_baseline_gamma_normalised():
    spec = [_spec("p0"), _spec("p1"), _spec("only-spec")]
    base = [_base("p0"), _base("p1"), _base("only-base", n=90)]
    s = analyze_scenario(KEY, spec, base)
    assert s["paired_prompts"] == 2 and s["speedup"] == pytest.approx(1.5)
    assert key_of(base[0]).gamma == 0 and key_of(base[0]).is_baseline


def test_analyze_run_reports_unpaired_scenarios():
    run = analyze_run([_spec("p0")])
    assert run["unpaired"] == [KEY.label]
    assert run["scenarios"][0]["speedup"] is None
