"""Integration on the real SmolLM2-135M-Instruct (converted once, then cached): every drafter's
greedy output is token-identical to plain greedy decoding on real prompts."""

from __future__ import annotations

import pytest
import torch

from specledger.engine.decode import Engine
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.loader import load_model
from specledger.engine.sampling import SamplingParams
from specledger.workloads import load_category

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def engine():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield Engine.from_loaded(load_model(None, dtype="float32"))
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompts(engine):
    items = load_category("code-edit", 1) + load_category("dialogue", 1) + load_category("math", 1)
    return [engine.loaded.encode_prompt(messages=it.messages) for it in items]


@pytest.fixture(scope="module")
def plain(engine, prompts):
    return [engine.generate(p, max_tokens=24) for p in prompts]


@pytest.mark.parametrize(
    "name,gammas",
    [("ngram", (1, 3, 8)), ("suffix", (3, 8)), ("layerskip", (1, 3)), ("quant-self", (3,))],
)
def test_real_greedy_speculation_is_token_identical(engine, prompts, plain, name, gammas):
    drafter = make_drafter(name, engine, layers="10" if name == "layerskip" else None)
    for gamma in gammas:
        for ids, ref in zip(prompts, plain):
            rec = engine.generate(ids, drafter=drafter, gamma=gamma, max_tokens=24)
            assert rec.token_ids == ref.token_ids, (name, gamma, rec.text, ref.text)
            assert rec.text == ref.text


def test_real_chat_answer_is_sensible_and_stops(engine):
    ids = engine.loaded.encode_prompt("What is the capital of France? Answer in one word.")
    rec = engine.generate(ids, drafter=make_drafter("ngram", engine), gamma=4, max_tokens=32)
    assert "Paris" in rec.text
    assert rec.stop_reason == "eos" and rec.output_tokens < 32


def test_real_sampling_is_reproducible(engine, prompts):
    d = make_drafter("quant-self", engine)
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=3)
    a = engine.generate(prompts[1], drafter=d, gamma=3, max_tokens=16, params=params)
    b = engine.generate(prompts[1], drafter=d, gamma=3, max_tokens=16, params=params)
    assert a.token_ids == b.token_ids and a.output_tokens == 16


def test_streamed_text_is_the_tokenizers_text_piece_by_piece(engine):
    """The server's stream (no stop strings) decodes a window per round, not the whole output: the pieces, sent as
    the output grows by 1-4 tokens a round, join to exactly ``decode(all)`` and never carry a replacement
    character that the whole decode lacks (multi-byte characters split across tokens: emoji, CJK, accents)."""
    import random

    from specledger.engine.request import StopReleaser

    tok = engine.tokenizer

    def decode(ids):
        return tok.decode(list(ids), skip_special_tokens=True)

    texts = ["Grüße aus Köln! 🙂🚀 こんにちは世界, naïve café — ½ ✓", "def f(x):\n    return x ** 2  # 平方\n",
             "  leading spaces and\ttabs\n\nnew paragraphs 🎉🎉🎉 end"]
    rnd = random.Random(7)
    vocab = engine.model.config.vocab_size
    streams = [list(tok.encode(t)) for t in texts] + [[rnd.randrange(vocab) for _ in range(60)] for _ in range(3)]
    for ids in streams:
        rel, out, pieces = StopReleaser(decode), [], []
        while len(out) < len(ids):
            out.extend(ids[len(out): len(out) + rnd.randint(1, 4)])
            final = len(out) == len(ids)
            _, delta, _, _ = rel.advance(out, "length" if final else "")
            pieces.append(delta)
        whole = decode(ids)
        assert "".join(pieces) == whole == rel.text
        assert all("\ufffd" not in p for p in pieces) or "\ufffd" in whole
