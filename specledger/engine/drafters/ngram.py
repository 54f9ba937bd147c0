"""Prompt lookup decoding: propose what followed the last earlier occurrence of the context's tail.

Algorithm (per round, given ``context`` = prompt + committed output, length ``L``)::

    for n in max_ngram .. min_ngram:                      # longest n first
        key = context[L-n : L]
        j   = largest j <= L-1 with context[j-n : j] == key  # most recent earlier occurrence
        if j exists: return overlapping_copy(context, j, gamma)  # what followed it: gamma tokens
    return []                                             # no match: a plain decoding step

The copy overlaps: if ``j + gamma > L`` the continuation runs into the tail that was just
matched, so it is continued with period ``L - j`` (``a b a b`` proposes ``a b a ...``, not
just ``a b``); a match therefore always proposes exactly ``gamma`` tokens.

Choice of occurrence: the *most recent* one. Recent text is the likeliest to repeat (a
function being edited, a list being continued, the model's own output looping), and it is
what an incremental ``key -> position`` index gives for free by overwriting on insert.
Hugging Face's ``PromptLookupCandidateGenerator`` instead scans all windows of the n-gram
size and takes the *first* (earliest) match that has a non-empty continuation; vLLM and
llama.cpp's lookup examples differ again. Any choice is exact -- the verifier decides what
is kept -- only the acceptance rate differs.

Index invariant: ``self._next_pos[key] == j`` iff ``j`` is the largest position in
``1..len(indexed)-1`` with ``indexed[j-len(key) : j] == key``, for every key of length
``min_ngram..max_ngram``; i.e. only n-grams that already have a following token are
indexed, so the context's own tail never matches itself. Appending one token costs
``max_ngram - min_ngram + 1`` dict writes; a proposal costs at most that many lookups.
The index follows the committed context: if a context is not an extension of what was
indexed (a rollback, a new request without ``begin``), it is rebuilt from scratch.
"""

from __future__ import annotations

from typing import Any

from specledger.engine.drafters import catalog
from specledger.engine.drafters.base import Drafter, Proposal
from specledger.engine.sampling import SamplingParams
from specledger.engine.tree import DraftTree
from specledger.errors import require


def is_extension(context: list[int], indexed: list[int]) -> bool:
    """True iff ``indexed`` is a prefix of ``context`` (the context only grew since indexing)."""
    n = len(indexed)
    return len(context) >= n and (n == 0 or (context[n - 1] == indexed[-1] and context[:n] == indexed))


def overlapping_copy(tokens: list[int], start: int, count: int) -> list[int]:
    """``count`` tokens copied from ``start`` as if the copy were appended while it is read.

    ``out[k] = tokens[start + k]`` while that lies inside ``tokens``, else ``out[k - p]`` with
    period ``p = len(tokens) - start`` (LZ77-style overlapping copy): when the matched
    occurrence ends within ``count`` tokens of the end, the continuation runs into the
    context's own tail, which then repeats. A plain slice would stop short of ``count``.
    """
    out = tokens[start : start + count]
    period = len(tokens) - start
    while len(out) < count:
        out.append(out[len(out) - period])
    return out


class NgramDrafter(Drafter):
    """Prompt lookup decoding with an incremental n-gram index; always ``q=None`` (one-hot)."""

    spec = catalog.NGRAM
    name = spec.name
    uses_model = spec.needs_network

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        require(
            isinstance(min_ngram, int) and min_ngram >= 1,
            f"ngram min_ngram must be an integer >= 1, got {min_ngram!r}",
        )
        require(
            isinstance(max_ngram, int) and max_ngram >= min_ngram,
            f"ngram max_ngram must be an integer >= min_ngram ({min_ngram}), got {max_ngram!r}",
        )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._tokens: list[int] = []
        self._next_pos: dict[tuple[int, ...], int] = {}
        #: every occurrence per n-gram (kept only once trees are asked for: chains keep their speed)
        self._all_pos: dict[tuple[int, ...], list[int]] | None = None

    #: occurrences of one n-gram a tree proposal reads (most recent first)
    tree_occurrences: int = 16

    # -- index maintenance -------------------------------------------------------------------

    def _append(self, new_tokens: list[int]) -> None:
        """Index each new token ``t_j``: every n-gram ending just before it now points to ``j``."""
        tokens = self._tokens
        index = self._next_pos
        every = self._all_pos
        lo, hi = self.min_ngram, self.max_ngram
        for token in new_tokens:
            j = len(tokens)
            for n in range(lo, min(hi, j) + 1):
                key = tuple(tokens[j - n : j])
                index[key] = j
                if every is not None:
                    every.setdefault(key, []).append(j)
            tokens.append(token)

    def _sync(self, context: list[int]) -> None:
        """Make the index describe exactly ``context`` (extend if it grew, else rebuild)."""
        if not is_extension(context, self._tokens):
            self._tokens = []
            self._next_pos = {}
            self._all_pos = None if self._all_pos is None else {}
        if len(context) > len(self._tokens):
            self._append(context[len(self._tokens) :])

    def index_snapshot(self) -> dict[tuple[int, ...], int]:
        """A copy of the n-gram -> next-position index (for tests and debugging)."""
        return dict(self._next_pos)

    # -- Drafter hooks -----------------------------------------------------------------------

    def begin(self, prompt: list[int], params: SamplingParams) -> None:
        self._tokens = []
        self._next_pos = {}
        self._all_pos = None if self._all_pos is None else {}
        self._append(list(prompt))

    def propose(self, context: list[int], gamma: int, params: SamplingParams, rng: Any) -> Proposal:
        require(gamma >= 0, f"gamma must be >= 0, got {gamma}")
        self._sync(context)
        if gamma == 0:
            return Proposal()
        tokens = self._tokens
        length = len(tokens)
        for n in range(min(self.max_ngram, length), self.min_ngram - 1, -1):
            j = self._next_pos.get(tuple(tokens[length - n :]))
            if j is not None:
                return Proposal(tokens=overlapping_copy(tokens, j, gamma))
        return Proposal()

    def propose_tree(self, context: list[int], budget: int, max_depth: int, params: SamplingParams,
                     rng: Any) -> DraftTree:
        """Several continuations merged into a trie: for the longest matching n-gram first, what
        followed each of its most recent occurrences (``max_depth`` tokens each, overlapping copy),
        until ``budget`` nodes; deterministic (q=None). Siblings rank by recency."""
        require(budget >= 0 and max_depth >= 0, f"tree budget and depth must be >= 0, got {budget}, {max_depth}")
        if self._all_pos is None:  # first tree request: index every occurrence from now on
            self._all_pos = {}
            self._tokens, self._next_pos = [], {}
        self._sync(context)
        if budget == 0 or max_depth == 0:
            return DraftTree()
        tokens, length = self._tokens, len(self._tokens)
        node_tokens: list[int] = []
        parents: list[int] = []
        child: dict[tuple[int, int], int] = {}
        seen: set[int] = set()
        for n in range(min(self.max_ngram, length), self.min_ngram - 1, -1):
            for j in reversed(self._all_pos.get(tuple(tokens[length - n :]), [])[-self.tree_occurrences :]):
                if j in seen:
                    continue
                seen.add(j)
                parent = -1
                for t in overlapping_copy(tokens, j, max_depth):
                    node = child.get((parent, t))
                    if node is None:
                        if len(node_tokens) >= budget:
                            break
                        node = child[(parent, t)] = len(node_tokens)
                        node_tokens.append(t)
                        parents.append(parent)
                    parent = node
                if len(node_tokens) >= budget:
                    return DraftTree.build(node_tokens, parents)
        return DraftTree.build(node_tokens, parents)

    def commit(self, context: list[int]) -> None:
        self._sync(context)

    def end(self, prompt: list[int], output: list[int]) -> None:
        self._tokens = []
        self._next_pos = {}
        self._all_pos = None if self._all_pos is None else {}

    def fork(self) -> NgramDrafter:
        clone = NgramDrafter(self.max_ngram, self.min_ngram)  # all state is per request
        clone._all_pos = None if self._all_pos is None else {}
        clone.tree_shape = self.tree_shape
        return clone
