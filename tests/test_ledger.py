"""The exact ledger: E[L], conversions, costs, optimal γ, trees, memory, quantization."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.errors import SpecLedgerError
from specledger.ledger import (
    SMOLLM2_135M,
    ExpressionCostModel,
    TableCostModel,
    TreeNode,
    best_tree,
    candidate_kv_bytes,
    chain_shape,
    compare_quant_and_spec,
    compare_speed_averages,
    conditional_from_histogram,
    conditional_from_survival,
    depth_vs_width,
    draft_acceptance_rate,
    expected_length_constant,
    expected_length_from_chain,
    expected_length_from_histogram,
    expected_length_from_sglang_accept_length,
    expected_length_of_shape,
    expected_tree_length,
    histogram_from_conditional,
    histogram_from_observations,
    histogram_from_per_position,
    kary_shape,
    kv_shape_from_config,
    ledger_row,
    length_with_bonus,
    length_without_bonus,
    leviathan_improvement_factor,
    load_kv_shape,
    marginal_gain_constant,
    marginal_gain_from_chain,
    marginal_table,
    mean_accepted_from_sglang_accept_length,
    optimal_gamma,
    parse_cost_expression,
    parse_cost_model,
    per_position_from_conditional,
    per_position_from_counts,
    per_request_mean_accepted,
    pooled_mean_accepted,
    positional_from_sibling_conditionals,
    probabilities_from_histogram,
    round_time_ms,
    speculation_memory,
    speed_from_totals,
    speedup,
    survival_from_chain,
    survival_from_histogram,
    unweighted_mean_speed,
    vllm_mean_acceptance_length,
)
from specledger.ledger.speedup import SplitCostModel, break_even_round_ms, ms_per_token
from specledger.ledger.trees import count_nodes, tree_depth, width_per_depth

probability = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
chains = st.lists(probability, min_size=0, max_size=12)
histograms = st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=12).filter(
    lambda c: sum(c) > 0
)


# --------------------------------------------------------------------------- E[L] properties


@given(chains)
def test_expected_length_is_between_one_and_gamma_plus_one(chain):
    length = expected_length_from_chain(chain)
    assert 1.0 - 1e-12 <= length <= len(chain) + 1 + 1e-12


@given(chains.filter(bool), st.data())
def test_expected_length_is_monotone_in_every_conditional_acceptance(chain, data):
    index = data.draw(st.integers(min_value=0, max_value=len(chain) - 1))
    raised = data.draw(st.floats(min_value=chain[index], max_value=1.0))
    higher = list(chain)
    higher[index] = raised
    assert expected_length_from_chain(higher) >= expected_length_from_chain(chain) - 1e-12


@given(probability, st.integers(min_value=0, max_value=40))
def test_constant_chain_equals_closed_form(a, gamma):
    assert expected_length_from_chain([a] * gamma) == pytest.approx(
        expected_length_constant(a, gamma), rel=1e-9
    )


def test_closed_form_limit_at_full_acceptance_and_seed_asserts():
    assert expected_length_constant(1.0, 7) == 8.0
    assert expected_length_constant(0.999999, 7) == pytest.approx(8.0, rel=1e-5)
    assert expected_length_from_chain([0.0] * 4) == 1.0
    assert expected_length_from_chain([1.0] * 4) == 5.0


def test_no_independence_assumed_chain_rule():
    # Pr(K>=1)=0.9, Pr(K>=2)=0.9*0.5, Pr(K>=3)=0.9*0.5*1.0
    assert survival_from_chain([0.9, 0.5, 1.0]) == pytest.approx([0.9, 0.45, 0.45])
    assert expected_length_from_chain([0.9, 0.5, 1.0]) == pytest.approx(1 + 0.9 + 0.45 + 0.45)


@given(probability, st.integers(min_value=0, max_value=30))
def test_marginal_gain_is_next_tail_probability(a, gamma):
    gain = marginal_gain_constant(a, gamma)
    assert gain == pytest.approx(a ** (gamma + 1))
    diff = expected_length_constant(a, gamma + 1) - expected_length_constant(a, gamma)
    assert gain == pytest.approx(diff, abs=1e-9)


@given(st.lists(probability, min_size=1, max_size=10))
def test_marginal_gain_from_chain_is_increment_of_expected_length(chain):
    gamma = len(chain) - 1
    diff = expected_length_from_chain(chain) - expected_length_from_chain(chain[:gamma])
    assert marginal_gain_from_chain(chain, gamma) == pytest.approx(diff, abs=1e-12)


def test_seed_marginal_example_eighth_candidate():
    assert marginal_gain_constant(0.8, 0) == pytest.approx(0.8)
    assert marginal_gain_constant(0.8, 7) == pytest.approx(0.168, abs=5e-4)


# --------------------------------------------------------------------------- histograms and conversions


@given(histograms)
def test_histogram_mean_equals_tail_sum(counts):
    mean = expected_length_from_histogram(counts)
    assert mean == pytest.approx(1 + sum(survival_from_histogram(counts)), rel=1e-9)
    assert mean == pytest.approx(expected_length_from_chain(conditional_from_histogram(counts)), rel=1e-9)


def test_histogram_mean_by_hand():
    # K = 0 twice, K = 2 once, K = 3 once: mean K+1 = (1+1+3+4)/4
    assert expected_length_from_histogram([2, 0, 1, 1]) == pytest.approx(9 / 4)
    assert histogram_from_observations([0, 3, 2, 0], gamma=3) == [2, 0, 1, 1]


@given(chains)
def test_conditional_to_per_position_round_trip(chain):
    rates = per_position_from_conditional(chain)
    back = conditional_from_survival(rates)
    assert per_position_from_conditional(back) == pytest.approx(rates, abs=1e-12)
    if all(a > 1e-6 for a in chain):
        assert back == pytest.approx(list(chain), rel=1e-9, abs=1e-12)


@given(chains)
def test_conditional_to_histogram_round_trip(chain):
    probs = histogram_from_conditional(chain)
    assert len(probs) == len(chain) + 1
    assert sum(probs) == pytest.approx(1.0)
    assert survival_from_histogram(probs) == pytest.approx(survival_from_chain(chain), abs=1e-9)
    weighted = sum((k + 1) * p for k, p in enumerate(probs))
    assert weighted == pytest.approx(expected_length_from_chain(chain), abs=1e-9)


@given(histograms)
def test_histogram_to_per_position_round_trip(counts):
    probs = probabilities_from_histogram(counts)
    rates = survival_from_histogram(counts)
    assert histogram_from_per_position(rates) == pytest.approx(probs, abs=1e-9)


def test_vllm_per_position_counts():
    # 100 drafts; 80 accepted position 1, 60 position 2, 45 position 3
    rates = per_position_from_counts([80, 60, 45], 100)
    assert rates == pytest.approx([0.8, 0.6, 0.45])
    assert conditional_from_survival(rates) == pytest.approx([0.8, 0.75, 0.75])
    assert histogram_from_per_position(rates) == pytest.approx([0.2, 0.2, 0.15, 0.45])
    # vLLM's mean acceptance length = 1 + accepted/drafts = 1 + Σ per-position rates
    assert vllm_mean_acceptance_length(80 + 60 + 45, 100) == pytest.approx(1 + sum(rates))


def test_conditional_after_a_zero_is_reported_as_zero():
    assert conditional_from_survival([0.5, 0.0, 0.0]) == [0.5, 0.0, 0.0]


def test_bonus_token_conversions():
    assert length_with_bonus(1.5) == 2.5
    assert length_without_bonus(2.5) == 1.5
    assert expected_length_from_sglang_accept_length(3.2) == 3.2
    assert mean_accepted_from_sglang_accept_length(3.2) == pytest.approx(2.2)
    assert draft_acceptance_rate(185, 300) == pytest.approx(185 / 300)
    with pytest.raises(SpecLedgerError):
        expected_length_from_sglang_accept_length(0.5)


def test_pooled_and_per_request_means_differ_and_are_both_available():
    accepted, drafts = [90, 1], [30, 10]  # a long easy request and a short hard one
    assert pooled_mean_accepted(accepted, drafts) == pytest.approx(91 / 40)
    assert per_request_mean_accepted(accepted, drafts) == pytest.approx((3.0 + 0.1) / 2)
    assert pooled_mean_accepted(accepted, drafts) != pytest.approx(
        per_request_mean_accepted(accepted, drafts)
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: expected_length_from_chain([0.5, 1.5]),
        lambda: expected_length_from_chain([-0.1]),
        lambda: expected_length_from_chain([float("nan")]),
        lambda: expected_length_constant(0.8, -1),
        lambda: expected_length_from_histogram([]),
        lambda: expected_length_from_histogram([0, 0, 0]),
        lambda: expected_length_from_histogram([3, -1]),
        lambda: conditional_from_survival([0.5, 0.7]),
        lambda: per_position_from_counts([1], 0),
        lambda: pooled_mean_accepted([1, 2], [3]),
        lambda: histogram_from_observations([4], gamma=3),
    ],
)
def test_bad_inputs_raise_one_line_user_errors(call):
    with pytest.raises(SpecLedgerError) as info:
        call()
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- costs and the seed's example

SEED_LENGTHS = {1: 1.8, 2: 2.44, 4: 3.362, 8: 4.329}
SEED_CHEAP = {1: 1.667, 2: 2.068, 4: 2.334, 8: 1.968}
SEED_COSTLY = {1: 1.139, 2: 1.052, 4: 0.785, 8: 0.428}


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_seed_worked_example(gamma):
    cheap = parse_cost_model("10+0.7*k+0.1*k^2")
    costly = parse_cost_model("10+5*k+0.8*k^2")
    chain = [0.8] * 8
    cheap_row = ledger_row(chain, gamma, 10.0, cheap)
    costly_row = ledger_row(chain, gamma, 10.0, costly)
    assert round(cheap_row.expected_length, 3) == SEED_LENGTHS[gamma]
    assert round(cheap_row.speedup, 3) == SEED_CHEAP[gamma]
    assert round(costly_row.speedup, 3) == SEED_COSTLY[gamma]
    assert cheap_row.pays
    assert costly_row.pays == (SEED_COSTLY[gamma] > 1)


def test_speedup_and_break_even_definitions():
    assert round_time_ms(2.0, 9.0, 1.0) == 12.0
    assert break_even_round_ms(10.0, 2.44) == pytest.approx(24.4)
    assert speedup(10.0, 2.44, 24.4) == pytest.approx(1.0)
    assert ms_per_token(11.8, 2.44) == pytest.approx(11.8 / 2.44)
    with pytest.raises(SpecLedgerError):
        speedup(0.0, 2.0, 10.0)
    with pytest.raises(SpecLedgerError):
        round_time_ms(-1.0, 5.0)


@pytest.mark.parametrize(
    ("alpha", "gamma", "expected"),
    [(0.6, 2, 1.96), (0.8, 5, 3.69), (0.9, 10, 6.86)],
)
def test_leviathan_improvement_factor_at_zero_cost_ratio(alpha, gamma, expected):
    assert leviathan_improvement_factor(alpha, gamma, 0.0) == pytest.approx(expected, abs=5e-3)


def test_leviathan_matches_ledger_when_verify_is_one_target_step():
    # T_round = γ·c·T0 (draft) + T0 (verify): S = E[L]/(γc+1)
    c, gamma, alpha = 0.05, 4, 0.7
    model = ExpressionCostModel(parse_cost_expression(f"10*{c}*k + 10"))
    row = ledger_row([alpha] * gamma, gamma, 10.0, model)
    assert row.speedup == pytest.approx(leviathan_improvement_factor(alpha, gamma, c))


def test_speed_from_totals_versus_unweighted_mean():
    tokens, seconds = [5, 1], [0.020, 0.005]  # 250 tok/s and 200 tok/s rounds
    assert speed_from_totals(tokens, seconds) == pytest.approx(6 / 0.025)
    assert unweighted_mean_speed(tokens, seconds) == pytest.approx(225.0)
    cmp = compare_speed_averages(tokens, seconds)
    assert cmp.mean_overstates_by == pytest.approx(225 / 240 - 1)


@given(
    st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=20),
    st.floats(min_value=1e-3, max_value=1.0),
)
def test_averages_agree_when_every_round_takes_the_same_time(tokens, t):
    assert speed_from_totals(tokens, [t] * len(tokens)) == pytest.approx(
        unweighted_mean_speed(tokens, [t] * len(tokens))
    )


coefficients = st.floats(min_value=0.0, max_value=20.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(
    probability,
    st.floats(min_value=0.5, max_value=50),
    coefficients,
    coefficients,
    coefficients,
    st.integers(1, 16),
)
def test_optimal_gamma_is_never_worse_than_any_other(a, base, c0, c1, c2, max_gamma):
    model = ExpressionCostModel(parse_cost_expression(f"{c0 + 0.1}+{c1}*k+{c2}*k^2"))
    chain = [a] * max_gamma
    best = optimal_gamma(chain, base, model, max_gamma)
    for gamma in range(max_gamma + 1):
        assert best.best.speedup >= ledger_row(chain, gamma, base, model).speedup - 1e-12
    assert best.best.speedup >= 1.0  # γ = 0 (plain decoding) is always a candidate


def test_optimal_gamma_for_seed_curves_and_marginal_rule():
    cheap = parse_cost_model("10+0.7*k+0.1*k^2")
    costly = parse_cost_model("10+5*k+0.8*k^2")
    assert optimal_gamma([0.8] * 16, 10.0, cheap, 16).best.gamma == 4
    assert optimal_gamma([0.8] * 16, 10.0, costly, 16).best.gamma == 1
    # a draft that costs more than the target: speculation off
    awful = parse_cost_model("30+10*k")
    assert optimal_gamma([0.5] * 8, 10.0, awful, 8).best.gamma == 0
    rows = marginal_table([0.8] * 16, 10.0, cheap, 16)
    assert [r.gamma for r in rows] == list(range(1, 17))
    assert rows[0].delta_length == pytest.approx(0.8)
    assert rows[4].delta_length == pytest.approx(0.8**5)
    # speed rises up to γ = 4 only, although candidates stay "cheaper than plain" up to γ = 7
    assert [r.raises_speedup for r in rows[:5]] == [True, True, True, True, False]
    assert [r.cheaper_than_plain for r in rows[6:8]] == [True, False]


def test_table_cost_model_searches_only_measured_gammas():
    table = parse_cost_model("1:10.8, 2:11.8, 4:14.4, 8:22")
    assert isinstance(table, TableCostModel)
    result = optimal_gamma([0.8] * 8, 10.0, table, 16)
    assert [r.gamma for r in result.searched] == [0, 1, 2, 4, 8]
    assert result.best.gamma == 4
    with pytest.raises(SpecLedgerError, match="no measured round time for γ=3"):
        table.round_ms(3)
    with pytest.raises(SpecLedgerError):
        parse_cost_model("1:10,1:12")


def test_split_cost_model_sums_parts():
    model = SplitCostModel(
        draft=parse_cost_expression("0.5*k"),
        verify=parse_cost_expression("10+0.2*k"),
        other=parse_cost_expression("1"),
    )
    parts = model.split(4)
    assert (parts.draft_ms, parts.verify_ms, parts.other_ms) == pytest.approx((2.0, 10.8, 1.0))
    assert model.round_ms(4) == pytest.approx(13.8)


def test_gamma_beyond_known_acceptance_is_refused():
    with pytest.raises(SpecLedgerError, match="only 3 are known"):
        ledger_row([0.9, 0.8, 0.7], 4, 10.0, parse_cost_model("10+k"))


# --------------------------------------------------------------------------- expressions


@pytest.mark.parametrize(
    ("text", "k", "value"),
    [
        ("10+0.7*k+0.1*k^2", 4, 14.4),
        ("10+0.7*k+0.1*k**2", 4, 14.4),
        ("2*k^2", 3, 18.0),
        ("-k+20", 3, 17.0),
        ("(k+1)*(k-1)/2", 3, 4.0),
        ("12", 9, 12.0),
        ("2^3^2", 0, 512.0),
    ],
)
def test_cost_expressions_evaluate(text, k, value):
    assert parse_cost_expression(text)(k) == pytest.approx(value)


@pytest.mark.parametrize(
    "text",
    [
        "10+__import__('os')",
        "k.real",
        "x+1",
        "abs(k)",
        "k[0]",
        "lambda: 1",
        "k < 3",
        "'a'",
        "True+k",
        "10 +",
        "",
        "k if k else 1",
        "1e308*10",
        "1/(k-2)",
        "(-1)^0.5",
        "k%2",
        "9^9^9^9",
    ],
)
def test_bad_cost_expressions_are_refused_quickly(text):
    started = time.perf_counter()
    with pytest.raises(SpecLedgerError) as info:
        parse_cost_expression(text)(2)
    assert "\n" not in str(info.value)
    assert time.perf_counter() - started < 1.0


def test_error_names_the_problem():
    with pytest.raises(SpecLedgerError, match="function call"):
        parse_cost_expression("10+__import__('os')")
    with pytest.raises(SpecLedgerError, match="the name 'x'"):
        parse_cost_expression("x+1")


# --------------------------------------------------------------------------- trees


def _all_forests(nodes):
    """Every ordered forest with exactly ``nodes`` nodes (children in rank order)."""
    if nodes == 0:
        yield ()
        return
    for first in range(1, nodes + 1):
        for child in _all_forests(first - 1):
            for rest in _all_forests(nodes - first):
                yield (child, *rest)


def test_tree_expected_length_is_sum_of_path_products():
    tree = [TreeNode(0.6, (TreeNode(0.5), TreeNode(0.3))), TreeNode(0.3, (TreeNode(0.9),))]
    assert expected_tree_length(tree) == pytest.approx(1 + 0.6 + 0.6 * 0.5 + 0.6 * 0.3 + 0.3 + 0.3 * 0.9)
    with pytest.raises(SpecLedgerError, match="sum to"):
        expected_tree_length([TreeNode(0.7), TreeNode(0.6)])


@given(probability, st.integers(0, 20))
def test_chain_tree_matches_closed_form(a, nodes):
    assert expected_length_of_shape(chain_shape(nodes), [a]) == pytest.approx(
        expected_length_constant(a, nodes)
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4), st.integers(1, 6))
def test_best_tree_matches_brute_force(conditionals, budget):
    p = positional_from_sibling_conditionals(conditionals)
    brute = max(expected_length_of_shape(shape, p) for shape in _all_forests(budget))
    best = best_tree(p, budget)
    assert best.expected_length == pytest.approx(brute, abs=1e-9)
    assert expected_length_of_shape(best.shape, p) == pytest.approx(best.expected_length, abs=1e-9)
    assert count_nodes(best.shape) <= budget


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4), st.integers(1, 6), st.integers(1, 4))
def test_depth_limited_best_tree_matches_brute_force(conditionals, budget, max_depth):
    p = positional_from_sibling_conditionals(conditionals)
    allowed = [s for s in _all_forests(budget) if tree_depth(s) <= max_depth] + [
        s for n in range(budget) for s in _all_forests(n) if tree_depth(s) <= max_depth
    ]
    brute = max(expected_length_of_shape(shape, p) for shape in allowed)
    best = best_tree(p, budget, max_depth=max_depth)
    assert tree_depth(best.shape) <= max_depth
    assert best.expected_length == pytest.approx(brute, abs=1e-9)


def test_depth_vs_width_best_tree_dominates():
    p = positional_from_sibling_conditionals([0.7] * 16)
    rows = depth_vs_width(p, 16)
    labels = [r.label for r in rows]
    assert labels[0].startswith("chain") and labels[-1] == "best tree (DP)"
    best = rows[-1].expected_length
    assert all(best >= r.expected_length - 1e-12 for r in rows)
    assert all(r.nodes == 16 for r in rows)
    assert best > rows[0].expected_length  # width helps when lower-ranked siblings carry mass


def test_width_is_useless_when_only_the_top_child_can_match():
    rows = depth_vs_width([0.8], 10)
    assert rows[-1].expected_length == pytest.approx(rows[0].expected_length)


def test_kary_shape_fills_breadth_first():
    shape = kary_shape(2, 6)
    assert count_nodes(shape) == 6
    assert width_per_depth(shape) == [2, 4]
    assert width_per_depth(kary_shape(3, 5)) == [3, 2]
    assert positional_from_sibling_conditionals([0.5, 0.5]) == pytest.approx([0.5, 0.25])


def test_tree_rejects_non_exclusive_sibling_vector():
    with pytest.raises(SpecLedgerError, match="sum to"):
        best_tree([0.9, 0.8], 4)


# --------------------------------------------------------------------------- memory and quantization


def test_smollm2_kv_bytes_per_token():
    assert SMOLLM2_135M.bytes_per_token == 30 * 2 * 3 * 64 * 2
    assert load_kv_shape("smollm2") == SMOLLM2_135M


def test_kv_shape_from_hf_config():
    config = {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
    }
    shape = kv_shape_from_config(config)
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.bytes_per_element) == (32, 8, 128, 2)
    assert kv_shape_from_config({**config, "torch_dtype": "float32"}).bytes_per_element == 4
    assert kv_shape_from_config({**config, "head_dim": 96}).head_dim == 96
    no_gqa = {k: v for k, v in config.items() if k != "num_key_value_heads"}
    assert kv_shape_from_config(no_gqa).kv_heads == 32
    with pytest.raises(SpecLedgerError, match="num_hidden_layers"):
        kv_shape_from_config({"num_attention_heads": 4, "hidden_size": 64})


def test_candidate_kv_and_block_rounding():
    m = SMOLLM2_135M.bytes_per_token
    assert candidate_kv_bytes(8, 5, m) == 8 * 5 * m
    assert candidate_kv_bytes(8, 5, m, block_size=16) == 8 * 16 * m
    assert candidate_kv_bytes(8, 17, m, block_size=16) == 8 * 32 * m
    ledger = speculation_memory(
        SMOLLM2_135M, 4, 3, draft=SMOLLM2_135M, draft_parameters=1000, context_tokens=100
    )
    assert ledger.candidate_target_kv == 4 * 3 * m
    assert ledger.draft_weights == 2000
    assert ledger.draft_kv == 4 * 103 * m
    assert ledger.total == ledger.candidate_target_kv + ledger.draft_weights + ledger.draft_kv


def test_four_way_quantization_record_keeps_product_beside_measurement():
    record = compare_quant_and_spec(100.0, 150.0, 200.0, 260.0)
    assert record.quant_speedup == pytest.approx(1.5)
    assert record.spec_speedup == pytest.approx(2.0)
    assert record.combined_speedup == pytest.approx(2.6)
    assert record.product_of_single_speedups == pytest.approx(3.0)
    assert record.interaction == pytest.approx(2.6 / 3.0)
    assert [row[2] for row in record.rows()] == pytest.approx([1.0, 1.5, 2.0, 2.6])
    with pytest.raises(SpecLedgerError):
        compare_quant_and_spec(0.0, 1.0, 1.0, 1.0)


def test_ledger_does_not_import_torch():
    import subprocess
    import sys

    code = "import specledger.ledger, specledger.cli.ledger, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_isclose_sanity_of_seed_lengths():
    for gamma, value in SEED_LENGTHS.items():
        assert math.isclose(round(expected_length_constant(0.8, gamma), 3), value)
    assert len(list(_all_forests(3))) == 5  # Catalan(3): the brute force really enumerates every shape
