"""Per-rows levels: the run's own rounds correct a measured solo surface where they measured it.

A surface measured at the start of a run (:func:`specledger.predict.calibrate.measure_rows_axis`) gives the
*shape* of the verify cost in rows; the run's rounds give its *level*: t_verify ≈ s · Σ(rows, c) with one
factor s (:func:`specledger.predict.costmodel.fit_cost_model`). Where the run verified many rounds at one
rows value r, their mean also says how far the engine's real rounds sit from the surface at r (a
shape error of a few short timed forwards, or a kernel path that the back-to-back measurement does not
take). The level of r is that ratio, shrunk toward the global fit with ``PSEUDO_ROUNDS`` pseudo-rounds:

    λ_r = (n_r · λ̂_r + k) / (n_r + k),   λ̂_r = Σ t_verify / (s · Σ Σ(r, c))   over the n_r rounds at r

Rows the run never verified keep λ = 1 (the surface's shape at the global level). The priced forward

    T(r, c) = s · max_{r' ≤ r} λ_r' · Σ(r', c)        (λ = 1 where the run has no level)

is non-decreasing in rows by construction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

#: pseudo-rounds of the global level every per-rows level is shrunk toward
PSEUDO_ROUNDS = 30.0


def fit_row_levels(rounds: Iterable[tuple[int, float, float]], level: float, k: float = PSEUDO_ROUNDS
                   ) -> dict[int, float]:
    """{rows: λ_r} from (rows, t_verify seconds, surface seconds Σ(rows, c)) of every solo round and the
    global level ``s`` (see the module docstring); empty when ``level`` is not positive."""
    if not level > 0:
        return {}
    num: dict[int, float] = defaultdict(float)
    den: dict[int, float] = defaultdict(float)
    n: dict[int, int] = defaultdict(int)
    for rows, t, sigma in rounds:
        if sigma > 0 and t > 0:
            num[rows] += t
            den[rows] += level * sigma
            n[rows] += 1
    return {r: (n[r] * (num[r] / den[r]) + k) / (n[r] + k) for r in sorted(n) if den[r] > 0}


def levelled(sigma_at: Any, levels: Mapping[int, float], rows: int, context: float) -> float:
    """Σ at ``rows`` with the per-rows levels, made non-decreasing in rows (module docstring);
    ``sigma_at(rows, context)`` is the surface's seconds."""
    value = levels.get(rows, 1.0) * sigma_at(rows, context)
    for r, lam in levels.items():
        if r < rows:
            value = max(value, lam * sigma_at(r, context))
    below = rows - 1  # the nearest rows below without a level (λ = 1): Σ is monotone, so it bounds the rest
    while below in levels:
        below -= 1
    if below >= 1:
        value = max(value, sigma_at(below, context))
    return value
