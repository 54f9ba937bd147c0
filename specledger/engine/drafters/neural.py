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
from typing import TYPE_CHECKING, Any

import torch

from specledger.engine.drafters.base import Drafter, Proposal
from specledger.engine.sampling import SamplingParams, probs_from_logits
from specledger.engine.tree import DraftTree, draft_rows, grow_tree

if TYPE_CHECKING:
    from specledger.engine.model import Transformer


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

    def __init__(self, model: Transformer, layers: Sequence[int] | None = None, name: str = "neural") -> None:
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

    #: tree proposals: children per node, and (under sampling) draw them from q without replacement
    #: (True, the drafter's true probabilities) or take the top-k deterministically (False, one-hot q)
    tree_topk: int = 4
    tree_draws: bool = True

    @torch.inference_mode()
    def propose_tree(self, context: list[int], budget: int, max_depth: int, params: SamplingParams,
                     rng: Any) -> DraftTree:
        """EAGLE-2-style top-k tree (:func:`specledger.engine.tree.grow_tree`): one draft pass per wave
        of new nodes, each attending over the context and its own ancestors (tree nodes' k/v sit in
        the draft cache past the context and are dropped after the round; the accepted path and
        bonus are fed at the next round, as a chain's bonus is)."""
        if budget <= 0 or max_depth <= 0:
            return DraftTree()
        root_logits, expand = self._tree_pass(context, budget)
        return grow_tree(root_logits, expand, budget, max_depth, params, rng, topk=self.tree_topk,
                         draws=self.tree_draws)

    @torch.inference_mode()
    def propose_shaped(self, context: list[int], shape: Any, params: SamplingParams, rng: Any) -> DraftTree:
        """The DP's static ``shape`` filled with this drafter's top-k per node, one draft pass per level
        (:func:`specledger.engine.tree_shape.fill_shape`); the same draft cache layout as :meth:`propose_tree`."""
        from specledger.engine.tree_shape import fill_shape
        from specledger.ledger.trees import count_nodes

        if not shape:
            return DraftTree()
        root_logits, expand = self._tree_pass(context, count_nodes(shape))
        return fill_shape(root_logits, expand, shape, params, rng, draws=self.tree_draws)

    def _tree_pass(self, context: list[int], budget: int) -> tuple[torch.Tensor, Any]:
        """Feed the context the draft cache lacks; (the root's logits, an ``expand`` over tree nodes)."""
        n_ctx = len(context)
        self._ensure_cache(n_ctx + budget + 1)
        n = common_prefix_len(self.cached, context, self._validated)
        if n == n_ctx:
            n -= 1
        root_logits = self._forward(context[n:], n, last_only=True)
        self.cached[n:] = context[n:]
        self._validated = n_ctx
        written = 0
        depth: list[int] = []

        def expand(nodes: list[int], tokens: list[int], parents: list[int]) -> torch.Tensor:
            nonlocal written
            hi = max(nodes) + 1
            rows, mask = draft_rows(parents, depth, written, hi, n_ctx)
            logits = self.model.forward_tree_draft([tokens[i] for i in rows], [n_ctx - 1 + depth[i] for i in rows],
                                                   n_ctx + written, mask, self.cache, self.layers)
            written = hi
            return logits[[i - rows[0] for i in nodes]]

        return root_logits, expand

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
