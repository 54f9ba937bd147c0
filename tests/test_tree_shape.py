"""The DP's static tree shape as a proposer choice: greedy output token-identical to plain greedy at
budgets 4, 8, 16 (solo and batched), model drafters fill the shape exactly, model-free ones are cut to it,
sampled static trees keep the target's distribution, and `--tree-shape` specs (one-line errors)."""

from __future__ import annotations

import pytest
from test_engine import _chi2_pvalue, _prompts

from specledger.engine.batch import BatchEngine, BatchRequest
from specledger.engine.decode import Engine
from specledger.engine.drafters.draft_model import DraftModelDrafter
from specledger.engine.drafters.layerskip import LayerSkipDrafter
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.sampling import SamplingParams
from specledger.engine.tree import DraftTree
from specledger.engine.tree_shape import StaticTreeShape, restrict_to_shape
from specledger.errors import SpecLedgerError
from specledger.ledger.trees import width_per_depth
from specledger.mainjob.tree_shape_spec import tree_shape_from_spec
from tests.conftest import exact_tokens_2_3, tiny_model

DRAFTERS = ["ngram", "suffix", "layerskip", "model"]
SHAPE = StaticTreeShape([[0.5, 0.2, 0.1], [0.6, 0.15], [0.7]], "test rows")


@pytest.fixture(scope="module")
def draft_small():
    return tiny_model(7, n_layers=2)


def _drafter(name, engine, draft_small, shape=SHAPE):
    d = {"layerskip": lambda: LayerSkipDrafter(engine.model, [0]),
         "model": lambda: DraftModelDrafter(draft_small)}.get(name, lambda: make_drafter(name, engine))()
    d.tree_shape = shape
    return d


@pytest.fixture(scope="module")
def plain(target):
    engine = Engine(target)
    return [engine.generate(p, max_tokens=28).token_ids for p in _prompts(4, 64, seed=5)]


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("budget", [4, 8, 16])
def test_static_dp_shape_greedy_is_token_identical_to_plain(target, plain, draft_small, name, budget):
    engine = Engine(target)
    drafter = _drafter(name, engine, draft_small)
    accepted = filled = 0
    for prompt, ref in zip(_prompts(4, 64, seed=5), plain):
        rec = engine.generate(prompt, drafter=drafter, gamma=5, max_tokens=28, tree_budget=budget)
        assert rec.token_ids == ref
        for rd in rec.rounds:
            if rd.tree_parents is None:
                continue
            tree = DraftTree([0] * rd.proposed, rd.tree_parents)
            assert rd.proposed <= budget and tree.depth() <= 5
            if name in ("layerskip", "model") and rd.gamma == 5:  # a model drafter fills the shape exactly
                assert tree.widths() == width_per_depth(SHAPE.shape_for(budget, 5))
                filled += 1
            accepted += rd.accepted
    assert accepted > 0 or name == "model"
    assert filled > 0 or name not in ("layerskip", "model")


@pytest.mark.parametrize("name", DRAFTERS)
def test_static_dp_shape_batched_equals_solo_plain(target, draft_small, name):
    solo = Engine(target)
    reqs = [BatchRequest(p, max_tokens=18, request_id=f"r{i}", tree_budget=8 if i % 2 else 0)
            for i, p in enumerate(_prompts(5, 64, seed=11))]
    expected = {r.request_id: solo.generate(r.prompt, max_tokens=r.max_tokens).token_ids for r in reqs}
    engine = BatchEngine(target, max_batch=3, capacity=128)
    proto = _drafter(name, solo, draft_small)
    recs = engine.run(reqs, proto.fork, 4, concurrency=3)
    assert {r.request_id: r.token_ids for r in recs} == expected
    assert any(rd.tree_parents is not None for r in recs for rd in r.rounds)


def test_sampled_static_trees_keep_the_target_distribution():
    """Tokens 2-3 from one static-shape tree round of a draft model far from the target (draws from q)."""
    vocab = 4
    target = tiny_model(11, vocab=vocab, n_layers=2, dim=16)
    drafter = DraftModelDrafter(tiny_model(12, vocab=vocab, n_layers=1, dim=16))
    drafter.tree_shape = StaticTreeShape([[0.4, 0.3]], "two children per node")
    params = SamplingParams(temperature=1.0)
    exact = exact_tokens_2_3(target, [1, 2, 3], params)
    engine = Engine(target)
    samples = []
    for seed in range(2000):
        rec = engine.generate([1, 2, 3], drafter=drafter, gamma=2, max_tokens=3, tree_budget=5,
                              params=SamplingParams(temperature=1.0, seed=seed), ignore_eos=True)
        assert DraftTree([0] * rec.rounds[0].proposed, rec.rounds[0].tree_parents).widths()[0] == 2
        samples.append(rec.token_ids[1] * vocab + rec.token_ids[2])
    assert _chi2_pvalue(samples, exact / exact.sum()) > 1e-3


def test_restrict_to_shape_keeps_the_ranked_places():
    tree = DraftTree.build([1, 2, 3, 4, 5, 6], [-1, 0, 0, -1, 3, -1])  # root: 1 (2, 3), 4 (5), 6
    cut = restrict_to_shape(tree, (((),), ()))  # two root children, the first with one child
    assert cut.tokens == [1, 2, 4] and cut.parents == [-1, 0, -1]


def test_tree_shape_specs(tmp_path, target):
    assert tree_shape_from_spec("dynamic", "ngram") is None
    assert "assumed" in tree_shape_from_spec("dp", "ngram").source
    given = tree_shape_from_spec("dp:0.7,0.2", "ngram")
    assert given.rows == [[0.7, 0.2]] and len(given.shape_for(4, 4)) >= 1
    from specledger.mainjob.job import RunPlan, run
    from tests.conftest import CharLoaded

    engine = Engine(target)
    engine.loaded, engine.name = CharLoaded(), "tiny"
    run(tmp_path / "r", RunPlan(categories=["random"], n_per_category=2, drafters=["layerskip"], gammas=[3],
                                model_gammas=None, max_tokens=16, layers="1", tree_budgets=[0, 6]), engine)
    measured = tree_shape_from_spec(f"dp:{tmp_path / 'r'}", "layerskip")
    assert "measured" in measured.source and len(measured.rows) >= 2
    run(tmp_path / "dp", RunPlan(categories=["random"], n_per_category=1, drafters=["layerskip"], gammas=[3],
                                 model_gammas=None, max_tokens=12, layers="1", tree_budgets=[6],
                                 tree_shape=f"dp:{tmp_path / 'r'}"), engine)
    from specledger.rundir import META_NAME, read_json

    assert "measured" in read_json(tmp_path / "dp" / META_NAME)["drafters"]["tree_shape"]["layerskip"]
    for bad, needle in (("wide", "--tree-shape must be"), ("dp:", "needs acceptance"), ("dp:x,y", "neither"),
                        ("dp:0.8,0.7", "sum"), (f"dp:{tmp_path}", "no traces.jsonl")):
        with pytest.raises(SpecLedgerError, match=needle):
            tree_shape_from_spec(bad, "ngram")
    with pytest.raises(SpecLedgerError, match="no full proposing rounds"):
        tree_shape_from_spec(f"dp:{tmp_path / 'r'}", "suffix")
