"""The learned ``head`` drafter on tiny random models: exactness, true q, file errors, train-head."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from scipy import stats

from specledger.engine.batch import BatchEngine, BatchRequest
from specledger.engine.decode import Engine
from specledger.engine.drafters.head import (
    HeadConfig,
    HeadDrafter,
    HeadNet,
    load_head,
    make_head_drafter,
    save_head,
    target_fingerprint,
)
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.sampling import SamplingParams
from specledger.engine.tree import DraftTree
from specledger.errors import SpecLedgerError
from specledger.headtrain.train import TrainSettings, generate_corpus, prefill_corpus, train_head
from tests.conftest import CharLoaded, exact_tokens_2_3, tiny_model


class _Loaded(CharLoaded):
    """LoadedModel's slice train-head uses, over the character tokenizer (ids folded into the vocabulary)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model, self.eos_token_ids, self.name = model, [], "tiny"

    def encode_prompt(self, prompt=None, messages=None, chat=True):
        return [t % self.model.config.vocab_size for t in super().encode_prompt(prompt, messages, chat)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, target):
    """A head trained by train-head for a few seconds on the tiny target (math train split)."""
    path = tmp_path_factory.mktemp("head") / "tiny.safetensors"
    settings = TrainSettings(minutes=10, categories=["math"], max_new_tokens=40, draft_vocab=48, hidden_dim=32,
                             max_prompt_tokens=200, window=64, max_prompts=48, max_steps=120,
                             max_prefill_prompts=16, prefill_max_tokens=300)
    figures = train_head(_Loaded(target), settings, path)
    return path, figures


def _prompts(n: int, vocab: int, seed: int = 1) -> list[list[int]]:
    """Math prompts of the MEASURE split (the head trained on the train split), cut to 20-60 tokens."""
    from specledger.workloads import load_category

    loaded, rnd = _Loaded(tiny_model(2, vocab=vocab)), random.Random(seed)
    return [loaded.encode_prompt(prompt=item.text)[: rnd.randrange(20, 60)]
            for item in load_category("math", n, seed=seed)]


def test_train_head_writes_a_loadable_file_with_its_figures(trained, target):
    path, figures = trained
    head = load_head(path, target)
    assert head.fingerprint == target_fingerprint(target)
    assert head.draft_vocab is not None and len(head.draft_vocab) == 48
    assert figures["train_steps"] >= 1 and figures["tokens"] > 0 and figures["answer_tokens"] > 0
    assert head.figures["train_steps"] == figures["train_steps"]
    assert figures["file_bytes"] == path.stat().st_size
    assert 0.0 <= figures["val_top1"] <= 1.0
    assert figures["prefill_tokens"] > 0 and figures["tokens"] > figures["prefill_tokens"]
    assert figures["val_top1_answer"] is None or 0.0 <= figures["val_top1_answer"] <= 1.0


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_with_the_head_is_token_identical_to_plain(trained, target, gamma):
    engine = Engine(target)
    drafter = make_head_drafter(target, trained[0])
    accepted = 0
    for prompt in _prompts(6, target.config.vocab_size):
        plain = engine.generate(prompt, max_tokens=40)
        spec = engine.generate(prompt, drafter=drafter, gamma=gamma, max_tokens=40)
        assert spec.token_ids == plain.token_ids
        assert sum(r.committed for r in spec.rounds) + 1 == spec.output_tokens
        accepted += sum(r.accepted for r in spec.rounds)
        assert len(drafter.step_topk) >= 1 and all(len(ids) == 4 for ids, _ in drafter.step_topk)
    assert accepted > 0, "the head never got a token accepted: rollback would not be exercised"


def test_the_full_vocabulary_head_proposes_outside_the_draft_vocabulary_and_stays_exact(trained, target):
    """``full_vocab``: the same trained layer over the target's whole LM head; greedy output unchanged."""
    engine = Engine(target)
    full = make_head_drafter(target, trained[0], full_vocab=True)
    assert full.vocab_ids is None and full.lm_head is target.lm_head
    reduced = make_head_drafter(target, trained[0])
    assert reduced.vocab_ids is not None and len(reduced.vocab_ids) == 48 < target.config.vocab_size
    proposed = set()
    for prompt in _prompts(4, target.config.vocab_size):
        plain = engine.generate(prompt, max_tokens=30)
        spec = engine.generate(prompt, drafter=full, gamma=3, max_tokens=30)
        assert spec.token_ids == plain.token_ids
        proposed.update(i for ids, _ in full.step_topk for i in ids)
    assert proposed - set(reduced.vocab_ids.tolist()), "the full-vocabulary head only proposed draft-vocabulary ids"


def test_batched_greedy_with_the_head_equals_solo_plain_even_when_preempted(trained, target):
    engine = Engine(target)
    prompts = [p[:14] for p in _prompts(8, target.config.vocab_size, seed=3)]
    plain = [engine.generate(p, max_tokens=30).token_ids for p in prompts]
    drafter = make_head_drafter(target, trained[0])
    batch = BatchEngine(target, max_batch=4, capacity=128, kv_budget_tokens=90)
    records = batch.run([BatchRequest(p, max_tokens=30, request_id=str(i)) for i, p in enumerate(prompts)],
                        drafter.fork, gamma=3, concurrency=4)
    assert {r.request_id: r.token_ids for r in records} == {str(i): t for i, t in enumerate(plain)}
    assert batch.preemptions > 0


def test_sampled_proposals_carry_the_true_q(trained, target):
    drafter = make_head_drafter(target, trained[0])
    engine = Engine(target)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    with torch.inference_mode():
        _, hidden = target(torch.tensor([prompt]), 0, target.new_cache(64), return_hidden=True)
    drafter.observe_hidden(0, hidden[0])
    drafter.begin(prompt, params)
    prop = drafter.propose(prompt + [5], 4, params, torch.Generator().manual_seed(0))
    assert len(prop.tokens) == 4 and prop.q.shape == (4, target.config.vocab_size)
    q = prop.q
    assert torch.allclose(q.sum(-1), torch.ones(4), atol=1e-5) and bool((q >= 0).all())
    assert all(float(q[i, t]) > 0 for i, t in enumerate(prop.tokens))
    outside = torch.ones(target.config.vocab_size, dtype=torch.bool)
    outside[drafter.vocab_ids] = False
    assert float(q[:, outside].sum()) == 0.0  # the reduced draft vocabulary: q = 0 outside it
    # and the sampled engine path runs end to end
    rec = engine.generate(prompt, drafter=drafter, gamma=3, max_tokens=20, params=params, ignore_eos=True)
    assert rec.output_tokens == 20


def _chi2_pvalue(samples: list[int], probs: np.ndarray) -> float:
    counts = np.bincount(samples, minlength=len(probs))
    keep = probs * len(samples) >= 5
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(probs[keep], probs[~keep].sum()) * len(samples)
    mask = expected > 0
    return float(stats.chisquare(observed[mask], expected[mask] * observed[mask].sum() / expected[mask].sum()).pvalue)


def _reduced_vocab_head(tmp_path, vocab: int, prompt: list[int]):
    """(tiny target, a random head drafter whose draft vocabulary lacks token 2, the exact joint of tokens
    2-3 of ``prompt`` under the target at T = 1)."""
    target = tiny_model(11, vocab=vocab, n_layers=2, dim=16)
    torch.manual_seed(5)
    net = HeadNet(HeadConfig.for_target(target.config, hidden_dim=16, draft_vocab=3))
    path = save_head(tmp_path / "h.safetensors", net, torch.tensor([0, 1, 3]), target_fingerprint(target))
    return target, make_head_drafter(target, path), exact_tokens_2_3(target, prompt, SamplingParams(temperature=1.0))


def test_sampled_speculation_with_a_reduced_vocabulary_head_keeps_the_target_distribution(tmp_path):
    """Tokens 2-3 come from one round (gamma=2) of a random head whose draft vocabulary lacks a token."""
    vocab, prompt = 4, [1, 2, 3]
    target, drafter, exact = _reduced_vocab_head(tmp_path, vocab, prompt)
    engine = Engine(target)
    samples, proposed = [], 0
    for seed in range(2500):
        rec = engine.generate(prompt, drafter=drafter, gamma=2, max_tokens=3,
                              params=SamplingParams(temperature=1.0, seed=seed), ignore_eos=True)
        samples.append(rec.token_ids[1] * vocab + rec.token_ids[2])
        proposed += sum(r.proposed for r in rec.rounds)
    assert proposed > 0
    assert _chi2_pvalue(samples, exact / exact.sum()) > 1e-3


def test_head_file_errors_are_one_line(trained, target, tmp_path):
    path = trained[0]
    other_dim = tiny_model(2, dim=48)
    other_vocab = tiny_model(2, vocab=80)
    other_weights = tiny_model(9)
    for other, words in ((other_dim, "hidden size 32"), (other_vocab, "vocabulary 64"),
                         (other_weights, "another target")):
        with pytest.raises(SpecLedgerError) as err:
            load_head(path, other)
        assert words in str(err.value) and "train-head" in str(err.value) and "\n" not in str(err.value)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00\x01not a safetensors file at all" * 3)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    for bad in (garbage, truncated):
        with pytest.raises(SpecLedgerError) as err:
            load_head(bad, target)
        assert "corrupt" in str(err.value) and "train-head" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SpecLedgerError) as err:
        load_head(tmp_path / "missing.safetensors", target)
    assert "not found" in str(err.value) and "specledger train-head" in str(err.value)


def test_registry_builds_the_head_from_a_file_or_names_the_command(trained, target, tmp_path, monkeypatch):
    engine = Engine(target)
    drafter = make_drafter("head", engine, draft_path=str(trained[0]))
    assert isinstance(drafter, HeadDrafter) and drafter.name == "head"
    monkeypatch.setenv("SPECLEDGER_CACHE", str(tmp_path))
    with pytest.raises(SpecLedgerError) as err:
        make_drafter("head", engine)
    assert "no trained head for this target" in str(err.value) and "specledger train-head" in str(err.value)


def test_the_drafters_first_token_is_the_training_paths_prediction(trained, target):
    """Issue 20: what ``propose`` drafts first at every round equals what training teacher-forces for the
    same context -- ``fc([embed(c_j); f_{j-1}])`` over the committed sequence, read at the last position --
    so a head's teacher-forced top-1 is its first-token acceptance at run time."""
    engine = Engine(target)
    drafter = make_head_drafter(target, trained[0])
    net, rounds = drafter.net, []
    original = drafter.propose

    def spy(context, gamma, params, rng):
        proposal = original(context, gamma, params, rng)
        rounds.append((len(context), list(proposal.tokens), drafter.step_topk[0]))
        return proposal

    drafter.propose = spy
    for prompt in _prompts(3, target.config.vocab_size, seed=4):
        rounds.clear()
        out = engine.generate(prompt, drafter=drafter, gamma=3, max_tokens=30).token_ids
        seq = list(prompt) + list(out)
        with torch.inference_mode():
            _, hidden = target(torch.tensor([seq]), 0, target.new_cache(len(seq)), return_hidden=True)
            prev = torch.cat((torch.zeros_like(hidden[:, :1]), hidden[:, :-1]), dim=1)
            kv = torch.zeros(2, 1, net.hc.n_kv_heads, len(seq), net.hc.head_dim)
            pred = net(target.embed(torch.tensor([seq])), prev, kv, 0)[0]
            probs = torch.softmax(drafter.lm_head(pred).float(), dim=-1)
        assert rounds
        for n, tokens, (ids, p) in rounds:
            index = [int((drafter.vocab_ids == t).nonzero()) for t in ids]
            assert tokens[0] == ids[0]
            assert torch.allclose(probs[n - 1, index], torch.tensor(p), atol=1e-4), (n, ids)


def test_prefill_passes_give_the_same_pairs_as_generation(target):
    """A teacher-forced pass over (prompt + the target's greedy answer) yields the features and labels the
    generating passes kept: features f_j of every position, labels y_j = the target's argmax after c_j."""
    prompts = _prompts(3, target.config.vocab_size, seed=5)
    gen = generate_corpus(target, [], prompts, 12, deadline=float("inf"), max_batch=2)
    full = [torch.cat((t, lab[-1:])).tolist() for t, lab in zip(gen.tokens, gen.labels)]
    pre = prefill_corpus(target, full, 512, deadline=float("inf"))
    assert pre.prefill_tokens == sum(len(s) for s in full) and not any(a.any() for a in pre.answer)
    for i, seq in enumerate(full):
        n = len(seq) - 1
        assert torch.equal(pre.labels[i][:n], gen.labels[i])
        assert torch.allclose(pre.feats[i][:n].float(), gen.feats[i].float(), atol=0.05, rtol=0.02)
        assert gen.answer[i].sum() == n - len(prompts[i]) + 1


def test_head_without_target_features_proposes_nothing(trained, target):
    drafter = make_head_drafter(target, trained[0])
    drafter.begin([1, 2, 3], SamplingParams())
    assert drafter.propose([1, 2, 3, 4], 3, SamplingParams(), None).tokens == []


def test_return_hidden_leaves_the_logits_unchanged(target):
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.inference_mode():
        plain = target(tokens, 0, target.new_cache(16))
        logits, hidden = target(tokens, 0, target.new_cache(16), return_hidden=True)
        last, _ = target(tokens, 0, target.new_cache(16), last_only=True, return_hidden=True)
        packed = target.forward_packed([1, 2, 3], [0, 0, 0], [0, 1, 2], target.new_cache(16))
        packed_h, hid = target.forward_packed([1, 2, 3], [0, 0, 0], [0, 1, 2], target.new_cache(16),
                                              return_hidden=True)
    assert torch.equal(plain, logits) and hidden.shape == (1, 6, target.config.dim)
    assert torch.equal(last[0, -1], plain[0, -1])
    assert torch.equal(packed, packed_h) and hid.shape == (3, target.config.dim)


# ---------------------------------------------------------------------------- the head in token trees


@pytest.mark.parametrize("budget", [4, 8, 16, 32])
def test_greedy_head_trees_are_token_identical_to_plain(trained, target, budget):
    engine = Engine(target)
    drafter = make_head_drafter(target, trained[0])
    accepted = branched = deep = 0
    for prompt in _prompts(5, target.config.vocab_size, seed=2):
        plain = engine.generate(prompt, max_tokens=36)
        spec = engine.generate(prompt, drafter=drafter, gamma=5, max_tokens=36, tree_budget=budget)
        assert spec.token_ids == plain.token_ids
        for rd in spec.rounds:
            tree = DraftTree([0] * rd.proposed, rd.tree_parents)
            assert rd.proposed <= budget and tree.depth() <= 5
            branched += not tree.is_chain
            accepted += rd.accepted
            deep += rd.accepted >= 2  # the head's features after a speculative step are right
    assert accepted > 0 and deep > 0 and (branched > 0 or budget <= 5)


def test_the_head_tree_follows_the_chain_on_its_first_ranked_path(trained, target):
    """The rank-0 path of a static shape is the greedy chain: tree rows see the same context and features
    as the chain's one-row head steps (the tree mask and positions are right)."""
    drafter = make_head_drafter(target, trained[0])
    params = SamplingParams()
    for prompt in _prompts(4, target.config.vocab_size, seed=8):
        with torch.inference_mode():
            _, hidden = target(torch.tensor([prompt]), 0, target.new_cache(256), return_hidden=True)
        context = prompt + [int(prompt[-1])]
        drafter.observe_hidden(0, hidden[0])
        drafter.begin(prompt, params)
        chain = drafter.propose(context, 3, params, None).tokens
        tree = drafter.propose_shaped(context, ((((),),), ((),)), params, None)  # a 3-deep first branch
        assert [tree.tokens[i] for i in tree.path(2)] == chain
        assert tree.widths() == [2, 2, 1]


def test_batched_greedy_head_trees_equal_solo_plain_even_when_preempted(trained, target):
    engine = Engine(target)
    prompts = [p[:14] for p in _prompts(8, target.config.vocab_size, seed=3)]
    plain = [engine.generate(p, max_tokens=30).token_ids for p in prompts]
    drafter = make_head_drafter(target, trained[0])
    batch = BatchEngine(target, max_batch=4, capacity=128, kv_budget_tokens=110)
    reqs = [BatchRequest(p, max_tokens=30, request_id=str(i), tree_budget=0 if i % 3 == 0 else 8)
            for i, p in enumerate(prompts)]
    records = batch.run(reqs, drafter.fork, gamma=4, concurrency=4)
    assert {r.request_id: r.token_ids for r in records} == {str(i): t for i, t in enumerate(plain)}
    assert any(rd.tree_parents and rd.accepted for r in records for rd in r.rounds)
    assert batch.preemptions > 0


def test_the_head_fills_the_dp_static_shape(trained, target):
    from specledger.engine.tree_shape import StaticTreeShape
    from specledger.ledger.trees import width_per_depth

    engine = Engine(target)
    drafter = make_head_drafter(target, trained[0])
    drafter.tree_shape = StaticTreeShape([[0.6, 0.2, 0.1]], "test")
    for prompt in _prompts(3, target.config.vocab_size, seed=4):
        spec = engine.generate(prompt, drafter=drafter, gamma=4, max_tokens=30, tree_budget=8)
        assert spec.token_ids == engine.generate(prompt, max_tokens=30).token_ids
        full = [rd for rd in spec.rounds if rd.gamma == 4 and rd.proposed]
        assert full and all(DraftTree([0] * rd.proposed, rd.tree_parents).widths()
                            == width_per_depth(drafter.tree_shape.shape_for(8, 4)) for rd in full)


def test_sampled_head_trees_with_a_reduced_vocabulary_keep_the_target_distribution(tmp_path):
    """Tokens 2-3 from one tree round (budget 5, depth 2) of a random head whose draft vocabulary lacks a token."""
    vocab = 4
    target, drafter, exact = _reduced_vocab_head(tmp_path, vocab, [1, 2, 3])
    engine = Engine(target)
    samples, branched = [], 0
    for seed in range(2500):
        rec = engine.generate([1, 2, 3], drafter=drafter, gamma=2, max_tokens=3, tree_budget=5,
                              params=SamplingParams(temperature=1.0, seed=seed), ignore_eos=True)
        samples.append(rec.token_ids[1] * vocab + rec.token_ids[2])
        rd = rec.rounds[0]
        branched += not DraftTree([0] * rd.proposed, rd.tree_parents).is_chain
    assert branched > 1000
    assert _chi2_pvalue(samples, exact / exact.sum()) > 1e-3


def test_a_chunked_prefill_gives_the_head_the_same_features_and_rounds(trained, target):
    """Side by side, prefills run in passes (``prefill_chunk``); the head reads the prompt's features from all of
    them, so its proposals -- rounds, accepted counts -- are those of a one-pass prefill."""
    from specledger.engine.request import PrefillProgress

    engine = Engine(target)
    prompt = [t for p in _prompts(8, target.config.vocab_size) for t in p][:150]
    assert len(prompt) == 150
    one = engine.generate(prompt, drafter=make_head_drafter(target, trained[0]), gamma=3, max_tokens=30)
    events = list(engine.stream(prompt, drafter=make_head_drafter(target, trained[0]), gamma=3, max_tokens=30,
                                prefill_chunk=64))
    chunked = events[-1]
    assert [(e.done, e.total) for e in events if isinstance(e, PrefillProgress)] == [(64, 150), (128, 150)]
    assert chunked.token_ids == one.token_ids
    assert [r.accepted for r in chunked.rounds] == [r.accepted for r in one.rounds]
