"""Fitted cost curves and the optimal speculation length they imply.

Per drafter, over every round of every gamma it ran (ordinary least squares, times in seconds):

    T_verify(n, ctx) = c0 + c1·n + c2·ctx  [+ c3·n·ctx when it raises adjusted R² by > 0.005]
    T_draft(γ)       = d0 + d1·γ
    T_other(γ)       = o0 + o1·γ

n = candidates verified (``proposed``), ctx = context length at the start of the round.
A column with no variation (e.g. one gamma only) cannot be identified and is dropped from
the model; the form string says which terms were kept.

Optimal γ: with the measured conditional chain a_j and proposal survival
q_i = Pr(proposed ≥ i | γ ≥ i),

    E[L](γ) = 1 + Σ_{i≤γ} q_i · Π_{j≤i} a_j,   E[n](γ) = Σ_{i≤γ} q_i
    S(γ)    = T0 · E[L](γ) / (T_draft(γ) + T_verify(E[n](γ), ctx̄) + T_other(γ)),   S(0) = 1 (plain)

and the predicted best γ is argmax S(γ) over the positions with enough observations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from specledger.analysis.metrics import chain_values, conditional_acceptance, proposal_survival
from specledger.engine.trace import RoundRecord
from specledger.ledger.acceptance import survival_from_chain

MIN_AT_RISK = 5  # fewest rounds at a position before its a_j is trusted for prediction


@dataclass
class LinearFit:
    target: str
    form: str
    coef: dict[str, float]  # seconds per unit of each term; "1" is the intercept
    r2: float | None
    rms_ms: float | None
    n_obs: int

    def predict(self, **x: float) -> float:
        """Evaluate the fitted model (seconds); unknown terms are products of their factors, e.g. ``n*ctx``."""
        total = 0.0
        for term, c in self.coef.items():
            value = 1.0
            if term != "1":
                for factor in term.split("*"):
                    value *= x[factor]
            total += c * value
        return total

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def least_squares(target: str, y: Sequence[float], columns: dict[str, Sequence[float]]) -> LinearFit | None:
    """OLS of ``y`` on an intercept plus ``columns``; constant columns are dropped. None if no data."""
    y_arr = np.asarray(y, dtype=float)
    n = y_arr.size
    if n == 0:
        return None
    names = ["1"]
    cols = [np.ones(n)]
    for name, values in columns.items():
        v = np.asarray(values, dtype=float)
        if n > 1 and np.ptp(v) > 0:
            names.append(name)
            cols.append(v)
    x = np.column_stack(cols)
    beta, *_ = np.linalg.lstsq(x, y_arr, rcond=None)
    resid = y_arr - x @ beta
    ss_res = float(resid @ resid)
    ss_tot = float(np.sum((y_arr - y_arr.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else None
    form = f"{target} = " + " + ".join(
        f"c{i}" + ("" if nm == "1" else "·" + nm.replace("*", "·")) for i, nm in enumerate(names)
    )
    return LinearFit(
        target=target,
        form=form,
        coef={nm: float(b) for nm, b in zip(names, beta)},
        r2=r2,
        rms_ms=math.sqrt(ss_res / n) * 1e3,
        n_obs=n,
    )


def _adjusted_r2(fit: LinearFit) -> float:
    p = len(fit.coef) - 1
    if fit.r2 is None or fit.n_obs - p - 1 <= 0:
        return -math.inf
    return 1.0 - (1.0 - fit.r2) * (fit.n_obs - 1) / (fit.n_obs - p - 1)


def fit_verify_cost(rounds: Sequence[RoundRecord]) -> LinearFit | None:
    """T_verify(n, ctx); the n·ctx interaction is kept only if it helps (adjusted R² + 0.005)."""
    y = [rd.t_verify for rd in rounds]
    n = [rd.proposed for rd in rounds]
    ctx = [rd.context_len for rd in rounds]
    base = least_squares("t_verify", y, {"n": n, "ctx": ctx})
    if base is None:
        return None
    extended = least_squares("t_verify", y, {"n": n, "ctx": ctx, "n*ctx": [a * b for a, b in zip(n, ctx)]})
    if (
        extended
        and len(extended.coef) > len(base.coef)
        and _adjusted_r2(extended) > _adjusted_r2(base) + 0.005
    ):
        return extended
    return base


def _static_gamma(rd: RoundRecord) -> float:
    return float(rd.gamma) if isinstance(rd.gamma, (int, float)) else float(rd.proposed)


def fit_draft_cost(rounds: Sequence[RoundRecord]) -> LinearFit | None:
    """T_draft(γ) = d0 + d1·γ."""
    return least_squares(
        "t_draft", [rd.t_draft for rd in rounds], {"gamma": [_static_gamma(rd) for rd in rounds]}
    )


def fit_other_cost(rounds: Sequence[RoundRecord]) -> LinearFit | None:
    """T_other(γ) = o0 + o1·γ."""
    return least_squares(
        "t_other", [rd.t_other for rd in rounds], {"gamma": [_static_gamma(rd) for rd in rounds]}
    )


@dataclass
class CostModel:
    drafter: str
    verify: LinearFit
    draft: LinearFit
    other: LinearFit

    def round_time(self, gamma: int, expected_n: float, ctx: float) -> float:
        """Predicted T_round(γ) in seconds at E[n] verified candidates and context ``ctx``."""
        return (
            max(self.draft.predict(gamma=gamma), 0.0)
            + max(self.verify.predict(n=expected_n, ctx=ctx), 0.0)
            + max(self.other.predict(gamma=gamma), 0.0)
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "drafter": self.drafter,
            "verify": self.verify.to_dict(),
            "draft": self.draft.to_dict(),
            "other": self.other.to_dict(),
        }


def fit_cost_model(drafter: str, rounds: Sequence[RoundRecord]) -> CostModel | None:
    """All three fitted curves of one drafter, or None without rounds."""
    fits = fit_verify_cost(rounds), fit_draft_cost(rounds), fit_other_cost(rounds)
    if any(f is None for f in fits):
        return None
    return CostModel(drafter, *fits)  # type: ignore[arg-type]


def predict_gamma_curve(
    model: CostModel, rounds: Sequence[RoundRecord], t0_s: float, max_gamma: int | None = None
) -> list[dict[str, float]]:
    """Predicted E[L](γ), T_round(γ) and S(γ) for γ = 0..Γ (Γ = deepest position with ≥ MIN_AT_RISK
    observations, capped at ``max_gamma``), from the measured chain and the fitted costs."""
    a = chain_values(conditional_acceptance(rounds), MIN_AT_RISK)
    if max_gamma is not None:
        a = a[:max_gamma]
    q = proposal_survival(rounds, len(a))
    ctx = float(np.mean([rd.context_len for rd in rounds])) if rounds else 0.0
    surv = survival_from_chain(a)
    curve = [{"gamma": 0, "el": 1.0, "t_round_ms": t0_s * 1e3, "speedup": 1.0}]
    el, expected_n = 1.0, 0.0
    for g in range(1, len(a) + 1):
        qi = q[g - 1] if math.isfinite(q[g - 1]) else 1.0
        el += qi * surv[g - 1]
        expected_n += qi
        t_round = model.round_time(g, expected_n, ctx)
        curve.append(
            {
                "gamma": g,
                "el": el,
                "t_round_ms": t_round * 1e3,
                "speedup": t0_s * el / t_round if t_round > 0 else math.nan,
            }
        )
    return curve


def best_gamma(curve: Sequence[dict[str, float]]) -> int:
    """argmax of S(γ) over the curve (ties go to the smaller γ; γ = 0 means plain decoding)."""
    best = max(curve, key=lambda p: (p["speedup"] if math.isfinite(p["speedup"]) else -math.inf, -p["gamma"]))
    return int(best["gamma"])


def verify_points(model: CostModel, rounds: Sequence[RoundRecord]) -> list[dict[str, float]]:
    """Mean measured T_verify per candidate count n, next to the fit evaluated at that group's mean context."""
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
                "fit_verify_ms": model.verify.predict(n=n, ctx=ctx) * 1e3,
                "t_draft_ms": float(np.mean([rd.t_draft for rd in rs])) * 1e3,
            }
        )
    return out
