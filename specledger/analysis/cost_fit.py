"""The run's cost model as the report shows it, and the optimal-γ pick.

The analysis keeps no cost model of its own: it describes the run's one measured cost model
(:class:`specledger.cost.costmodel.CostModel`, the target forward priced as s · Σ on the verify
surface measured at the run's start, drafting and other per drafter), per drafter:

* ``verify``: the forward's form and coefficients, scored on that drafter's rounds (R², RMS);
* ``draft`` and ``other``: that drafter's parts;

and, per candidate count n, the measured mean T_verify beside the model's price of n + 1 rows at that
group's mean context (:func:`verify_points`). Optimal γ comes from the end-to-end curve
(:mod:`specledger.predict.gamma`); :func:`curve_best_gamma` reads its argmax.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from specledger.cost.costmodel import CostModel, Part
from specledger.engine.drafters.catalog import PLAIN
from specledger.ledger.speedup import best_gamma
from specledger.records import RoundRecord

FORMS = {
    "surface": "t_verify = s·Σ(rows, context), Σ measured at the run's start",
    "linear": "t_verify = f0 + f_s·[n>0] + f_r·(n-1)⁺ + f_rc·n·ctx (no measured surface)",
    "draft": "t_draft = d0 + d1·γ + d2·ctx + d3·γ·ctx",
    "other": "t_other = o0 + o1·L + o2·ctx + o3·out",
}


class PartRowDict(TypedDict):
    """One part of the cost model scored on the rounds it prices: its form, coefficients (seconds per unit of each
    term), R² and RMS of its prices against the measured times, and how many rounds."""

    form: str
    coef: dict[str, float]
    r2: float | None
    rms_ms: float | None
    n_obs: int


class CostDescriptionDict(TypedDict):
    """One drafter's verify, draft and other parts under the run's cost model."""

    drafter: str
    verify: PartRowDict
    draft: PartRowDict
    other: PartRowDict


def _part_row(form: str, part: Part | None, y: Sequence[float], fitted: Sequence[float]) -> PartRowDict:
    """One table row: form, coefficients (s per unit), R² and RMS of ``fitted`` against ``y``, observations."""
    yv, fv = np.asarray(y, dtype=float), np.asarray(fitted, dtype=float)
    ss_tot = float(np.sum((yv - yv.mean()) ** 2)) if yv.size else 0.0
    ss_res = float(np.sum((yv - fv) ** 2)) if yv.size else 0.0
    return {
        "form": form,
        "coef": dict(zip(part.terms, part.coef)) if part is not None else {},
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else None,
        "rms_ms": math.sqrt(ss_res / yv.size) * 1e3 if yv.size else None,
        "n_obs": int(yv.size),
    }


def describe_cost(cost: CostModel, drafter: str, rounds: Sequence[RoundRecord]) -> CostDescriptionDict:
    """{verify, draft, other} rows of ``drafter`` under the run's cost model, scored on its solo rounds."""
    solo = [rd for rd in rounds if rd.batch_size <= 1]
    verify = _part_row(FORMS["surface" if cost.surface is not None else "linear"], cost.forward,
                       [rd.t_verify for rd in solo], [cost.round_s(rd.proposed + 1, rd.context_len) for rd in solo])
    asked = [rd for rd in solo if int(rd.gamma) > 0]
    draft = _part_row(FORMS["draft"], cost.draft.get(drafter), [rd.t_draft for rd in asked],
                      [cost.draft_s(drafter, int(rd.gamma), rd.context_len) for rd in asked])
    other = _part_row(FORMS["other"], cost.other.get(drafter) or cost.other.get(PLAIN.name),
                      [rd.t_other for rd in solo],
                      [cost.other_s(1, drafter, rd.committed, rd.context_len) for rd in solo])
    return {"drafter": drafter, "verify": verify, "draft": draft, "other": other}


def verify_points(cost: CostModel, rounds: Sequence[RoundRecord]) -> list[dict[str, float]]:
    """Mean measured T_verify per candidate count n, next to the cost model's price of n + 1 rows at that
    group's mean context."""
    groups: dict[int, list[RoundRecord]] = {}
    for rd in rounds:
        groups.setdefault(rd.proposed, []).append(rd)
    out = []
    for n in sorted(groups):
        rs = groups[n]
        ctx = float(np.mean([rd.context_len for rd in rs]))
        out.append(
            {
                "n": n,
                "rounds": len(rs),
                "mean_ctx": ctx,
                "t_verify_ms": float(np.mean([rd.t_verify for rd in rs])) * 1e3,
                "fit_verify_ms": cost.round_s(n + 1, ctx) * 1e3,
                "t_draft_ms": float(np.mean([rd.t_draft for rd in rs])) * 1e3,
            }
        )
    return out


def curve_best_gamma(curve: Sequence[dict[str, float]]) -> int:
    """The optimal γ of an S(γ) curve (:func:`specledger.ledger.speedup.best_gamma`: ties to the smaller γ,
    γ = 0 plain decoding)."""
    return int(best_gamma((p["gamma"], p["speedup"]) for p in curve))
