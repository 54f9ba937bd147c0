"""Token trees: depth and width are two budgets.

A candidate tree hangs below the last committed token. The target accepts at most one
child of any accepted node (one next token per position), so along the tree the accepted
nodes form a single path from the root. With ``p(v)`` the probability that node v is
accepted given its parent was accepted,

    E[L] = 1 + Σ_{v in tree} Π_{u on path(root→v)} p(u)

(expected number of accepted nodes, plus the bonus/correction token). Siblings are mutually
exclusive events, so their probabilities sum to at most 1.

Best shapes use Sequoia's *positional acceptance* model (Chen et al. 2024): the i-th ranked
child of any node is accepted with (marginal) probability p_i, the same at every depth.
A dynamic programme over node budgets finds the tree with the largest E[L] for a budget
of N candidate nodes (each node costs verify compute and a KV slot).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specledger.errors import require
from specledger.ledger.acceptance import check_chain, check_probability

Shape = tuple["Shape", ...]
"""A tree shape: the tuple of its children's shapes, in rank order. A leaf is ``()``."""

MAX_TREE_BUDGET = 256
_SIBLING_TOLERANCE = 1e-9
_NEGLIGIBLE = 1e-12


@dataclass(frozen=True)
class TreeNode:
    """A candidate token: its conditional acceptance (given the parent accepted) and children."""

    acceptance: float
    children: tuple[TreeNode, ...] = ()


def _check_siblings(nodes: Sequence[TreeNode]) -> None:
    total = 0.0
    for node in nodes:
        total += check_probability(node.acceptance, "tree node acceptance")
    require(
        total <= 1.0 + _SIBLING_TOLERANCE,
        f"sibling acceptances sum to {total:.4g} > 1; at most one child of a node can be accepted",
    )


def expected_tree_length(roots: Sequence[TreeNode]) -> float:
    """E[L] = 1 + Σ_nodes Π_{path} p: expected accepted nodes plus the bonus token.

    Invariant: 1 ≤ E[L] ≤ depth + 1; a chain of constant a reproduces 1 + a + … + a^γ.
    """
    total = 1.0
    stack: list[tuple[Sequence[TreeNode], float]] = [(roots, 1.0)]
    while stack:
        nodes, reach = stack.pop()
        _check_siblings(nodes)
        for node in nodes:
            path = reach * node.acceptance
            total += path
            stack.append((node.children, path))
    return total


# --------------------------------------------------------------------------- shapes


def check_positional(positional: Sequence[float]) -> tuple[float, ...]:
    """Validate a Sequoia acceptance vector p_1.. (each in [0, 1], Σ p_i ≤ 1: siblings exclude)."""
    values = check_chain(positional, "sibling acceptance")
    require(len(values) > 0, "the sibling acceptance vector is empty; give p_1,p_2,... for ranked children")
    require(
        sum(values) <= 1.0 + _SIBLING_TOLERANCE,
        f"sibling acceptances sum to {sum(values):.4g} > 1; they are exclusive (marginal) probabilities "
        "of the i-th ranked child being the accepted one",
    )
    return values


def positional_from_sibling_conditionals(conditionals: Sequence[float]) -> list[float]:
    """p_i = c_i · Π_{j<i} (1 − c_j): c_i = Pr(rank-i child accepted | ranks < i rejected).

    Turns 'each further ranked sibling gets a conditional chance c_i' into Sequoia's
    marginal vector; Σ p_i ≤ 1 by construction.
    """
    miss = 1.0
    positional: list[float] = []
    for c in check_chain(conditionals, "sibling conditional acceptance"):
        positional.append(miss * c)
        miss *= 1.0 - c
    return positional


def tree_from_shape(shape: Shape, positional: Sequence[float]) -> tuple[TreeNode, ...]:
    """Label a shape with positional acceptances: the i-th child of any node gets p_i (0 beyond the vector)."""
    p = check_positional(positional)

    def build(children: Shape) -> tuple[TreeNode, ...]:
        nodes = []
        for rank, child in enumerate(children):
            nodes.append(TreeNode(acceptance=p[rank] if rank < len(p) else 0.0, children=build(child)))
        return tuple(nodes)

    return build(shape)


def expected_length_of_shape(shape: Shape, positional: Sequence[float]) -> float:
    """E[L] = 1 + Σ_nodes Π_{path} p_rank under the positional model (iterative, any depth)."""
    p = check_positional(positional)
    total = 1.0
    stack: list[tuple[Shape, float]] = [(shape, 1.0)]
    while stack:
        children, reach = stack.pop()
        for rank, child in enumerate(children):
            path = reach * (p[rank] if rank < len(p) else 0.0)
            total += path
            stack.append((child, path))
    return total


def count_nodes(shape: Shape) -> int:
    """Number of candidate nodes (the root/committed token is not counted)."""
    return sum(width_per_depth(shape))


def tree_depth(shape: Shape) -> int:
    """Longest root-to-leaf path in candidates (a chain of γ has depth γ)."""
    return len(width_per_depth(shape))


def width_per_depth(shape: Shape) -> list[int]:
    """Nodes at depth 1, 2, …: the tree's width profile."""
    widths: list[int] = []
    level: list[Shape] = list(shape)
    while level:
        widths.append(len(level))
        level = [grandchild for child in level for grandchild in child]
    return widths


def chain_shape(nodes: int) -> Shape:
    """A single path of ``nodes`` candidates (plain chain speculation with γ = nodes)."""
    require(nodes >= 0, f"node budget {nodes} is negative; give a budget >= 0")
    shape: Shape = ()
    for _ in range(nodes):
        shape = (shape,)
    return shape


def kary_shape(arity: int, nodes: int) -> Shape:
    """A k-ary tree filled breadth-first with ``nodes`` candidates (ranks 1..k under each node)."""
    require(arity >= 1, f"arity {arity} must be >= 1")
    require(nodes >= 0, f"node budget {nodes} is negative; give a budget >= 0")
    root: list[list] = []
    frontier: list[list[list]] = [root]
    placed = 0
    while placed < nodes:
        next_frontier: list[list[list]] = []
        for parent in frontier:
            for _ in range(arity):
                if placed == nodes:
                    break
                child: list[list] = []
                parent.append(child)
                next_frontier.append(child)
                placed += 1
        frontier = next_frontier

    def freeze(children: list[list]) -> Shape:
        return tuple(freeze(child) for child in children)

    return freeze(root)


# --------------------------------------------------------------------------- best tree (DP)


def _check_budget(budget: int) -> None:
    require(
        isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0,
        f"tree budget {budget!r} must be a whole number of nodes >= 0",
    )
    require(
        budget <= MAX_TREE_BUDGET, f"tree budget {budget} exceeds {MAX_TREE_BUDGET}; give a smaller budget"
    )


@dataclass(frozen=True)
class BestTree:
    """The E[L]-maximising shape for a node budget under a positional acceptance vector."""

    shape: Shape
    expected_length: float
    budget: int


def _dp_layer(
    p: Sequence[float], budget: int, inner: list[float] | None
) -> tuple[list[float], list[list[int]]]:
    """One DP layer. G[n] = best Σ path-probabilities of ≤ n descendants below a node.

    H[i][n] = max(0, max_{s=1..n} p_i·(1 + G'[s−1]) + H[i+1][n−s]): rank-i child with a subtree
    of s nodes, then ranks i+1.. share the rest. G' is the previous depth layer's G (depth
    limit) or G itself (no limit), always at smaller budgets.
    """
    ranks = len(p)
    values = [0.0] * (budget + 1)
    rest = [[0.0] * (budget + 1) for _ in range(ranks + 1)]
    choice = [[0] * (budget + 1) for _ in range(ranks)]
    for n in range(1, budget + 1):
        below = values if inner is None else inner
        for i in range(ranks - 1, -1, -1):
            best, arg = 0.0, 0
            for size in range(1, n + 1):
                value = p[i] * (1.0 + below[size - 1]) + rest[i + 1][n - size]
                if value > best + 1e-15:
                    best, arg = value, size
            rest[i][n] = best
            choice[i][n] = arg
        values[n] = rest[0][n]
    return values, choice


def _trimmed(p: Sequence[float], budget: int) -> list[float]:
    """``p`` without its negligible tail ranks, and no more ranks than the budget can place."""
    out = list(p)
    while out and out[-1] <= _NEGLIGIBLE:
        out.pop()
    return out[: max(budget, 1)]


def _best_layers(rows: Sequence[Sequence[float]], budget: int, max_depth: int) -> BestTree:
    """The depth-limited DP with a positional vector per depth (``rows[d - 1]``: children at depth d).

    Layer k (k = 1..D, D = ``max_depth``) is the G of a node whose children sit at depth D - k + 1, so
    it uses that depth's vector; the last layer is the root's."""
    ranks = max(len(r) for r in rows)
    padded = [list(r) + [0.0] * (ranks - len(r)) for r in rows]
    layer_values: list[float] = [0.0] * (budget + 1)
    choices = []
    for k in range(1, max_depth + 1):
        depth = max_depth - k + 1
        layer_values, layer_choice = _dp_layer(padded[min(depth, len(padded)) - 1], budget, layer_values)
        choices.append(layer_choice)

    def build(n: int, depth_left: int) -> Shape:
        table = choices[depth_left - 1]
        children: list[Shape] = []
        for rank in range(ranks):
            size = table[rank][n] if n > 0 else 0
            if size == 0:
                break
            children.append(build(size - 1, depth_left - 1) if depth_left > 1 else ())
            n -= size
        return tuple(children)

    return BestTree(shape=build(budget, max_depth), expected_length=1.0 + layer_values[budget], budget=budget)


def best_tree(positional: Sequence[float], budget: int, max_depth: int | None = None) -> BestTree:
    """Sequoia-style DP: the tree of ≤ ``budget`` nodes (depth ≤ ``max_depth``) maximising E[L].

    Exact under the positional model (the i-th ranked child of any node accepted with p_i);
    never worse than the chain or any k-ary tree with the same budget.
    """
    _check_budget(budget)
    p = _trimmed(check_positional(positional), budget)
    if max_depth is not None:
        require(max_depth >= 0, f"max tree depth {max_depth} is negative")
    if not p or budget == 0 or max_depth == 0:
        return BestTree(shape=(), expected_length=1.0, budget=budget)
    if max_depth is not None:
        return _best_layers([p], budget, max_depth)
    values, choice = _dp_layer(p, budget, None)

    def build(n: int) -> Shape:
        children: list[Shape] = []
        for rank in range(len(p)):
            size = choice[rank][n] if n > 0 else 0
            if size == 0:
                break
            children.append(build(size - 1))
            n -= size
        return tuple(children)

    return BestTree(shape=build(budget), expected_length=1.0 + values[budget], budget=budget)


def best_tree_by_depth(rows: Sequence[Sequence[float]], budget: int, max_depth: int) -> BestTree:
    """The DP of :func:`best_tree` with acceptance by depth *and* rank: ``rows[d - 1][i]`` = p_{d,i}, the
    probability that the i-th ranked child of a reached node at depth d - 1 is the accepted one (rows past
    the last give the last row). E[L] = 1 + Σ_v Π_{u on path(v)} p_{depth(u), rank(u)}; exact under that
    model, and equal to :func:`best_tree` when every row is the same vector."""
    require(len(rows) > 0, "acceptance by depth is empty; give one positional vector per depth")
    _check_budget(budget)
    require(isinstance(max_depth, int) and max_depth >= 0, f"max tree depth {max_depth!r} must be an integer >= 0")
    checked = [_trimmed(check_positional(r), budget) for r in rows]
    if budget == 0 or max_depth == 0 or not any(checked):
        return BestTree(shape=(), expected_length=1.0, budget=budget)
    return _best_layers([r or [0.0] for r in checked], budget, max_depth)


def survival_by_depth(shape: Shape, rows: Sequence[Sequence[float]]) -> list[float]:
    """S_d = Pr(the accepted path reaches depth d) = Σ_{v at depth d} Π_{u on path(v)} p_{depth(u), rank(u)},
    d = 1..depth(shape) (``rows`` as in :func:`best_tree_by_depth`); E[L] = 1 + Σ_d S_d."""
    require(len(rows) > 0, "acceptance by depth is empty; give one positional vector per depth")
    out: list[float] = []
    level: list[tuple[Shape, float]] = [(shape, 1.0)]
    depth = 0
    while level:
        depth += 1
        row = rows[min(depth, len(rows)) - 1]
        nxt = [(child, reach * (row[rank] if rank < len(row) else 0.0))
               for children, reach in level for rank, child in enumerate(children)]
        if not nxt:
            break
        out.append(sum(reach for _, reach in nxt))
        level = nxt
    return out


@dataclass
class DepthRankCounts:
    """Measured acceptance by depth and rank over verified trees: ``tries[d][i]`` counts reached nodes at
    depth d (0 = the root) that had an (i+1)-th ranked child, ``hits[d][i]`` those whose accepted child
    was that one. p_{d+1,i} = hits / tries (a chain round is the one-branch tree: rank 0 only)."""

    hits: list[list[int]]
    tries: list[list[int]]
    rounds: int = 0

    def pooled_by_rank(self) -> list[float]:
        """p_i over every depth (Sequoia's positional vector): Σ_d hits / Σ_d tries per rank."""
        ranks = max((len(r) for r in self.tries), default=0)
        out = []
        for i in range(ranks):
            t = sum(r[i] for r in self.tries if i < len(r))
            h = sum(r[i] for r in self.hits if i < len(r))
            out.append(h / t if t else 0.0)
        return out

    def rows(self, min_tries: int = 5) -> tuple[list[list[float]], int]:
        """Per-depth positional vectors, cells with fewer than ``min_tries`` tries taking the rank's value
        pooled over depths; each row scaled to sum ≤ 1 (siblings exclude). Returns (rows, cells pooled)."""
        pooled = self.pooled_by_rank()
        out, borrowed = [], 0
        for hits, tries in zip(self.hits, self.tries):
            row = []
            for i, p in enumerate(pooled):
                t = tries[i] if i < len(tries) else 0
                if t >= min_tries:
                    row.append(hits[i] / t)
                else:
                    row.append(p)
                    borrowed += 1
            total = sum(row)
            out.append([x / total for x in row] if total > 1.0 else row)
        return out, borrowed


def count_depth_rank(trees: Iterable[tuple[Sequence[int], Sequence[int]]], max_rank: int = 8) -> DepthRankCounts:
    """:class:`DepthRankCounts` of verified trees given as (parents, accepted path): parents[i] is node i's
    parent (-1 the root), siblings in rank order; the path lists accepted node indices from the root down."""
    hits: list[list[int]] = []
    tries: list[list[int]] = []
    rounds = 0
    for parents, path in trees:
        rounds += 1
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(parents):
            kids.setdefault(p, []).append(i)
        node = -1
        for depth in range(len(path) + 1):
            children = kids.get(node, [])[:max_rank]
            if not children:
                break
            while len(tries) <= depth:
                tries.append([0] * max_rank)
                hits.append([0] * max_rank)
            accepted = path[depth] if depth < len(path) else None
            for rank, child in enumerate(children):
                tries[depth][rank] += 1
                hits[depth][rank] += child == accepted
            if accepted is None:
                break
            node = accepted
    return DepthRankCounts(hits, tries, rounds)


@dataclass(frozen=True)
class TreeComparisonRow:
    """One shape at the shared node budget."""

    label: str
    nodes: int
    depth: int
    widths: tuple[int, ...]
    expected_length: float


def _row(label: str, shape: Shape, positional: Sequence[float]) -> TreeComparisonRow:
    return TreeComparisonRow(
        label=label,
        nodes=count_nodes(shape),
        depth=tree_depth(shape),
        widths=tuple(width_per_depth(shape)),
        expected_length=expected_length_of_shape(shape, positional),
    )


def depth_vs_width(
    positional: Sequence[float], budget: int, arities: Sequence[int] = (2, 3, 4), max_depth: int | None = None
) -> list[TreeComparisonRow]:
    """Chain vs k-ary trees vs the DP-best tree, all at the same node budget.

    The chain spends the whole budget on depth (E[L] = 1 + Σ p_1^d); k-ary trees spend it on
    width first; the best tree balances the two and is never worse than either.
    """
    p = check_positional(positional)
    _check_budget(budget)
    rows = [_row(f"chain ({budget} deep)", chain_shape(budget), p)]
    rows += [
        _row(f"{k}-ary, breadth-first", kary_shape(k, budget), p) for k in arities if 1 < k <= max(budget, 1)
    ]
    best = best_tree(p, budget, max_depth)
    rows.append(_row("best tree (DP)", best.shape, p))
    return rows
