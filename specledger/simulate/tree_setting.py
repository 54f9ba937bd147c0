"""Token-tree settings in the simulator: ``specledger simulate --tree-budget N`` (rows = N + 1 per request).

Every static γ = g becomes a tree of N nodes at depth ≤ g. The simulator draws a round's outcome from a
:class:`~specledger.simulate.chains.ChainTable` (conditional fill q and acceptance a per position) and asks
γ candidates; the tree setting asks γ = N, so a step carries N + 1 rows per drafting request and reserves
N KV slots for its candidates, as the engine's tree pass does, with

    fill  q = [f, 1, 1, ..]                 the drafter proposes a whole tree in a fraction f of rounds
    a_d = S_d / S_(d-1) for d ≤ g, 0 after   the accepted path never runs past the tree's depth

so Pr(K ≥ d) = S_d: the tree's accepted-path distribution, not a chain's. S and f are per category, from
:func:`specledger.predict.tree_forecast.tree_acceptance` (measured at this budget and depth, else the DP
from measured acceptance by depth×rank; the table's ``assumption`` says which). :class:`TreePricer` wraps
the run's pricer: every forward × the tree pass's measured premium π, and a drafting request's draft
priced per tree round (measured on the run's tree rounds, else the chain of the tree's depth).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from specledger.errors import require
from specledger.records import RequestRecord
from specledger.simulate.chains import ChainTable

if TYPE_CHECKING:
    from specledger.predict.tree_forecast import TreeAcceptance

#: the simulator codes a round's outcome as P * 32 + K in 5 bits per count (simulate/rounds.py)
MAX_SIM_TREE_BUDGET = 31


class TreePricer:
    """The run's pricer for a tree setting (see the module docstring); every other attribute is the inner
    pricer's (noise, KV budget, slot-dependent prefill)."""

    def __init__(self, inner: Any, premium: float, draft: Callable[[float], float], note: str) -> None:
        self.inner, self.premium, self._draft, self.note = inner, float(premium), draft, note

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def source(self) -> str:
        return f"{self.inner.source}; {self.note}"

    def prefill_s(self, prompt_tokens: int, slots: int = 1) -> float:
        return self.inner.prefill_s(prompt_tokens, slots) if slots != 1 else self.inner.prefill_s(prompt_tokens)

    def step_s(self, total_rows: int, batch: int, context: float) -> float:
        """The tree pass: the inner forward × π."""
        return float(self.inner.step_s(total_rows, batch, context)) * self.premium

    def step_s_many(self, rows: np.ndarray, batch: int, context: np.ndarray) -> np.ndarray:
        from specledger.cost.pricer import step_s_each

        many = getattr(self.inner, "step_s_many", None)
        base = many(rows, batch, context) if many is not None else step_s_each(self.inner, rows, batch, context)
        return np.asarray(base, dtype=np.float64) * self.premium

    def round_s(self, rows: int, context: float) -> float:
        return self.step_s(rows, 1, context)

    def draft_s(self, drafter: str, gamma: int, context: float = 0.0) -> float:
        """One tree round's drafting (0 when nothing is asked)."""
        return 0.0 if gamma <= 0 else float(self._draft(context))

    def other_s(self, batch: int = 1) -> float:
        return float(self.inner.other_s(batch))

    def to_dict(self) -> dict[str, Any]:
        return self.inner.to_dict()


def tree_table(base: ChainTable, per_category: dict[str, TreeAcceptance], budget: int, depth: int, drafter: str
               ) -> ChainTable:
    """``base``'s requests (sizes, categories) with each category's tree acceptance as the module's chain."""
    n = base.size
    accept = np.zeros((n, budget))
    fill = np.ones((n, budget))
    for i, cat in enumerate(base.categories):
        acc = per_category[cat]
        s = [1.0] + [float(x) for x in acc.survival[:depth]]
        for d in range(1, min(depth, budget) + 1):
            accept[i, d - 1] = s[d] / s[d - 1] if d < len(s) and s[d - 1] > 0 else 0.0
        fill[i, 0] = acc.fill
    why = "; ".join(f"{cat}: {acc.detail}" for cat, acc in sorted(per_category.items()))
    return ChainTable(np.clip(accept, 0, 1), np.clip(fill, 0, 1), base.prompt_tokens, base.output_tokens,
                      list(base.categories), drafter,
                      f"token trees of {budget} nodes at depth <= {depth} (rows {budget + 1}): {why}")


def tree_runs(records: Sequence[RequestRecord], drafter: str, budget: int, settings: Sequence[int | str],
              tables: dict[int | str, ChainTable], cost: Any) -> dict[int | str, tuple[ChainTable, int, TreePricer]]:
    """{γ: (the tree table, the γ to ask = N, the tree pricer)} for every speculative setting."""
    from specledger.predict.tree_forecast import solo_main, tree_acceptance, tree_costs

    require(isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1,
            f"--tree-budget must be >= 1 node (rows = nodes + 1), got {budget!r}")
    require(budget <= MAX_SIM_TREE_BUDGET, f"--tree-budget {budget} exceeds {MAX_SIM_TREE_BUDGET}: the simulator "
            "codes a round's candidates in 5 bits; give a smaller budget")
    require(all(isinstance(g, int) for g in settings),
            "--tree-budget needs static gammas (a tree's depth limit), e.g. --gamma 2,4; policies choose chains")
    recs = solo_main(records)
    out: dict[int | str, tuple[ChainTable, int, TreePricer]] = {}
    for g in settings:
        if g == 0:
            continue
        depth = int(g)
        base = tables[g]
        per_cat = {cat: tree_acceptance(recs, drafter, budget, depth, cat) for cat in sorted(set(base.categories))}
        costs = tree_costs(cost, recs, drafter, budget, depth, float(budget + 1),
                           float(np.median(base.prompt_tokens)))
        note = f"tree of {budget} nodes: verify {costs.sources['verify']}; draft {costs.sources['draft']}"
        out[g] = (tree_table(base, per_cat, budget, depth, drafter), budget,
                  TreePricer(cost, costs.premium, costs.draft, note))
    return out
