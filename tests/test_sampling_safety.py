"""Sampling is safe for every value the server accepts (issue 12, item 1): finite probabilities
summing to 1 with the top token kept, for extreme temperature / top_p / top_k and extreme logits."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.engine.sampling import GREEDY_EPS, SamplingParams, probs_from_logits
from specledger.errors import SpecLedgerError

VOCAB = 37


def _logits(scale: float, seed: int, extremes: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, VOCAB, generator=g) * scale
    for i in range(extremes):  # sprinkle +-inf, NaN and float32 extremes (never a whole row)
        x[i % 2, (7 * i + 3) % (VOCAB - 1)] = [float("inf"), float("-inf"), float("nan"), 3.4e38, -3.4e38][i % 5]
    return x


@settings(max_examples=300, deadline=None)
@given(
    temperature=st.one_of(st.floats(0.0, 2.0), st.sampled_from([1e-40, 1e-300, 5e-324, GREEDY_EPS, 1e-5 * 1.0001,
                                                                 2.0])),
    top_p=st.one_of(st.floats(0.0, 1.0, exclude_min=True), st.sampled_from([1e-300, 5e-324, 1e-45, 1e-7, 1.0])),
    top_k=st.one_of(st.integers(0, 2 * VOCAB), st.sampled_from([1, VOCAB - 1, VOCAB, 10**30])),
    scale=st.sampled_from([0.0, 1e-30, 1.0, 30.0, 1e4, 1e30, 3e38]),
    seed=st.integers(0, 2**16),
    extremes=st.integers(0, 6),
)
def test_probs_are_finite_and_normalised_for_every_accepted_value(temperature, top_p, top_k, scale, seed,
                                                                  extremes) -> None:
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=0)
    logits = _logits(scale, seed, extremes)
    if params.greedy:  # every engine path takes the argmax, whatever T (tiny T included) is
        assert temperature < GREEDY_EPS
        return
    probs = probs_from_logits(logits, params)
    assert torch.isfinite(probs).all()
    assert torch.allclose(probs.sum(-1), torch.ones(2), atol=1e-5)
    clean = torch.nan_to_num(logits, nan=float("-inf"), posinf=3.5e38)
    is_top = clean == clean.amax(-1, keepdim=True)
    assert ((probs * is_top).sum(-1) > 0).all()  # a top token always survives the filters
    assert (probs[torch.isnan(logits)] == 0).all()  # NaN logits are never sampled
    torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed))  # never raises


def test_tiny_temperature_is_greedy_and_tiny_top_p_keeps_the_top_token() -> None:
    assert SamplingParams(temperature=1e-40).greedy and SamplingParams(temperature=0).greedy
    assert not SamplingParams(temperature=GREEDY_EPS).greedy
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0 - 1e-3]])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=1e-300))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    # ordinary values are computed as they always were: softmax(l / T) with the top-p prefix
    p = probs_from_logits(logits, SamplingParams(temperature=0.7, top_p=0.9))
    want = torch.softmax(logits / 0.7, -1)
    assert p[0, 0] == 0 and torch.allclose(p[0, 1:], want[0, 1:] / want[0, 1:].sum())
    assert torch.equal(probs_from_logits(logits, SamplingParams(temperature=0.7)), torch.softmax(logits / 0.7, -1))


@pytest.mark.parametrize("kwargs", [
    {"temperature": -1e-9}, {"temperature": math.inf}, {"temperature": math.nan}, {"temperature": True},
    {"top_p": 0.0}, {"top_p": 1.5}, {"top_p": math.nan}, {"top_k": -1}, {"top_k": 2.5}, {"top_k": True},
])
def test_out_of_range_params_are_clear_errors(kwargs) -> None:
    with pytest.raises(SpecLedgerError):
        SamplingParams(**kwargs)
