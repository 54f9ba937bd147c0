"""The ledger for token trees: E[L] from the accepted paths, verify cost per node, acceptance by depth
and by rank, and the measured depth x width grid beside ``ledger/trees.py``'s DP.

§2.1's chain formula E[L] = 1 + Σ Π a_j does not apply to a tree (siblings are alternatives), so E[L]
here is observed: the mean committed length of full rounds (accepted path + the bonus token).
Acceptance *by depth* is conditional: a_d = Pr(path reaches depth d | it reached d - 1 and the tree
had a node at depth d). Acceptance *by rank* is Sequoia's positional vector: p_i = Pr(the i-th
ranked child is the accepted one | its parent was reached and had at least i children) -- the
input of the DP (:func:`specledger.ledger.trees.best_tree`), which then predicts the best shape and
its E[L] for each (depth, node budget) the run measured. Verify cost by verified rows (rows = nodes + 1):
the measured medians per row count, and the extra cost of a node read off them.
A chain round counts as the one-branch tree (ranks all 0), so chains and trees share one table.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from specledger.analysis.scenario import ScenarioKey
from specledger.records import RequestRecord, RoundRecord


class TreeRoundStatsDict(TypedDict, total=False):
    """E[L], mean shape, acceptance by depth and by rank over full proposing rounds (only ``rounds`` = 0 when
    there are none)."""

    rounds: int
    el: float  # observed: accepted path + bonus token
    accepted_path_mean: float
    nodes_mean: float
    depth_mean: float
    widths_mean: list[float]  # nodes per depth
    acceptance_by_depth: list[float | None]  # a_d, conditional on reaching depth d − 1
    acceptance_by_rank: list[float]  # Sequoia's positional p_i
    rank_tries: list[int]
    t_verify_ms_mean: float


class VerifyCostDict(TypedDict):
    """Measured verify time by rows: the median at one row, the extra cost of a row, and the medians per rows."""

    one_row_ms: float
    ms_per_row: float
    rounds: int
    median_ms_by_rows: dict[int, float]


class TreeGridRowDict(TreeRoundStatsDict, total=False):
    """One (depth = γ, node budget) scenario: measured E[L], S and shape beside the DP's best tree for it."""

    gamma: int
    depth: int
    tree_budget: int
    nodes: int
    label: str
    speedup: float | None
    dp_el: float
    dp_widths: list[int]
    dp_depth: int
    dp_speedup: float  # S with the DP's E[L] in place of the measured


class TreeAnalysisDict(TypedDict):
    """One (category, temperature, drafter)'s trees: pooled acceptance, verify cost per row, the grid of
    scenarios and the best of them measured and as the DP predicts (a few keys of their rows)."""

    category: str
    temperature: float
    drafter: str
    acceptance_by_rank: list[float]
    pooled: TreeRoundStatsDict
    verify_cost: VerifyCostDict | None
    grid: list[TreeGridRowDict]
    best_measured: TreeGridRowDict | None
    best_predicted: TreeGridRowDict | None


def round_tree(rd: RoundRecord) -> tuple[list[int], list[int]]:
    """(parents, accepted path) of a round; a chain round as the one-branch tree."""
    if rd.tree_parents is not None:
        return list(rd.tree_parents), list(rd.tree_path or [])
    return list(range(-1, rd.proposed - 1)), list(range(rd.accepted))


def tree_round_stats(rounds: Sequence[RoundRecord], max_rank: int = 8) -> TreeRoundStatsDict:
    """E[L], mean shape, acceptance by depth and by rank over full (not truncated) proposing rounds."""
    full = [rd for rd in rounds if not rd.truncated and rd.proposed > 0]
    if not full:
        return {"rounds": 0}
    reach: dict[int, int] = defaultdict(int)  # rounds whose path reached depth d-1 and whose tree had depth d
    hit: dict[int, int] = defaultdict(int)  # ... of which the path reached depth d
    rank_tries = [0] * max_rank
    rank_hits = [0] * max_rank
    depths, widths = [], defaultdict(list)
    for rd in full:
        parents, path = round_tree(rd)
        depth_of: list[int] = []
        kids: dict[int, list[int]] = defaultdict(list)
        for i, p in enumerate(parents):
            depth_of.append(1 if p < 0 else depth_of[p] + 1)
            kids[p].append(i)
        tree_depth = max(depth_of, default=0)
        depths.append(tree_depth)
        per_depth = np.bincount(depth_of, minlength=tree_depth + 1)[1:]
        for d, w in enumerate(per_depth, start=1):
            widths[d].append(int(w))
        for d in range(1, tree_depth + 1):
            if len(path) >= d - 1:
                reach[d] += 1
                hit[d] += len(path) >= d
        node = -1
        for step in range(len(path) + 1):  # every reached node with children: which rank was accepted
            children = kids.get(node, [])
            accepted = path[step] if step < len(path) else None
            for r, c in enumerate(children[:max_rank]):
                rank_tries[r] += 1
                rank_hits[r] += c == accepted
            if accepted is None:
                break
            node = accepted
    committed = np.array([rd.committed for rd in full], dtype=float)
    t_verify = np.array([rd.t_verify for rd in full], dtype=float)
    positional = [h / t if t else 0.0 for h, t in zip(rank_hits, rank_tries)]
    return {
        "rounds": len(full),
        "el": float(committed.mean()),  # observed E[L] (accepted path + bonus)
        "accepted_path_mean": float(committed.mean() - 1.0),
        "nodes_mean": float(np.mean([rd.proposed for rd in full])),
        "depth_mean": float(np.mean(depths)),
        "widths_mean": [float(np.mean(widths[d] + [0] * (len(full) - len(widths[d])))) for d in sorted(widths)],
        "acceptance_by_depth": [hit[d] / reach[d] if reach[d] else None for d in sorted(reach)],
        "acceptance_by_rank": positional[: max(1, max((i + 1 for i, t in enumerate(rank_tries) if t), default=1))],
        "rank_tries": rank_tries,
        "t_verify_ms_mean": float(t_verify.mean() * 1e3),
    }


def verify_cost_per_row(rounds: Sequence[RoundRecord]) -> VerifyCostDict | None:
    """Measured verify time by rows over solo rounds (rows = verified nodes + 1): the median per row count, and
    the extra cost of a node read off those medians, (median at the most rows - median at 1 row) / (rows - 1).
    A description of what was measured, not a cost model: forecasts price rows with the run's one cost model."""
    solo = [rd for rd in rounds if rd.batch_size == 1]
    rows = np.array([rd.proposed + 1 for rd in solo], dtype=float)
    if len(solo) < 3 or len(set(rows.tolist())) < 2:
        return None
    ms = np.array([rd.t_verify * 1e3 for rd in solo])
    table = {int(r): float(np.median(ms[rows == r])) for r in sorted(set(rows.tolist()))}
    lo, hi = min(table), max(table)
    return {"one_row_ms": table[lo], "ms_per_row": (table[hi] - table[lo]) / (hi - lo), "rounds": len(solo),
            "median_ms_by_rows": table}


def _positional(stats: TreeRoundStatsDict) -> list[float]:
    p = [max(0.0, min(1.0, float(x))) for x in stats.get("acceptance_by_rank", [])]
    total = sum(p)
    return [x / total for x in p] if total > 1.0 else p


def analyze_trees(groups: dict[ScenarioKey, list[RequestRecord]], scenarios: Sequence[dict]
                  ) -> list[TreeAnalysisDict]:
    """Per (category, temperature, drafter) that ran at least one tree budget: every (depth = γ, node
    budget) scenario's measured E[L], S, shape and acceptance beside the DP's predicted best shape and
    E[L] for the same budget and depth, fed with the group's measured acceptance by rank; the verify
    cost per row; the heat-map grid of S. [] when the run has no tree scenarios."""
    from specledger.ledger.trees import best_tree, tree_depth, width_per_depth

    speedup = {s["label"]: s.get("speedup") for s in scenarios}
    by_series: dict[tuple, list[ScenarioKey]] = defaultdict(list)
    for key in groups:
        if not key.is_baseline and isinstance(key.gamma, int):
            by_series[(key.category, key.temperature, key.drafter)].append(key)
    out: list[TreeAnalysisDict] = []
    for (cat, temp, drafter), keys in by_series.items():
        if not any(k.tree_budget for k in keys):
            continue
        tree_rounds = [rd for k in keys if k.tree_budget for r in groups[k] for rd in r.rounds]
        pooled = tree_round_stats(tree_rounds)
        positional = _positional(pooled)
        rows: list[TreeGridRowDict] = []
        for k in sorted(keys, key=lambda k: (k.gamma, k.tree_budget)):
            rounds = [rd for r in groups[k] for rd in r.rounds]
            st = tree_round_stats(rounds)
            nodes = k.tree_budget or int(k.gamma)
            row: TreeGridRowDict = {"gamma": k.gamma, "depth": k.gamma, "tree_budget": k.tree_budget, "nodes": nodes,
                                    "label": k.label, "speedup": speedup.get(k.label), **st}
            if positional and sum(positional) > 0 and nodes <= 256:
                best = best_tree(positional, nodes, max_depth=int(k.gamma))
                row["dp_el"] = best.expected_length
                row["dp_widths"] = width_per_depth(best.shape)
                row["dp_depth"] = tree_depth(best.shape)
            rows.append(row)
        measured = [r for r in rows if r.get("speedup") is not None]
        best_measured = max(measured, key=lambda r: r["speedup"], default=None)
        # the DP's pick among the measured settings: the largest predicted E[L] per unit of measured round time
        predicted = [r for r in rows if r.get("dp_el") and r.get("el") and r.get("speedup") is not None]
        for r in predicted:
            r["dp_speedup"] = r["speedup"] * r["dp_el"] / r["el"]  # S with the DP's E[L] in place of the measured
        best_dp = max(predicted, key=lambda r: r["dp_speedup"], default=None)
        out.append({
            "category": cat, "temperature": temp, "drafter": drafter,
            "acceptance_by_rank": positional, "pooled": pooled,
            "verify_cost": verify_cost_per_row([rd for k in keys for r in groups[k] for rd in r.rounds]),
            "grid": rows,
            "best_measured": best_measured and {k: best_measured.get(k) for k in
                                                ("label", "depth", "tree_budget", "speedup", "el", "widths_mean")},
            "best_predicted": best_dp and {k: best_dp.get(k) for k in
                                           ("label", "depth", "tree_budget", "dp_speedup", "dp_el", "dp_widths")},
        })
    return out
