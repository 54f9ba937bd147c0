"""Token trees in the engine: the proposal, its verification, and top-k growth for model drafters.

A :class:`DraftTree` hangs below the last committed token (the *root*, row 0 of the verify pass).
Node ``i`` (row ``i + 1``) holds ``tokens[i]`` and its parent ``parents[i]`` (-1: the root).
Nodes are in DFS preorder with siblings in rank order (the order they were proposed or drawn),
so a node's parent always precedes it and the last node is always a leaf (trimming the tail
keeps a tree). A chain is the one-branch tree ``parents == [-1, 0, 1, ...]``.

The verify pass (:meth:`specledger.engine.model.Transformer.forward_tree`) runs row ``r`` at
position ``start + depth(r)``. Because rows are in DFS preorder, when row ``r`` runs, the cache
slots ``start .. start + depth(r) - 1`` hold exactly its ancestors' keys and values (each row
writes its own k/v at its depth slot just before attending), so each row attends over its own
root-to-node path with the very call a plain decode step makes: a tree row is computed bit for
bit like plain decoding of that path. Every row's new k/v is also kept aside; committing the
accepted path copies its rows into slots ``start + 1 ..`` (no second forward), and the pointer
moves as for a chain.

Verification (exact):

* greedy: from the root, follow the child whose token is the target's argmax; stop where no
  child matches and emit the argmax there. Token-identical to plain greedy decoding.
* sampling, recursive rejection over siblings (SpecInfer, EAGLE): at a node with target
  distribution ``p`` and children ``c_1 .. c_m`` in rank order, try them in turn. If the
  children were drawn without replacement from the drafter's ``q`` (``tree.q`` holds ``q``
  per parent row), accept ``c_j`` with probability ``min(1, p(c_j) / q(c_j))``; on rejection
  ``p <- norm(max(0, p - q))`` and ``q <- norm(q without c_j)``. Deterministic children
  (``tree.q is None``: model-free proposals, or a fixed top-k) have one-hot ``q``: accept
  ``c_j`` with probability ``p(c_j)``, on rejection ``p <- norm(p without c_j)``. An accepted
  child becomes the next node; if every child is rejected, emit a sample of the current ``p``;
  at a leaf, emit a sample of its ``p``. Every emitted token is then distributed exactly as
  the target's. Exactness needs the *set* of siblings a node gets to be decided without
  looking at their own values beyond the draw order: :func:`grow_tree` keeps that rule.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specledger.engine.sampling import SamplingParams, probs_from_logits
from specledger.engine.verify import argmax_rows
from specledger.errors import SpecLedgerError


@dataclass(slots=True)
class DraftTree:
    """Candidate tokens as a tree (see the module docstring for the layout)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    #: None: deterministic siblings (one-hot q); else [rows, V], row r the distribution the children
    #: of row r (0 root, i + 1 node i) were drawn from without replacement, in rank order
    q: Any = None

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: Sequence[int], q: Any = None) -> DraftTree:
        """The one-branch tree; ``q`` rows as a chain proposal's (row i: distribution of token i)."""
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), q)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Depth of every node (a root child has depth 1)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def depth(self) -> int:
        return max(self.depths(), default=0)

    def children(self) -> list[list[int]]:
        """Children (node indices, rank order) of every row: entry 0 the root's, entry i + 1 node i's."""
        kids: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i)
        return kids

    def widths(self) -> list[int]:
        """Nodes per depth (index 0 = depth 1)."""
        out = [0] * self.depth()
        for d in self.depths():
            out[d - 1] += 1
        return out

    def ranks(self) -> list[int]:
        """Each node's rank among its siblings (0 = first)."""
        seen: dict[int, int] = {}
        out = []
        for p in self.parents:
            out.append(seen.get(p, 0))
            seen[p] = out[-1] + 1
        return out

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node``."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def trimmed(self, nodes: int, max_depth: int | None = None) -> DraftTree:
        """The first ``nodes`` nodes (DFS preorder: still a tree) without nodes deeper than ``max_depth``."""
        keep = list(range(min(nodes, len(self.tokens))))
        if max_depth is not None:
            depths = self.depths()
            keep = [i for i in keep if depths[i] <= max_depth]
        if len(keep) == len(self.tokens):
            return self
        return self.select(keep)

    def select(self, keep: Sequence[int]) -> DraftTree:
        """The subtree of the nodes ``keep`` (ancestor-closed, increasing)."""
        new_index = {old: new for new, old in enumerate(keep)}
        parents = [new_index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep]
        q = None
        if self.q is not None:
            rows = [0] + [i + 1 for i in keep]
            have = [r for r in rows if r < len(self.q)]
            q = self.q.new_zeros(len(rows), self.q.shape[-1])  # leaves' rows are never read
            q[: len(have)] = self.q[torch.tensor(have, dtype=torch.long)]
        return DraftTree([self.tokens[i] for i in keep], parents, q)

    @classmethod
    def build(cls, tokens: Sequence[int], parents: Sequence[int], q_rows: dict[int, torch.Tensor] | None = None,
              ) -> DraftTree:
        """Normalise nodes given in any parent-first order (siblings in rank order) to DFS preorder;
        a sibling repeating an earlier sibling's token is dropped with its subtree. ``q_rows`` maps
        a row (0 root, i + 1 input node i) to the distribution its children were drawn from."""
        n = len(tokens)
        kids: list[list[int]] = [[] for _ in range(n + 1)]
        for i, p in enumerate(parents):
            if not -1 <= p < i:
                raise SpecLedgerError(f"tree node {i} has parent {p}; parents must precede their children")
            kids[p + 1].append(i)
        order: list[int] = []
        stack = [(-1, 0)]
        while stack:
            node, k = stack.pop()
            row = node + 1
            if k < len(kids[row]):
                stack.append((node, k + 1))
                child = kids[row][k]
                if any(tokens[s] == tokens[child] for s in kids[row][:k]):
                    continue
                order.append(child)
                stack.append((child, 0))
        new_index = {old: new for new, old in enumerate(order)}
        new_parents = [new_index[parents[i]] if parents[i] >= 0 else -1 for i in order]
        q = None
        if q_rows is not None:
            sample = next(iter(q_rows.values()))
            q = sample.new_zeros(len(order) + 1, sample.shape[-1])
            for old_row, dist in q_rows.items():
                new_row = 0 if old_row == 0 else (new_index.get(old_row - 1, -2) + 1)
                if new_row >= 0:
                    q[new_row] = dist
        return cls([int(tokens[i]) for i in order], new_parents, q)

    def positions(self, start: int) -> list[int]:
        """Verify-pass positions of the rows ``[root] + nodes``: the root at ``start``, a node at ``start + depth``."""
        return [start] + [start + d for d in self.depths()]

    def to_record(self) -> list[int]:
        return list(self.parents)


def draft_rows(parents: Sequence[int], depth: list[int], written: int, hi: int, n_ctx: int
               ) -> tuple[list[int], torch.Tensor]:
    """Nodes ``written .. hi - 1`` of a tree being drafted over ``n_ctx`` committed positions, as one
    draft pass sees them: extends ``depth`` (1 for a root child, parent's + 1 below; in place) and
    returns (the rows, their attention mask [rows, n_ctx + hi]): every row sees the whole context and
    its own ancestor chain, itself included, and no other node."""
    rows = list(range(written, hi))
    for i in range(len(depth), hi):
        depth.append(1 if parents[i] < 0 else depth[parents[i]] + 1)
    mask = torch.zeros(len(rows), n_ctx + hi, dtype=torch.bool)
    mask[:, :n_ctx] = True
    for r, i in enumerate(rows):
        a = i
        while a >= 0:
            mask[r, n_ctx + a] = True
            a = parents[a]
    return rows, mask


# ----------------------------------------------------------------------------- verification


def verify_tree_greedy(target_logits: torch.Tensor, tree: DraftTree) -> tuple[list[int], list[int]]:
    """``target_logits`` [len(tree) + 1, V] for rows ``[root] + nodes``: (accepted path, emitted tokens)."""
    best = argmax_rows(target_logits)
    kids = tree.children()
    tokens = tree.tokens
    row, path = 0, []
    while True:
        t = best[row]
        nxt = next((c for c in kids[row] if tokens[c] == t), None)
        if nxt is None:
            return path, [tokens[i] for i in path] + [t]
        path.append(nxt)
        row = nxt + 1


def _normalised(x: torch.Tensor) -> torch.Tensor | None:
    total = float(x.sum())
    return x / total if total > 0.0 else None


def verify_tree_sampling(target_probs: torch.Tensor, tree: DraftTree, rng: torch.Generator,
                         rule: str = "exact") -> tuple[list[int], list[int]]:
    """Recursive rejection over siblings (module docstring); ``target_probs`` [len(tree) + 1, V]
    already temperature/top-k/top-p processed. ``rule`` other than "exact" is a deliberately wrong
    variant for negative-control tests only ("no-residual": after a rejection keep p unchanged)."""
    kids = tree.children()
    tokens = tree.tokens
    row, path = 0, []
    while True:
        children = kids[row]
        p = target_probs[row]
        if children:
            q = tree.q[row] if tree.q is not None else None
            nxt = None
            for c in children:
                x = tokens[c]
                u = float(torch.rand(1, generator=rng))
                px = float(p[x])
                if (u < px) if q is None else (u * float(q[x]) < px):
                    nxt = c
                    break
                if rule == "no-residual":
                    continue
                if q is None:
                    p = p.clone()
                    p[x] = 0.0
                    p = _normalised(p) if _normalised(p) is not None else target_probs[row]
                else:
                    residual = _normalised((p - q).clamp_(min=0.0))
                    p = residual if residual is not None else p  # p == q: a rejection is measure-zero
                    q = q.clone()
                    q[x] = 0.0
                    q = _normalised(q) if _normalised(q) is not None else q
            if nxt is not None:
                path.append(nxt)
                row = nxt + 1
                continue
        t = int(torch.multinomial(p, 1, generator=rng))
        return path, [tokens[i] for i in path] + [t]


# ----------------------------------------------------------------------------- growth (model drafters)

#: ``expand(nodes, tree_tokens, tree_parents)`` -> logits [len(nodes), V] of the drafter at each of
#: the given nodes (their root-to-node paths appended to the context); nodes index the tokens so far
Expand = Callable[[list[int], list[int], list[int]], torch.Tensor]


def default_width(budget: int, max_depth: int) -> int:
    """Nodes drafted per expansion wave: enough that ``max_depth`` waves can place the budget."""
    return max(1, min(8, math.ceil(budget / max(1, max_depth))))


def ranked_children(logits: torch.Tensor, k: int, params: SamplingParams, rng: torch.Generator | None,
                    draws: bool) -> tuple[list[int], torch.Tensor, list[float]]:
    """The (at most) ``k`` children a node gets, in rank order, from the drafter's ``logits`` there:
    (tokens, the distribution q they come from, q's k largest values). Greedy or ``draws`` False: the k
    most probable tokens (greedy: those of positive probability); ``draws``: k draws without replacement
    from q = ``probs_from_logits(logits, params)`` (Gumbel top-k) -- q is then the distribution the
    verifier's recursive rejection needs."""
    dist = torch.softmax(logits.float(), -1) if params.greedy else probs_from_logits(logits, params)
    top = torch.topk(dist, min(k, dist.shape[-1]))
    values = top.values.tolist()
    if draws:
        gumbel = -torch.log(-torch.log(torch.rand(dist.shape, generator=rng).clamp_(min=1e-20)))
        keys = torch.where(dist > 0, dist.log() + gumbel, torch.full_like(dist, -math.inf))
        return torch.topk(keys, min(k, int((dist > 0).sum()))).indices.tolist(), dist, values
    return [i for i, v in zip(top.indices.tolist(), values) if v > 0 or not params.greedy], dist, values


def grow_tree(root_logits: torch.Tensor, expand: Expand, budget: int, max_depth: int, params: SamplingParams,
              rng: torch.Generator | None, topk: int = 4, width: int | None = None,
              draws: bool | None = None) -> DraftTree:
    """Best-first top-k tree for a model drafter, EAGLE-2 style: keep the ``budget`` nodes of the
    highest path probability, at most ``max_depth`` deep, at most ``topk`` children per node.

    A *slot* (parent, rank r) scores ``score(parent) * q_sorted(parent)[r]``: the parent's path
    score times the r-th largest drafter probability at the parent. Waves: pop the ``width`` best
    open slots into nodes (a popped slot opens the parent's next rank), then run the drafter once
    on the new nodes (``expand``) to open their first child slot; after ``max_depth`` waves the
    best remaining slots fill the budget as leaves. One drafter call per wave, not per node.

    Which token fills slot (parent, r): greedy or ``draws=False``, the r-th most probable token
    (deterministic, ``tree.q = None``); with ``draws`` (default under sampling) the r-th draw
    without replacement from ``q = probs_from_logits(logits, params)`` (Gumbel top-k), and
    ``tree.q`` holds q per parent. Slot scores never look at the drawn token's own probability,
    so which siblings a node gets is decided independently of their values and the recursive
    rejection in :func:`verify_tree_sampling` stays exact."""
    if budget <= 0 or max_depth <= 0:
        return DraftTree()
    greedy = params.greedy
    draws = (not greedy) if draws is None else (draws and not greedy)
    width = width or default_width(budget, max_depth)
    k = max(1, topk)

    tokens: list[int] = []
    parents: list[int] = []
    depth_of: list[int] = []
    score_of: list[float] = []
    order: dict[int, list[int]] = {}  # row -> tokens in rank order
    sorted_p: dict[int, list[float]] = {}  # row -> top probabilities, descending
    q_rows: dict[int, torch.Tensor] = {}
    heap: list[tuple[float, int, int, int]] = []  # (-score, tiebreak, row, rank)
    tie = 0

    def open_row(row: int, logits: torch.Tensor, base: float) -> None:
        nonlocal tie
        picks, dist, sorted_p[row] = ranked_children(logits, k, params, rng, draws)
        if draws:
            q_rows[row] = dist
        order[row] = picks
        if picks:
            heapq.heappush(heap, (-base * sorted_p[row][0], tie, row, 0))
            tie += 1

    def pop_node() -> int | None:
        nonlocal tie
        if not heap:
            return None
        neg, _, row, rank = heapq.heappop(heap)
        tokens.append(order[row][rank])
        parents.append(row - 1)
        depth_of.append(1 if row == 0 else depth_of[row - 1] + 1)
        score_of.append(-neg)
        base = 1.0 if row == 0 else score_of[row - 1]
        if rank + 1 < len(order[row]):
            heapq.heappush(heap, (-base * sorted_p[row][rank + 1], tie, row, rank + 1))
            tie += 1
        return len(tokens) - 1

    open_row(0, root_logits, 1.0)
    for wave in range(max_depth):
        new = []
        while len(new) < width and len(tokens) < budget:
            node = pop_node()
            if node is None:
                break
            new.append(node)
        if len(tokens) >= budget or not new or wave == max_depth - 1:
            break
        grow = [i for i in new if depth_of[i] < max_depth]
        if grow:
            logits = expand(grow, tokens, parents)
            for i, row_logits in zip(grow, logits):
                open_row(i + 1, row_logits, score_of[i])
    while len(tokens) < budget:
        node = pop_node()
        if node is None:
            break
    return DraftTree.build(tokens, parents, q_rows if draws else None)
