"""Per-rows levels: the run's own rounds correct a measured solo surface where they measured it.

A surface measured at the start of a run (:func:`specledger.engine.calibrate.measure_rows_axis`) gives the
*shape* of the verify cost in rows; the run's rounds give its *level*: t_verify ≈ s · Σ(rows, c) with one
factor s (:func:`specledger.cost.costmodel.fit_cost_model`). Where the run verified many rounds at one
rows value r, their mean also says how far the engine's real rounds sit from the surface at r (a
shape error of a few short timed forwards, or a kernel path that the back-to-back measurement does not
take). The level of r is that ratio, shrunk toward the global fit with ``PSEUDO_ROUNDS`` pseudo-rounds:

    λ_r = (n_r · λ̂_r + k) / (n_r + k),   λ̂_r = Σ t_verify / (s · Σ Σ(r, c))   over the n_r rounds at r

Rows the run never verified are priced on the line through the levelled values of the measured rows
that bracket them, drawn in the surface's own coordinate (:func:`through_levels`):

    L(r, c) = L(a) + (L(b) − L(a)) · (Σ(r, c) − Σ(a, c)) / (Σ(b, c) − Σ(a, c)),   L(x) = λ_x · Σ(x, c)

with a < r < b the nearest measured rows; beyond the largest measured rows a and b are the smallest and the
largest. This is the two-part physics of a forward: a one-row part (the weight stream, memory) and an
extra-rows part (arithmetic), each with its own level. A shared machine moves them apart -- the run measured
1- and 5-row rounds at 0.94 and 1.06 of a surface taken minutes earlier, and 9-row rounds at 1.16 (held-out
forecast, 2026-12-02) -- so a single level (λ = 1) beyond the measured rows underpriced deep verification by
13 %, the error the seed chapter warns about. The priced forward

    T(r, c) = s · max(L(r, c), max_{r' < r} L(r', c))

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


def through_levels(f_at: Any, level_at: Mapping[int, float], rows: int, context: float) -> float:
    """``f_at(rows, context)`` (seconds) scaled by the levels measured at some rows: λ_rows · f where ``rows`` is
    measured, else on the line through the bracketing measured rows (beyond them: the smallest and the largest)
    in f's own coordinate (the module docstring's L(r, c) with Σ = f); f itself where nothing is measured."""
    f = f_at(rows, context)
    if rows in level_at or not level_at:
        return level_at.get(rows, 1.0) * f
    measured = sorted(level_at)
    lower = [r for r in measured if r < rows]
    upper = [r for r in measured if r > rows]
    a, b = (lower[-1], upper[0]) if lower and upper else (measured[0], measured[-1])
    if a == b:
        return level_at[a] * f
    fa, fb = f_at(a, context), f_at(b, context)
    la, lb = level_at[a] * fa, level_at[b] * fb
    if not fb > fa:
        return level_at[a if rows < a else b] * f
    return max(la + (lb - la) * (f - fa) / (fb - fa), 0.0)


def levelled(sigma_at: Any, levels: Mapping[int, float], rows: int, context: float) -> float:
    """Σ at ``rows`` with the per-rows levels, made non-decreasing in rows (module docstring);
    ``sigma_at(rows, context)`` is the surface's seconds."""
    value = through_levels(sigma_at, levels, rows, context)
    for r in range(1, rows):
        if r in levels or r in (1, rows - 1):  # on every stretch between them L is monotone: its ends bound it
            value = max(value, through_levels(sigma_at, levels, r, context))
    return value
