"""Shared fixtures: tiny random Llama models (fast, exact) and a character tokenizer."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from specledger.engine.model import Transformer
from specledger.engine.model_config import ModelConfig

# Tiny models run faster on one thread, and a second OpenMP thread spin-waits badly when the
# other core is busy (2-core CI machine). Tests assert behaviour, never speed.
torch.set_num_threads(1)
# A busy test machine must not change what a test runs: the main job's disturbance watch (a disturbed prompt is
# measured again) is off unless a test turns it on (tests/test_disturbance.py).
os.environ.setdefault("SPECLEDGER_DISTURBANCE", "off")


def tiny_model(
    seed: int = 0, vocab: int = 64, n_layers: int = 3, dim: int = 32, max_seq_len: int = 512
) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=vocab,
        dim=dim,
        n_layers=n_layers,
        n_heads=4,
        n_kv_heads=2,
        hidden_dim=2 * dim,
        tie_embeddings=False,
        max_seq_len=max_seq_len,
    )
    model = Transformer(cfg)
    with torch.no_grad():  # larger embeddings -> peakier, more repetitive distributions
        model.embed.weight.mul_(3.0)
    return model.eval().requires_grad_(False)


class CharTokenizer:
    """Token i <-> one character; enough to test stop strings across token boundaries."""

    ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?-_()[]{}<>/+*=#@"

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.ALPHABET[i % len(self.ALPHABET)] for i in ids)

    def encode(self, text: str) -> list[int]:
        return [self.ALPHABET.index(c) for c in text]

    def get_vocab(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.ALPHABET)}


class CharLoaded:
    """The slice of LoadedModel that runners use (prompt encoding) over a character tokenizer."""

    def __init__(self) -> None:
        self.tokenizer = CharTokenizer()

    def encode_prompt(self, prompt=None, messages=None, chat=True):
        text = prompt if prompt is not None else " ".join(m["content"] for m in messages)
        return [self.tokenizer.ALPHABET.index(c) for c in text if c in self.tokenizer.ALPHABET]


@pytest.fixture(scope="session")
def target():
    return tiny_model(2)


@pytest.fixture(scope="session")
def char_tokenizer():
    return CharTokenizer()


def exact_tokens_2_3(target, prompt: list[int], params) -> np.ndarray:
    """The target's exact joint distribution of output tokens 2 and 3 (index t2 * V + t3), marginal over token 1:
    the reference the sampled-speculation distribution tests compare against."""
    from specledger.engine.sampling import probs_from_logits

    vocab = target.config.vocab_size
    cache = target.new_cache(16)
    exact = np.zeros(vocab * vocab)
    with torch.inference_mode():
        p1 = probs_from_logits(target(torch.tensor([prompt]), 0, cache)[0, -1], params)
        for t1 in range(vocab):
            p2 = probs_from_logits(target(torch.tensor([prompt + [t1]]), 0, cache)[0, -1], params)
            for t2 in range(vocab):
                p3 = probs_from_logits(target(torch.tensor([prompt + [t1, t2]]), 0, cache)[0, -1], params)
                exact[t2 * vocab : (t2 + 1) * vocab] += float(p1[t1]) * float(p2[t2]) * p3.numpy()
    return exact


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run ``specledger ARGV`` in-process: (exit code, stdout, stderr)."""
    from specledger.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def char_engine(target, max_context: int = 512):
    """An Engine over the tiny ``target`` with the character tokenizer and a loaded stand-in (runs and loads)."""
    from specledger.engine.decode import Engine

    e = Engine(target, tokenizer=CharTokenizer(), max_context=max_context, name="tiny", dtype="float32")
    e.loaded = CharLoaded()
    return e
