"""Shared machinery for drafters that run a network: the draft's own static KV cache.

Invariant: ``self.cached`` lists the tokens whose keys/values are valid in the draft cache,
and it is always a prefix of the committed context after ``commit``. ``propose`` feeds
whatever part of the context the cache lacks (at least the last committed token, i.e.
the bonus token of the previous round), then runs gamma autoregressive steps. Rejected
drafts are rolled back by truncating ``cached``; stale cache slots are overwritten.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from specledger.engine.drafters.base import Drafter, Proposal
from specledger.engine.sampling import SamplingParams, probs_from_logits


def common_prefix_len(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b``, assuming the first ``start`` items agree."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


class NeuralDrafter(Drafter):
    """Autoregressive drafting with a (possibly layer-subset) Transformer and its own cache."""

    uses_model = True

    def __init__(self, model: Any, layers: Sequence[int] | None = None, name: str = "neural") -> None:
        self.model = model
        self.layers = list(layers) if layers is not None else None
        self.name = name
        self.cache = None
        self.cached: list[int] = []
        self._validated = 0

    def _ensure_cache(self, needed: int) -> None:
        if self.cache is None or self.cache.capacity < needed:
            cap = max(needed, 2 * (self.cache.capacity if self.cache is not None else 512))
            cap = min(cap, max(needed, self.model.config.max_seq_len))
            self.cache = self.model.new_cache(cap)
            self.cached = []
            self._validated = 0

    def _forward(self, tokens: list[int], start: int, last_only: bool) -> torch.Tensor:
        ids = torch.tensor([tokens], device=self.model.device)
        return self.model(ids, start, self.cache, layers=self.layers, last_only=last_only)[0, -1]

    def begin(self, prompt: list[int], params: SamplingParams) -> None:
        """Prefill the draft cache with all but the last prompt token (that one is fed by the first propose)."""
        self._ensure_cache(len(prompt) + 64)
        self.cached = []
        self._validated = 0
        if len(prompt) > 1:
            with torch.inference_mode():
                self._forward(prompt[:-1], 0, last_only=True)
            self.cached = list(prompt[:-1])
            self._validated = len(self.cached)

    @torch.inference_mode()
    def propose(self, context: list[int], gamma: int, params: SamplingParams, rng: Any) -> Proposal:
        if gamma <= 0:
            return Proposal()
        self._ensure_cache(len(context) + gamma + 1)
        n = common_prefix_len(self.cached, context, self._validated)
        if n == len(context):  # must feed at least one token to get the next distribution
            n -= 1
        logits = self._forward(context[n:], n, last_only=True)
        self.cached[n:] = context[n:]  # append what the cache now holds; no full copy per round
        self._validated = len(context)
        tokens: list[int] = []
        qs = []
        for i in range(gamma):
            if params.greedy:
                tok = int(logits.argmax())
            else:
                q = probs_from_logits(logits, params)
                tok = int(torch.multinomial(q, 1, generator=rng))
                qs.append(q)
            tokens.append(tok)
            if i < gamma - 1:
                logits = self._forward([tok], len(self.cached), last_only=True)
                self.cached.append(tok)
        return Proposal(tokens, torch.stack(qs) if qs else None)

    def kv_bytes(self) -> int:
        """The draft cache as allocated (every layer, capacity rounded up), not just what is filled."""
        return 0 if self.cache is None else self.cache.kv.numel() * self.cache.kv.element_size()

    def fork(self) -> NeuralDrafter:
        """Same weights and layers (shared, read-only); a draft KV cache of its own, made on ``begin``."""
        clone = copy.copy(self)
        clone.cache, clone.cached, clone._validated = None, [], 0
        return clone

    def commit(self, context: list[int]) -> None:
        """Keep only the cached tokens that were committed (the accepted drafts)."""
        n = common_prefix_len(self.cached, context, self._validated)
        del self.cached[n:]
        self._validated = n
