"""Forecasts at a tree budget on synthetic records: measured vs DP acceptance, the recursion by hand,
the depth-aware DP, `predict --tree-budget` and `simulate --tree-budget` (sources printed, one-line errors)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from conftest import run_cli
from synthetic import plain_rounds, request_from_rounds

from specledger.ledger.trees import (
    best_tree,
    best_tree_by_depth,
    count_depth_rank,
    expected_length_of_shape,
    survival_by_depth,
)
from specledger.predict.acceptance import AcceptanceModel
from specledger.predict.check import usable
from specledger.predict.tree_forecast import (
    DP_SOURCE,
    MEASURED,
    Sizes,
    TreeAcceptance,
    TreeCosts,
    dp_acceptance,
    measured_acceptance,
    request_seconds,
    tree_acceptance,
    tree_costs,
)
from specledger.records import RoundRecord
from specledger.rundir import META_NAME, TRACE_NAME, append_records, write_json_atomic

# one tree of 8 nodes, depth 4, DFS preorder: 0 -> 1 -> 2 -> 3, 0 -> 4 (rank 1), 5 (root rank 1) -> 6 -> 7
PARENTS = [-1, 0, 1, 2, 0, -1, 5, 6]
PATHS = [[], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [5], [5, 6], [0, 4], [0, 1, 2, 3], [0, 1]]


class FakePricer:
    source = "fake pricer"

    def prefill_s(self, prompt_tokens, slots=1):
        return 0.001 * prompt_tokens

    def round_s(self, rows, context):
        return 0.010 + 0.001 * (rows - 1)

    def step_s(self, total_rows, batch, context):
        return 0.010 * batch + 0.001 * (total_rows - batch)

    def draft_s(self, drafter, gamma, context=0.0):
        return 0.0005 * gamma

    def other_s(self, batch=1):
        return 0.0002 * batch

    def to_dict(self):
        return {}


def _tree_round(path, ctx, premium=1.2):
    rows = len(PARENTS) + 1
    return RoundRecord("ngram", 4, len(PARENTS), len(path), len(path) + 1, False, 0.003,
                       premium * FakePricer().round_s(rows, ctx), 0.0004, ctx, tree_budget=8,
                       tree_parents=list(PARENTS), tree_path=list(path))


def _chain_round(k, ctx):
    return RoundRecord("ngram", 4, 4, k, k + 1, False, 0.002, FakePricer().round_s(5, ctx), 0.0003, ctx)


def synthetic_tree_run(n_prompts=4, seed=0):
    rnd = random.Random(seed)
    recs = []
    for i in range(n_prompts):
        pid = f"copy{i}"
        plain = plain_rounds(40, 0.010, 0.0002, context_start=20)
        recs.append(request_from_rounds(f"{pid}|none", pid, plain, category="copy", prompt_tokens=20))
        ctx, rounds = 20, []
        for j in range(10):
            rd = _tree_round(PATHS[(i + j) % len(PATHS)], ctx)
            rounds.append(rd)
            ctx += rd.committed
        tree = request_from_rounds(f"{pid}|ngram|4|tree8", pid, rounds, category="copy", prompt_tokens=20)
        tree.tree_budget = 8
        recs.append(tree)
        ctx, rounds = 20, []
        for _ in range(12):
            rd = _chain_round(rnd.choice([0, 1, 2, 4]), ctx)
            rounds.append(rd)
            ctx += rd.committed
        recs.append(request_from_rounds(f"{pid}|ngram|4", pid, rounds, category="copy", prompt_tokens=20))
    return recs


def test_depth_aware_dp_matches_the_positional_dp_and_its_own_survival():
    rows = [[0.7, 0.2], [0.5, 0.3, 0.1], [0.3]]
    for budget in (1, 4, 8, 16):
        best = best_tree_by_depth(rows, budget, 4)
        assert 1 + sum(survival_by_depth(best.shape, rows)) == pytest.approx(best.expected_length)
        same = best_tree_by_depth([[0.6, 0.2]], budget, 3)
        assert same.shape == best_tree([0.6, 0.2], budget, 3).shape
        assert same.expected_length == pytest.approx(expected_length_of_shape(same.shape, [0.6, 0.2]))
    # the depth-aware pick is never worse, under the by-depth model, than the shape a single vector picks
    rows = [[0.4, 0.3, 0.2], [0.9]]
    for budget in range(1, 12):
        best = best_tree_by_depth(rows, budget, 3)
        for vector in rows:
            other = best_tree(vector, budget, 3).shape
            assert best.expected_length >= 1 + sum(survival_by_depth(other, rows)) - 1e-12


def test_depth_rank_counts_follow_the_accepted_paths():
    counts = count_depth_rank([(PARENTS, p) for p in PATHS])
    assert counts.rounds == len(PATHS)
    assert counts.tries[0][:2] == [10, 10]  # every round: the root had two children
    assert counts.hits[0][:2] == [7, 2]  # 7 paths start at node 0 (rank 0), 2 at node 5 (rank 1)
    assert counts.tries[1][:2] == [9, 7]  # reached node 0 (7, two children) or node 5 (2, one child)
    rows, _ = counts.rows(min_tries=1)
    assert all(sum(r) <= 1 + 1e-12 for r in rows)


def test_measured_acceptance_is_the_observed_path_lengths():
    recs = synthetic_tree_run()
    acc = measured_acceptance([r for r in recs if r.drafter == "ngram"], 8, 4)
    committed = [rd.committed for r in recs if r.tree_budget for rd in r.rounds]
    assert acc.source == MEASURED and acc.el == pytest.approx(np.mean(committed))
    assert acc.fill == 1.0 and acc.nodes == 8 and acc.widths == [2, 3, 2, 1]
    assert measured_acceptance(recs, 16, 4) is None  # nothing measured at 16 nodes


def test_dp_acceptance_when_the_budget_was_not_measured():
    recs = synthetic_tree_run()
    acc = tree_acceptance(recs, "ngram", 16, 4, "copy")
    assert acc.source == DP_SOURCE and "depth rows" in acc.detail and "widths" in acc.detail
    measured = tree_acceptance(recs, "ngram", 8, 4, "copy")
    assert measured.source == MEASURED
    chains_only = dp_acceptance([r for r in recs if not r.tree_budget], 8, 4)
    assert "only first-ranked children" in chains_only.detail  # the DP can only build a chain then


def test_the_recursion_by_hand():
    """K = 4 every round (L = 5), 20 tokens after the prefill: 4 rounds of draft + verify·π + other."""
    pricer = FakePricer()
    acc = TreeAcceptance([1.0] * 4, 1.0, 8.0, MEASURED, "", 40)
    costs = TreeCosts(1.2, lambda c: 0.003, 0.0004, 0.0002, {})
    size = Sizes("p", 20, 21, 1000)
    t, rounds, tree_rounds = request_seconds(pricer, "ngram", acc, costs, size, 4, 9.0)
    assert rounds == pytest.approx(4) and tree_rounds == pytest.approx(4)
    assert t == pytest.approx(0.020 + 4 * (0.003 + 0.018 * 1.2 + 0.0004))
    plain, r0, _ = request_seconds(pricer, "none", None, None, size, 0, 1.0)
    assert r0 == 20 and plain == pytest.approx(0.020 + 20 * 0.0102)
    # max_tokens clamps the depth: at most M - done - 1 candidates, so the last rounds are shallower
    t_clamped, r_clamped, _ = request_seconds(pricer, "ngram", acc, costs, Sizes("p", 20, 21, 21), 4, 9.0)
    assert r_clamped == pytest.approx(4) and t_clamped == pytest.approx(t)
    half = TreeAcceptance([1.0] * 4, 0.5, 8.0, MEASURED, "", 40)  # a drafter that proposes half the time
    _, r_half, rt_half = request_seconds(pricer, "ngram", half, costs, size, 4, 9.0)
    assert r_half > 4 and 0 < rt_half < r_half


def test_a_longer_output_budget_extends_requests_cut_by_length():
    from specledger.predict.tree_forecast import category_sizes

    recs = synthetic_tree_run()
    assert {s.output_tokens for s in category_sizes(recs, "ngram", "copy", None)} == {40}
    longer = category_sizes(recs, "ngram", "copy", 80)
    assert {(s.output_tokens, s.max_tokens) for s in longer} == {(80, 80)}
    for r in recs:
        r.stop_reason = "eos"
        r.extra["max_tokens"] = 64
    assert {s.output_tokens for s in category_sizes(recs, "ngram", "copy", 80)} == {40}  # stopped at EOS


def test_costs_read_the_premium_and_the_measured_draft():
    costs = tree_costs(FakePricer(), synthetic_tree_run(), "ngram", 8, 4, 9.0)
    assert costs.premium == pytest.approx(1.2)
    assert costs.draft(100.0) == pytest.approx(0.003) and costs.other_tree == pytest.approx(0.0004)
    assert "measured" in costs.sources["draft"] and "premium 1.200" in costs.sources["verify"]
    bare = tree_costs(FakePricer(), [r for r in synthetic_tree_run() if not r.tree_budget], "ngram", 8, 4, 9.0)
    assert bare.premium == 1.0 and "assumed" in bare.sources["verify"] and "assumed" in bare.sources["draft"]


def test_chain_forecasts_leave_tree_records_out():
    recs = synthetic_tree_run()
    assert not any(r.tree_budget for r in usable(recs))
    model = AcceptanceModel.from_records(recs)
    assert all(c.gammas == [4] and c.weight == 12 for c in model.requests("copy", "ngram"))


@pytest.fixture()
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    append_records(d / TRACE_NAME, synthetic_tree_run())
    write_json_atomic(d / META_NAME, {"config": {"max_tokens": 41}})
    return d


def _cli(argv, capsys):
    return run_cli(argv, capsys)


def test_predict_tree_budget_json_and_sources(run_dir, capsys):
    code, out, err = _cli(["predict", str(run_dir), "--drafter", "ngram", "--gamma", "4", "--tree-budget", "8",
                           "--json"], capsys)
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["acceptance_source"] == MEASURED and row["tree_budget"] == 8 and row["depth"] == 4
    assert row["measured_speedup"] is not None and row["predicted_speedup"] > 0
    assert {"verify", "draft", "other", "acceptance", "fill", "prefill"} <= set(row["term_sources"])
    code, out, err = _cli(["predict", str(run_dir), "--drafter", "ngram", "--gamma", "4", "--tree-budget", "16"],
                          capsys)
    assert code == 0, err
    assert "DP from measured acceptance by depth×rank" in out and "where each term came from" in out
    assert "premium" in out


@pytest.mark.parametrize("argv, needle", [
    (["--tree-budget", "0"], "--tree-budget must be >= 1"),
    (["--tree-budget", "-3"], "--tree-budget must be >= 1"),
    (["--tree-budget", "1000"], "exceeds 256"),
    (["--tree-budget", "8", "--categories", "nope"], "unknown categories"),
])
def test_predict_tree_budget_errors_are_one_line(run_dir, capsys, argv, needle):
    code, _, err = _cli(["predict", str(run_dir), "--drafter", "ngram", "--gamma", "4", *argv], capsys)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and needle in err


def test_simulate_tree_budget(run_dir, capsys):
    code, out, err = _cli(["simulate", "--from", str(run_dir), "--drafter", "ngram", "--gamma", "4",
                           "--concurrency", "1,4", "--requests", "20", "--tree-budget", "8", "--json"], capsys)
    assert code == 0, err
    points = json.loads(out)
    trees = [p for p in points if p["tree_budget"] == 8]
    assert len(trees) == 2 and all(p["setting"] == "ngram γ=4 tree=8" for p in trees)
    assert all(p["speedup"] > 0 for p in trees)
    code, out, err = _cli(["simulate", "--from", str(run_dir), "--drafter", "ngram", "--gamma", "4",
                           "--concurrency", "1", "--requests", "10", "--tree-budget", "8"], capsys)
    assert code == 0, err
    assert "measured: 40 full tree rounds" in out and "premium" in out


@pytest.mark.parametrize("argv, needle", [
    (["--tree-budget", "40"], "exceeds 31"),
    (["--tree-budget", "0"], "--tree-budget must be >= 1"),
    (["--tree-budget", "8", "--gamma", "goodput"], "static gammas"),
])
def test_simulate_tree_budget_errors(run_dir, capsys, argv, needle):
    code, _, err = _cli(["simulate", "--from", str(run_dir), "--drafter", "ngram", "--concurrency", "1", *argv],
                        capsys)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and needle in err
