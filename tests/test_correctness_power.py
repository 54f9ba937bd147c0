"""The sampled-correctness gate has power: it fails three wrong acceptance rules and passes the right one.

Mutations (tests/mutant_verifiers.py) replace the engine's rejection sampler: accept-always,
p/q swapped, residual not renormalised. At the default sample size (300 samples per side of one
prompt, 16 tokens, gamma 1, T = 0.7, alpha = 0.01) on tiny random models the gate fails each;
benchmarks/bench_correctness_power.py estimates the failure rate over many trials (the power).
"""

from __future__ import annotations

import pytest
from conftest import tiny_model
from mutant_verifiers import MUTANTS, mutant

import specledger.engine.request as rq
from specledger.bench.sampled_pairs import sample_pairs
from specledger.engine.drafters.draft_model import DraftModelDrafter
from specledger.engine.drafters.ngram import NgramDrafter
from specledger.gates import sampled_correctness
from specledger.gates import sampled_stats as c
from specledger.records import RequestRecord

PROMPT = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3]


@pytest.fixture(scope="module")
def pair():
    return tiny_model(2, vocab=16, n_layers=1, dim=16), tiny_model(5, vocab=16, n_layers=1, dim=16)


def _check(target, factory, seed=123, n=c.DEFAULT_SAMPLES):
    spec, base = sample_pairs(target, PROMPT, factory, c.DEFAULT_GAMMA, 0.7, n=n, seed=seed, max_batch=n)
    return c.sampled_test(spec, base)


def test_correct_rule_passes_at_default_size(pair):
    target, draft = pair
    res = _check(target, lambda: DraftModelDrafter(draft))
    assert res["status"] == "pass", res["evidence"]
    assert res["power"] >= c.POWER_TARGET


@pytest.mark.parametrize("mode", MUTANTS)
def test_wrong_rules_fail_with_a_draft_model(pair, mode, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(rq, "verify_sampling", mutant(mode))
    res = _check(target, lambda: DraftModelDrafter(draft), seed=7)
    assert res["status"] == "fail", res["evidence"]


def test_accept_always_fails_with_ngram(pair, monkeypatch):
    target, _ = pair
    monkeypatch.setattr(rq, "verify_sampling", mutant("accept-always"))
    assert _check(target, NgramDrafter, seed=11)["status"] == "fail"


def test_small_sample_is_not_assessed_with_its_power(pair):
    target, draft = pair
    res = _check(target, lambda: DraftModelDrafter(draft), n=20)
    assert res["status"] == "not assessed"
    assert res["evidence"].startswith("not assessed (power ")
    assert "samples per side" in res["evidence"]


def _rec(pid, toks, drafter="ngram"):
    return RequestRecord(f"{pid}-{drafter}", drafter, 2, 0.8, 1.0, 0, None, 3, len(toks), "", list(toks), "length",
                         0.0, 0.0, 0.0, [0.0] * len(toks), [1] * len(toks), prompt_id=pid, category="c")


def test_one_sample_per_prompt_is_never_a_pass():
    spec = [_rec(f"p{i}", [1, 2, 3]) for i in range(40)]
    base = [_rec(f"p{i}", [1, 2, 3], "none") for i in range(40)]
    g = sampled_correctness(spec, base)
    assert g.status == "not assessed" and g.evidence.startswith("not assessed (power 0 %)")


def test_power_and_sample_size_helpers():
    assert c.power(10, 3, 0.01) < c.power(1000, 3, 0.01)
    n = c.samples_needed(5, 0.001)
    assert c.power(n, 5, 0.001) >= c.POWER_TARGET > c.power(n - 1, 5, 0.001)
    assert c.t_power(300, 0.005) >= c.POWER_TARGET
    stat, df, p = c.chi2_homogeneity([1] * 50 + [2] * 50, [1] * 50 + [2] * 50)
    assert stat == 0 and df == 1 and p == 1.0
