"""A static token-tree shape from the DP, as a proposer choice (``--tree-shape dp``).

Sequoia's static trees: given the acceptance by depth and rank p_{d,i} (the chance that the i-th ranked
child of a reached node at depth d - 1 is the accepted one; measured on a run's trees, or assumed),
:func:`specledger.ledger.trees.best_tree_by_depth` picks, for a round's node budget n and depth g, the
shape of largest E[L] = 1 + Σ_v Π_{u on path(v)} p_{depth(u), rank(u)}. The drafter then fills that shape
with its ranked candidates: a node of the shape with k children gets the drafter's k best tokens there --
a model drafter's top-k at that node (or k draws without replacement from its distribution under
sampling, :func:`specledger.engine.tree.ranked_children`), one drafter pass per level of the shape; a
model-free drafter's own continuations in its own rank order, cut to the shape
(:func:`restrict_to_shape`).

The dynamic alternative (the default) is :func:`specledger.engine.tree.grow_tree`: EAGLE-2's best-first
expansion by path probability, a new shape every round.

Exactness: how many children each node gets is fixed by the shape before any token is drawn, so the
recursive rejection of :func:`specledger.engine.tree.verify_tree_sampling` stays exact, and greedy output
is the target's whatever fills the shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specledger.engine.sampling import SamplingParams
from specledger.engine.tree import DraftTree, Expand, ranked_children
from specledger.ledger.trees import Shape, best_tree_by_depth, check_positional, count_nodes, width_per_depth

#: assumed p_1..p_4 by rank (every depth) when no run is given: a first-ranked draft accepted 60 % of the
#: time, each further sibling far less (Sequoia's measured vectors fall off about this fast)
DEFAULT_RANK_ACCEPTANCE = (0.6, 0.15, 0.06, 0.03)


@dataclass
class StaticTreeShape:
    """The DP's shape per (nodes, depth), memoised; ``rows[d - 1]`` = p_{d, ·} (rows past the last: the last)."""

    rows: list[list[float]]
    source: str
    _memo: dict[tuple[int, int], Shape] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.rows = [list(check_positional(r)) for r in self.rows]

    @classmethod
    def default(cls) -> StaticTreeShape:
        return cls([list(DEFAULT_RANK_ACCEPTANCE)], f"assumed acceptance by rank {list(DEFAULT_RANK_ACCEPTANCE)} "
                                                     "at every depth")

    def shape_for(self, nodes: int, depth: int) -> Shape:
        """The E[L]-best shape of at most ``nodes`` nodes and ``depth`` levels."""
        key = (int(nodes), int(depth))
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = best_tree_by_depth(self.rows, key[0], key[1]).shape
        return hit

    def describe(self, nodes: int, depth: int) -> str:
        shape = self.shape_for(nodes, depth)
        return f"DP shape widths {width_per_depth(shape)} ({count_nodes(shape)} nodes) from {self.source}"


def fill_shape(root_logits: torch.Tensor, expand: Expand, shape: Shape, params: SamplingParams,
               rng: torch.Generator | None, draws: bool | None = None) -> DraftTree:
    """A model drafter's tree in a fixed ``shape``: level by level, every node with k children in the shape
    gets :func:`~specledger.engine.tree.ranked_children` (k of them) of the drafter's logits there, and one
    ``expand`` call per level gives the logits of the new nodes that have children of their own. Fewer
    candidates than the shape asks (tokens of zero probability) drop those subtrees. ``draws`` as in
    :func:`~specledger.engine.tree.grow_tree` (default: under sampling)."""
    draws = (not params.greedy) if draws is None else (draws and not params.greedy)
    tokens: list[int] = []
    parents: list[int] = []
    q_rows: dict[int, torch.Tensor] = {}
    level: list[tuple[int, torch.Tensor, Shape]] = [(-1, root_logits, shape)]
    while level:
        grown: list[tuple[int, Shape]] = []
        for node, logits, sub in level:
            if not sub:
                continue
            picks, dist, _ = ranked_children(logits, len(sub), params, rng, draws)
            if draws:
                q_rows[node + 1] = dist
            for token, child in zip(picks, sub):
                tokens.append(int(token))
                parents.append(node)
                grown.append((len(tokens) - 1, child))
        grow = [(i, child) for i, child in grown if child]
        if not grow:
            break
        rows = expand([i for i, _ in grow], tokens, parents)
        level = [(i, row, child) for (i, child), row in zip(grow, rows)]
    return DraftTree.build(tokens, parents, q_rows if draws else None)


def restrict_to_shape(tree: DraftTree, shape: Shape) -> DraftTree:
    """The nodes of ``tree`` that have a place in ``shape``: a node is kept when its parent is and its rank
    among its siblings is below the number of children the shape gives the parent's place."""
    keep: list[int] = []
    place: dict[int, Shape] = {-1: shape}
    ranks = tree.ranks()
    for i, p in enumerate(tree.parents):
        parent_place = place.get(p)
        if parent_place is not None and ranks[i] < len(parent_place):
            place[i] = parent_place[ranks[i]]
            keep.append(i)
    return tree if len(keep) == len(tree) else tree.select(keep)


def rows_from_spec(values: Sequence[float]) -> list[list[float]]:
    """A rank vector given on the command line, as the one row used at every depth."""
    return [list(check_positional(values))]


def shape_budget_hint(shape: Shape) -> int:
    """Candidates to ask a model-free drafter for before cutting its tree to ``shape``: 4x the shape's
    nodes (its continuations rank as it ranks them; the shape takes the first few at each node)."""
    return min(256, max(1, 4 * count_nodes(shape)))


__all__ = ["DEFAULT_RANK_ACCEPTANCE", "StaticTreeShape", "fill_shape", "restrict_to_shape", "rows_from_spec",
           "shape_budget_hint"]
