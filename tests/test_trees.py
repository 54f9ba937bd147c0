"""Token trees: greedy tree output == plain greedy for every drafter at budgets 4-32, solo and batched;
tree rows are computed bit for bit like plain steps; sampled tree verification emits the target's
distribution (and a deliberately wrong acceptance rule is caught); shapes and bad input."""

from __future__ import annotations

import random

import pytest
import torch

from specledger.engine.batch import BatchEngine, BatchRequest
from specledger.engine.decode import Engine
from specledger.engine.drafters.draft_model import DraftModelDrafter
from specledger.engine.drafters.layerskip import LayerSkipDrafter
from specledger.engine.drafters.ngram import NgramDrafter
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.drafters.suffix import SuffixDrafter
from specledger.engine.sampling import SamplingParams
from specledger.engine.tree import DraftTree, grow_tree, verify_tree_greedy, verify_tree_sampling
from specledger.errors import SpecLedgerError
from tests.conftest import exact_tokens_2_3, tiny_model
from tests.test_engine import _chi2_pvalue, _prompts

DRAFTERS = ["ngram", "suffix", "layerskip", "quant-self", "model"]
BUDGETS = [4, 8, 16, 32]


@pytest.fixture(scope="module")
def draft_small():
    return tiny_model(7, n_layers=2)


def _drafter(name, engine, draft_small):
    if name == "layerskip":
        return LayerSkipDrafter(engine.model, [0])
    if name == "model":
        return DraftModelDrafter(draft_small)
    return make_drafter(name, engine)


@pytest.fixture(scope="module")
def plain(target):
    engine = Engine(target)
    return [engine.generate(p, max_tokens=32).token_ids for p in _prompts(5, 64, seed=4)]


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("budget", BUDGETS)
def test_greedy_tree_is_token_identical_to_plain(target, plain, draft_small, name, budget):
    engine = Engine(target)
    drafter = _drafter(name, engine, draft_small)
    branched = accepted = 0
    for prompt, ref in zip(_prompts(5, 64, seed=4), plain):
        rec = engine.generate(prompt, drafter=drafter, gamma=6, max_tokens=32, tree_budget=budget)
        assert rec.token_ids == ref
        assert rec.tree_budget == budget
        for rd in rec.rounds:
            tree = DraftTree([0] * rd.proposed, rd.tree_parents)
            assert rd.proposed <= budget and tree.depth() <= 6
            assert rd.accepted == len(rd.tree_path) and (
                not rd.tree_path or tree.path(rd.tree_path[-1]) == rd.tree_path
            )
            branched += not tree.is_chain
            accepted += rd.accepted
    assert accepted > 0 or name == "model"  # an unrelated random draft is never right
    if budget >= 8 and name != "ngram":  # ngram branches only where a n-gram recurs with other successors
        assert branched > 0, "no round proposed a branching tree: the test would not exercise trees"


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("budget", BUDGETS)
def test_batched_greedy_tree_equals_solo_plain(target, draft_small, name, budget):
    solo = Engine(target)
    rnd = random.Random(budget)
    reqs = []
    for i, p in enumerate(_prompts(6, 64, seed=9)):
        tb = budget if i % 3 else 0  # trees and chains in the same packed pass
        reqs.append(BatchRequest(p, max_tokens=rnd.randrange(8, 24), request_id=f"r{i}", tree_budget=tb))
    expected = {r.request_id: solo.generate(r.prompt, max_tokens=r.max_tokens).token_ids for r in reqs}
    engine = BatchEngine(target, max_batch=3, capacity=160)
    recs = engine.run(reqs, lambda: _drafter(name, solo, draft_small), 5, concurrency=3)
    assert len(recs) == len(reqs)
    for r in recs:
        assert r.token_ids == expected[r.request_id], r.request_id
    assert max(s.batch_size for s in engine.steps) > 1


def test_batched_tree_under_a_step_token_budget_stays_exact(target, draft_small):
    solo = Engine(target)
    reqs = [BatchRequest(p, max_tokens=20, request_id=f"r{i}", tree_budget=16) for i, p in enumerate(_prompts(4, 64))]
    expected = {r.request_id: solo.generate(r.prompt, max_tokens=20).token_ids for r in reqs}
    engine = BatchEngine(target, max_batch=4, capacity=160, step_token_budget=20)
    recs = engine.run(reqs, lambda: LayerSkipDrafter(target, [0]), 4, concurrency=4)
    assert {r.request_id: r.token_ids for r in recs} == expected
    assert max(s.rows for s in engine.steps) <= 20


def test_tree_rows_are_bit_identical_to_plain_steps(target):
    """Every row of a tree pass gives the logits a plain decode of its root-to-node path gives, and
    the committed path leaves the k/v a plain decode would."""
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    tree = DraftTree.build([7, 8, 9, 10, 11, 12], [-1, 0, 0, -1, 3, 1])
    start = len(prompt) - 1
    cache = target.new_cache(64)
    with torch.inference_mode():
        target(torch.tensor([prompt[:-1]]), 0, cache)
        logits, kv = target.forward_tree([prompt[-1]] + tree.tokens, [0] * (len(tree) + 1), tree.positions(start),
                                         cache)
        for node in range(-1, len(tree)):
            path = tree.path(node) if node >= 0 else []
            seq = prompt + [tree.tokens[i] for i in path]
            ref_cache = target.new_cache(64)
            target(torch.tensor([prompt[:-1]]), 0, ref_cache)
            for j in range(start, len(seq)):  # plain one-token steps
                ref = target(torch.tensor([[seq[j]]]), j, ref_cache)[0, -1]
            assert torch.equal(ref, logits[node + 1]), node
        path = tree.path(4)
        target.commit_tree_kv(cache, 0, start + 1, kv, [i + 1 for i in path])
        end = start + 1 + len(path)
        step_cache = target.new_cache(64)
        target(torch.tensor([prompt[:-1]]), 0, step_cache)
        seq = prompt + [tree.tokens[i] for i in path]
        for j in range(start, len(seq)):
            target(torch.tensor([[seq[j]]]), j, step_cache)
        assert torch.equal(cache.kv[:, :, :, :, :end], step_cache.kv[:, :, :, :, :end])


def test_greedy_tree_verifier_follows_the_argmax():
    tree = DraftTree.build([5, 6, 7, 8], [-1, -1, 1, 1])  # root -> {5, 6}; 6 -> {7, 8}
    logits = torch.full((5, 10), -1.0)
    for row, t in enumerate([6, 0, 8, 0, 3]):
        logits[row, t] = 1.0
    assert verify_tree_greedy(logits, tree) == ([1, 3], [6, 8, 3])
    logits[0] = -1.0
    logits[0, 2] = 1.0
    assert verify_tree_greedy(logits, tree) == ([], [2])


def test_tree_build_orders_dfs_and_drops_repeated_siblings():
    tree = DraftTree.build([1, 2, 3, 2, 4], [-1, -1, 0, -1, 1])
    assert tree.tokens == [1, 3, 2, 4] and tree.parents == [-1, 0, -1, 2]
    assert tree.widths() == [2, 2] and tree.ranks() == [0, 0, 1, 0]
    assert tree.trimmed(3).tokens == [1, 3, 2] and tree.trimmed(9, max_depth=1).tokens == [1, 2]
    assert DraftTree.chain([4, 5, 6]).is_chain and not tree.is_chain


# ---------------------------------------------------------------------------- sampling

V = 5
P1 = torch.tensor([0.30, 0.25, 0.05, 0.40, 0.00])
P2 = torch.tensor([[0.10, 0.20, 0.30, 0.20, 0.20], [0.50, 0.05, 0.05, 0.30, 0.10], [0.2] * 5,
                   [0.05, 0.05, 0.60, 0.10, 0.20], [0.2] * 5])
Q1 = torch.tensor([0.05, 0.50, 0.25, 0.10, 0.10])
Q2 = torch.tensor([[0.60, 0.10, 0.10, 0.10, 0.10], [0.10, 0.40, 0.40, 0.05, 0.05], [0.2] * 5,
                   [0.30, 0.30, 0.10, 0.20, 0.10], [0.2] * 5])


def _draw_without_replacement(q: torch.Tensor, k: int, gen: torch.Generator) -> list[int]:
    out, q = [], q.clone()
    for _ in range(k):
        x = int(torch.multinomial(q, 1, generator=gen))
        out.append(x)
        q[x] = 0.0
    return out


def _sampled_pairs(n: int, draws: bool, rule: str, seed: int = 0) -> list[int]:
    """First two emitted tokens of a depth-2 tree round (3 root children, 2 grandchildren each)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        first = _draw_without_replacement(Q1, 3, gen) if draws else [3, 1, 0]
        tokens, parents, q_rows = [], [], {0: Q1}
        for x in first:
            tokens.append(x)
            parents.append(-1)
            node = len(tokens) - 1
            q_rows[node + 1] = Q2[x]
            for y in (_draw_without_replacement(Q2[x], 2, gen) if draws else [2, 0]):
                tokens.append(y)
                parents.append(node)
        tree = DraftTree.build(tokens, parents, q_rows if draws else None)
        depths = tree.depths()
        rows = [P1] + [P2[t] if d == 1 else torch.full((V,), 0.2) for t, d in zip(tree.tokens, depths)]
        _, emitted = verify_tree_sampling(torch.stack(rows), tree, gen, rule=rule)
        second = emitted[1] if len(emitted) > 1 else int(torch.multinomial(P2[emitted[0]], 1, generator=gen))
        out.append(emitted[0] * V + second)
    return out


EXACT = (P1[:, None] * P2).flatten().double().numpy()
EXACT = EXACT / EXACT.sum()


@pytest.mark.parametrize("draws", [True, False])
def test_recursive_rejection_over_siblings_emits_the_target_distribution(draws):
    assert _chi2_pvalue(_sampled_pairs(8000, draws, "exact"), EXACT) > 1e-3


@pytest.mark.parametrize("draws", [True, False])
def test_a_wrong_acceptance_rule_fails_the_distribution_test(draws):
    """Negative control: keeping p unchanged after a sibling's rejection (no residual) is caught."""
    assert _chi2_pvalue(_sampled_pairs(8000, draws, "no-residual"), EXACT) < 1e-3


@pytest.mark.parametrize("draws", [True, False])
def test_sampled_tree_engine_matches_plain_sampling(draws):
    """End to end: tokens 2-3 come from one tree round of a real draft model (q far from p)."""
    vocab = 4
    target = tiny_model(11, vocab=vocab, n_layers=2, dim=16)
    draft = tiny_model(12, vocab=vocab, n_layers=1, dim=16)
    params = SamplingParams(temperature=1.0)
    prompt = [1, 2, 3]
    exact = exact_tokens_2_3(target, prompt, params)  # exact joint of (t2, t3) under the target
    engine = Engine(target)
    drafter = DraftModelDrafter(draft)
    drafter.tree_draws = draws
    samples, branched = [], 0
    for seed in range(2000):
        rec = engine.generate(prompt, drafter=drafter, gamma=2, max_tokens=3, tree_budget=5,
                              params=SamplingParams(temperature=1.0, seed=seed), ignore_eos=True)
        samples.append(rec.token_ids[1] * vocab + rec.token_ids[2])
        branched += not DraftTree([0] * rec.rounds[0].proposed, rec.rounds[0].tree_parents).is_chain
    assert branched > 1000
    assert _chi2_pvalue(samples, exact / exact.sum()) > 1e-3


def test_grow_tree_keeps_the_most_probable_paths():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1, 1e-9]))
    calls = []

    def expand(nodes, tokens, parents):
        calls.append(list(nodes))
        return torch.stack([torch.log(torch.tensor([0.9, 0.05, 0.04, 0.01]))] * len(nodes))

    tree = grow_tree(logits, expand, budget=4, max_depth=3, params=SamplingParams(), rng=None, topk=2, width=2)
    # scores: 0 (.6), 0->0 (.54), 1 (.3), 1->0 (.27) | 0->0->0 (.486) needs a third wave
    assert len(tree) == 4 and tree.depth() >= 2
    assert tree.tokens[0] == 0 and tree.parents[0] == -1
    assert len(calls) <= 3


def test_model_free_trees_branch_on_repeated_contexts():
    ctx = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]
    d = NgramDrafter()
    d.begin(ctx, SamplingParams())
    tree = d.propose_tree(ctx, 8, 3, SamplingParams(), None)
    assert tree.widths()[0] == 3 and tree.q is None  # three continuations after "1 2"
    s = SuffixDrafter()
    s.begin(ctx, SamplingParams())
    tree = s.propose_tree(ctx, 8, 3, SamplingParams(), None)
    assert sorted(tree.tokens[i] for i, p in enumerate(tree.parents) if p == -1) == [3, 4, 5]


def test_bad_tree_budgets_are_one_line_errors(target):
    engine = Engine(target)
    with pytest.raises(SpecLedgerError, match="tree budget must be an integer >= 1"):
        engine.generate([1, 2, 3], max_tokens=4, tree_budget=-1)
    with pytest.raises(SpecLedgerError, match="exceeds the cache's room"):
        engine.generate([1, 2, 3], max_tokens=4, tree_budget=10_000)
    batch = BatchEngine(target, max_batch=2, capacity=64)
    with pytest.raises(SpecLedgerError, match="exceeds the cache's room"):
        batch.scheduler().add(BatchRequest([1, 2, 3], max_tokens=8, tree_budget=60), NgramDrafter())


def test_a_run_with_tree_budgets_reports_the_tree_ledger(target, tmp_path):
    from specledger.mainjob.job import RunPlan, run
    from specledger.report.build import build_report
    from tests.conftest import CharLoaded

    engine = Engine(target)
    engine.loaded, engine.name = CharLoaded(), "tiny"
    plan = RunPlan(categories=["random"], n_per_category=2, drafters=["suffix", "layerskip"], gammas=[3],
                   model_gammas=None, max_tokens=16, layers="1", tree_budgets=[0, 6])
    run(tmp_path / "r", plan, engine)
    summary, html = build_report(tmp_path / "r")
    budgets = sorted((s["drafter"], s["tree_budget"]) for s in summary["scenarios"])
    assert budgets == [("layerskip", 0), ("layerskip", 6), ("suffix", 0), ("suffix", 6)]
    assert all(b["drafter"] == "none" for b in summary["baselines"])
    groups = {g["drafter"]: g for g in summary["trees"]}
    grid = groups["layerskip"]["grid"]
    assert [r["tree_budget"] for r in grid] == [0, 6]
    assert grid[1]["el"] >= 1 and grid[1]["dp_el"] >= 1 and grid[1]["acceptance_by_depth"]
    assert groups["layerskip"]["verify_cost"]["ms_per_row"] is not None
    assert "plot-tree-0" in html.read_text()
    with pytest.raises(SpecLedgerError, match="exceeds the cache's room"):
        run(tmp_path / "bad", RunPlan(categories=["random"], n_per_category=1, drafters=["ngram"], gammas=[2],
                                      max_tokens=8, tree_budgets=[0, 100_000]), engine)
