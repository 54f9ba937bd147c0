"""Exactness of the decode loop: greedy speculation == plain greedy; sampling has p's distribution;
KV rollback leaves the cache a plain decode would have; stops cut exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from specledger.engine.decode import Emitted, Engine
from specledger.engine.drafters.base import Drafter, Proposal
from specledger.engine.drafters.draft_model import DraftModelDrafter
from specledger.engine.drafters.layerskip import LayerSkipDrafter
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.sampling import SamplingParams
from specledger.engine.verify import verify_greedy, verify_sampling
from specledger.errors import SpecLedgerError
from specledger.records import RequestRecord, RoundRecord
from tests.conftest import exact_tokens_2_3, tiny_model


def _prompts(n: int, vocab: int, seed: int = 1) -> list[list[int]]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        base = [rnd.randrange(vocab) for _ in range(rnd.randrange(3, 12))]
        out.append(base * rnd.randrange(1, 4) + [rnd.randrange(vocab) for _ in range(rnd.randrange(0, 5))])
    return out


def _drafter(name: str, engine: Engine) -> Drafter:
    if name == "layerskip":
        return LayerSkipDrafter(engine.model, [0])
    if name == "model":
        return DraftModelDrafter(tiny_model(7, n_layers=2))
    return make_drafter(name, engine)


DRAFTER_NAMES = ["ngram", "suffix", "layerskip", "quant-self", "model"]


@pytest.mark.parametrize("name", DRAFTER_NAMES)
@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_speculation_is_token_identical_to_plain(target, name, gamma):
    engine = Engine(target)
    drafter = _drafter(name, engine)
    accepted = 0
    for prompt in _prompts(8, target.config.vocab_size):
        plain = engine.generate(prompt, max_tokens=40)
        spec = engine.generate(prompt, drafter=drafter, gamma=gamma, max_tokens=40)
        assert spec.token_ids == plain.token_ids
        assert sum(r.committed for r in spec.rounds) + 1 == spec.output_tokens
        assert all(r.proposed <= r.gamma <= gamma for r in spec.rounds)
        accepted += sum(r.accepted for r in spec.rounds)
    if name in ("layerskip", "quant-self", "ngram", "suffix"):
        assert accepted > 0, "the drafter never got a token accepted: the test would not exercise rollback"


def test_round_records_are_consistent(target):
    engine = Engine(target)
    rec = engine.generate(_prompts(1, 64)[0], drafter=make_drafter("ngram", engine), gamma=4, max_tokens=33)
    assert rec.output_tokens == 33 and rec.stop_reason == "length"
    assert len(rec.token_times) == 33 and sum(rec.chunks) == 33
    assert rec.token_times == sorted(rec.token_times) and rec.ttft == rec.token_times[0]
    for r in rec.rounds:
        assert r.committed <= r.accepted + 1 and r.accepted <= r.proposed
        assert r.t_draft >= 0 and r.t_verify > 0 and r.t_other >= 0
        if not r.truncated:
            assert r.committed == r.accepted + 1
    ctx = [r.context_len for r in rec.rounds]
    assert ctx == sorted(ctx)


class _FixedProposals(Drafter):
    """Proposes a scripted mix of right and wrong tokens to force partial acceptances."""

    name = "scripted"

    def __init__(self, reference: list[int], prompt_len: int, seed: int = 0) -> None:
        self.reference, self.prompt_len, self.rnd = reference, prompt_len, random.Random(seed)

    def propose(self, context, gamma, params, rng):
        pos = len(context) - self.prompt_len
        right = self.reference[pos : pos + gamma]
        k = self.rnd.randrange(0, len(right) + 1)
        return Proposal(right[:k] + [(t + 1) % 64 for t in right[k:]])


def test_kv_rollback_leaves_the_cache_of_a_plain_decode(target):
    prompt = _prompts(1, 64, seed=3)[0]
    plain_engine, spec_engine = Engine(target), Engine(target)
    plain = plain_engine.generate(prompt, max_tokens=48)
    spec = spec_engine.generate(prompt, drafter=_FixedProposals(plain.token_ids, len(prompt)), gamma=5,
                                max_tokens=48)
    assert spec.token_ids == plain.token_ids
    assert any(0 < r.accepted < r.proposed for r in spec.rounds)
    valid = len(prompt) + len(plain.token_ids) - 1  # the last token has no KV yet
    for a, b in ((plain_engine._cache.k, spec_engine._cache.k), (plain_engine._cache.v, spec_engine._cache.v)):
        assert torch.equal(a[:, :, :, :valid], b[:, :, :, :valid])


def _chi2_pvalue(samples: list[int], expected_probs: np.ndarray) -> float:
    counts = np.bincount(samples, minlength=len(expected_probs)).astype(float)
    keep = expected_probs * len(samples) >= 5  # pool rare bins
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected_probs[keep], expected_probs[~keep].sum()) * len(samples)
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("one_hot", [False, True])
def test_rejection_sampling_emits_the_target_distribution(one_hot):
    gen = torch.Generator().manual_seed(0)
    vocab = 6
    p = torch.tensor([[0.05, 0.4, 0.1, 0.2, 0.25, 0.0], [0.3, 0.3, 0.1, 0.1, 0.1, 0.1]])
    q = torch.tensor([[0.5, 0.1, 0.1, 0.1, 0.1, 0.1]])
    first = []
    for _ in range(6000):
        if one_hot:
            x = 0  # a deterministic (model-free) proposal
            k, toks = verify_sampling(p, [x], None, gen)
        else:
            x = int(torch.multinomial(q[0], 1, generator=gen))
            k, toks = verify_sampling(p, [x], q, gen)
        first.append(toks[0])
    assert _chi2_pvalue(first, p[0].numpy()) > 1e-3
    assert vocab == p.shape[1]


def test_a_wrong_residual_would_fail_the_chi_square():
    """Guard that the test above has power: sampling the correction from p instead of max(0, p-q) is caught."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.05, 0.4, 0.1, 0.2, 0.25, 0.0])
    q = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
    out = []
    for _ in range(6000):
        x = int(torch.multinomial(q, 1, generator=gen))
        if float(torch.rand(1, generator=gen)) < min(1.0, float(p[x] / q[x])):
            out.append(x)
        else:
            out.append(int(torch.multinomial(p, 1, generator=gen)))  # the bug
    assert _chi2_pvalue(out, p.numpy()) < 1e-3


def test_greedy_verifier_accepts_longest_matching_prefix():
    logits = torch.full((4, 5), -1.0)
    for i, t in enumerate([2, 3, 1, 4]):
        logits[i, t] = 1.0
    assert verify_greedy(logits, [2, 3, 0]) == (2, [2, 3, 1])
    assert verify_greedy(logits, [2, 3, 1]) == (3, [2, 3, 1, 4])
    assert verify_greedy(logits, [0, 3, 1]) == (0, [2])
    assert verify_greedy(logits[:1], []) == (0, [2])


def test_sampled_speculation_matches_plain_sampling_distribution():
    """Tokens 2-3 come from one speculative round (gamma=2) with a real draft q far from p."""
    vocab = 4
    target = tiny_model(11, vocab=vocab, n_layers=2, dim=16)
    draft = tiny_model(12, vocab=vocab, n_layers=1, dim=16)
    params = SamplingParams(temperature=1.0)
    prompt = [1, 2, 3]
    # exact joint distribution of (t2, t3) under the target
    exact = exact_tokens_2_3(target, prompt, params)  # exact joint of (t2, t3) under the target
    engine = Engine(target)
    drafter = DraftModelDrafter(draft)
    samples = []
    for seed in range(2500):
        rec = engine.generate(prompt, drafter=drafter, gamma=2, max_tokens=3,
                              params=SamplingParams(temperature=1.0, seed=seed), ignore_eos=True)
        samples.append(rec.token_ids[1] * vocab + rec.token_ids[2])
    assert _chi2_pvalue(samples, exact / exact.sum()) > 1e-3


def test_sampling_is_seeded_and_reproducible(target):
    engine = Engine(target)
    d = make_drafter("quant-self", engine)
    a = engine.generate([1, 2, 3, 4], drafter=d, gamma=3, max_tokens=20, params=SamplingParams(0.8, seed=5))
    b = engine.generate([1, 2, 3, 4], drafter=d, gamma=3, max_tokens=20, params=SamplingParams(0.8, seed=5))
    assert a.token_ids == b.token_ids


def test_stop_string_straddling_accepted_tokens_ends_output_exactly_before_it(target, char_tokenizer):
    engine = Engine(target, tokenizer=char_tokenizer)
    # a prompt whose output has a 3-token string first occurring well inside it
    for prompt in _prompts(20, 64, seed=5):
        plain = engine.generate(prompt, max_tokens=40)
        firsts = [i for i in range(8, 30) if plain.text.index(plain.text[i : i + 3]) == i]
        if firsts:
            break
    first = firsts[0]
    stop = plain.text[first : first + 3]
    for drafter in (make_drafter("ngram", engine), _FixedProposals(plain.token_ids, len(prompt))):
        events = list(engine.stream(prompt, drafter=drafter, gamma=6, max_tokens=40, stop=[stop]))
        rec = events[-1]
        assert isinstance(rec, RequestRecord)
        streamed = "".join(e.text for e in events if isinstance(e, Emitted))
        assert rec.text == streamed == plain.text[:first]
        assert rec.stop_reason == "stop"
        assert plain.token_ids[: len(rec.token_ids)] == rec.token_ids
        assert len(char_tokenizer.decode(rec.token_ids)) >= first
        assert len(char_tokenizer.decode(rec.token_ids[:-1])) < first


def test_eos_inside_an_accepted_span_stops_there(target):
    prompt = _prompts(1, 64, seed=6)[0]
    plain = Engine(target).generate(prompt, max_tokens=40)
    eos_tok = plain.token_ids[12]
    cut = plain.token_ids.index(eos_tok)
    engine = Engine(target, eos_token_ids=[eos_tok])
    for drafter in (None, _FixedProposals(plain.token_ids, len(prompt)), make_drafter("ngram", engine)):
        events = list(engine.stream(prompt, drafter=drafter, gamma=6, max_tokens=40))
        rec = events[-1]
        assert rec.token_ids == plain.token_ids[: cut + 1] and rec.stop_reason == "eos"
        emitted = [t for e in events if isinstance(e, Emitted) for t in e.token_ids]
        assert emitted == rec.token_ids
        rounds = [e for e in events if isinstance(e, RoundRecord)]
        assert sum(r.committed for r in rounds) + 1 == len(rec.token_ids)


def test_bad_requests_are_clear_errors(target):
    engine = Engine(target, max_context=64)
    with pytest.raises(SpecLedgerError, match="exceeds the model's context"):
        engine.generate(list(range(60)), max_tokens=10)
    with pytest.raises(SpecLedgerError, match="empty"):
        engine.generate([], max_tokens=10)
    with pytest.raises(SpecLedgerError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(SpecLedgerError, match="unknown drafter"):
        make_drafter("nope", engine)
    with pytest.raises(SpecLedgerError, match="tokenizer differs"):
        from tests.conftest import CharTokenizer

        class Other(CharTokenizer):
            def get_vocab(self):
                return {"x": 0}

        DraftModelDrafter(target, CharTokenizer(), Other())


def test_verify_pass_rounds_every_row_exactly_like_plain_steps(target):
    """Row invariance (fp32): T one-token steps and one T-token verify pass give identical bits,
    so greedy speculation can never flip a token through rounding."""
    prompt = _prompts(1, 64, seed=9)[0]
    extra = [5, 17, 42, 8, 33, 1, 60, 12, 9]
    c1, c2 = target.new_cache(128), target.new_cache(128)
    with torch.inference_mode():
        target(torch.tensor([prompt]), 0, c1)
        target(torch.tensor([prompt]), 0, c2)
        steps = torch.cat([target(torch.tensor([[t]]), len(prompt) + i, c1)[0] for i, t in enumerate(extra)])
        block = target(torch.tensor([extra]), len(prompt), c2)[0]
    assert torch.equal(steps, block)
    assert torch.equal(c1.k[:, :, :, : len(prompt) + len(extra)], c2.k[:, :, :, : len(prompt) + len(extra)])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0, -2.5, 3.0, 3.0, float("nan"), float("inf"), float("-inf")]),
                min_size=1, max_size=12), st.integers(1, 3))
def test_argmax_rows_is_torchs_argmax_ties_and_nans_included(values, rows):
    from specledger.engine.verify import argmax_rows

    logits = torch.tensor([values[r:] + values[:r] for r in range(rows)], dtype=torch.float32)  # rotated rows
    assert argmax_rows(logits) == logits.argmax(dim=-1).tolist()
    assert argmax_rows(logits[0]) == int(logits[0].argmax())


def test_generate_decodes_the_text_once_and_streams_give_the_same_text():
    """generate() yields no chunk to anyone, so it detokenizes once at the end (a per-round decode of the whole
    output is O(output) a round); a stream still carries each chunk's text; stop strings still cut either."""
    from tests.conftest import CharTokenizer

    class Counting(CharTokenizer):
        calls = 0

        def decode(self, ids, skip_special_tokens: bool = True) -> str:
            Counting.calls += 1
            return super().decode(ids, skip_special_tokens)

    engine = Engine(tiny_model(), tokenizer=Counting(), max_context=256)
    prompt, greedy = [1, 2, 3, 4], SamplingParams(temperature=0.0)
    record = engine.generate(prompt, max_tokens=40, params=greedy, ignore_eos=True)
    assert Counting.calls == 1 and record.text == CharTokenizer().decode(record.token_ids)
    Counting.calls = 0
    events = list(engine.stream(prompt, max_tokens=40, params=greedy, ignore_eos=True))
    streamed = "".join(ev.text for ev in events if isinstance(ev, Emitted))
    assert Counting.calls > 10 and streamed == events[-1].text == record.text
    stop = record.text[20:23]  # a stop string inside the output
    cut = engine.generate(prompt, max_tokens=40, params=greedy, ignore_eos=True, stop=[stop])
    assert cut.stop_reason == "stop" and stop not in cut.text and record.text.startswith(cut.text)
