"""The random-token control: prompts of uniformly random token ids.

Real text repeats itself and matches what a drafter learned; uniform random tokens do
neither, so acceptance on them is the floor against which every real category is read.
Prompt ``i`` is drawn from ``random.Random(f"random/{seed}/{i}")``, so the prompts for ``n``
are a prefix of the prompts for any larger ``n``.
"""

from __future__ import annotations

import random

from specledger.errors import require

from .item import WorkloadItem

#: SmolLM2's vocabulary size, the default for the "random" category.
DEFAULT_VOCAB_SIZE = 49152
DEFAULT_LENGTH = 64


def random_token_prompt(index: int, vocab_size: int, length: int, seed: int = 0) -> list[int]:
    """Prompt ``index``: ``length`` ids drawn uniformly from ``[0, vocab_size)``."""
    rng = random.Random(f"random/{seed}/{index}")
    return [rng.randrange(vocab_size) for _ in range(length)]


def random_token_prompts(n: int, vocab_size: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of ``length`` token ids, each uniform on ``[0, vocab_size)``; deterministic in ``seed``."""
    require(n >= 0, f"number of random prompts must be >= 0, got {n}")
    require(vocab_size >= 1, f"vocab_size must be >= 1, got {vocab_size}")
    require(length >= 1, f"random prompt length must be >= 1 token, got {length}")
    return [random_token_prompt(index, vocab_size, length, seed) for index in range(n)]


def random_token_items(
    n: int, vocab_size: int = DEFAULT_VOCAB_SIZE, length: int = DEFAULT_LENGTH, seed: int = 0
) -> list[WorkloadItem]:
    """The control as workload items: no text, the ids in ``meta["token_ids"]``, no reference."""
    prompts = random_token_prompts(n, vocab_size, length, seed)
    return [
        WorkloadItem(
            id=f"random/{seed}/{index}",
            category="random",
            messages=None,
            prompt=None,
            reference=None,
            meta={"source": "generated", "token_ids": token_ids, "vocab_size": vocab_size, "length": length},
        )
        for index, token_ids in enumerate(prompts)
    ]
