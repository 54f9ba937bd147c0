"""One cost model per run: seconds of every part of a request on one machine.

Every part is a linear model with **non-negative** coefficients on non-negative, non-decreasing
features, so each is monotone by construction (more rows, more context, more candidates never
cost less) and a round with candidates never costs less than a plain step:

    forward (one target forward; solo round = batch 1), with a measured surface (the normal case: every
    ``specledger run`` measures the rows axis at start, :mod:`specledger.cost.surface`):
      T_s(R, B, c) = s · Σ(R, B, c)                            (Σ: the measured surface, interpolated;
                                                               s: one level factor fitted on the run's rounds)
    so the *shape* in rows (what verifying more candidates costs) is measured side by side, never
    extrapolated from the γ's a run happened to use; the level s follows the machine during the run.
    A solo surface is also levelled per rows value where the run verified many rounds at it
    (λ_r, :mod:`specledger.cost.levels`): T_s(R, 1, c) = s · λ_R · Σ(R, 1, c), monotone in R.
    Without a surface (old runs, a bare trace):
      T_s(R, B, c) = f0 + f_s·[R > B] + f_r·(R − B − 1)⁺ + f_b·(B − 1) + f_c·B·c + f_rc·(R − B)·c
      (the first candidate row is priced apart: a one-row forward may cost what a two-row one does)
      round_s(rows, c) = T_s(rows, 1, c)                      (rows = γ + 1, c = context length)
    prefill:  T_p(P) = p0 + p1·P + p2·P²/1000                 (P = prompt tokens)
    drafting: T_d(γ, c) = d0 + d1·γ + d2·c + d3·γ·c           per drafter; T_d(0, ·) = 0
    other:    T_o(L, c, o) = o0 + o1·L + o2·c + o3·o          per drafter (L = tokens committed, o = output
                                                             so far: detokenisation and stop checks re-read it)
    begin:    T_b(P)   = b0 + b1·P                            per drafter (drafter.begin inside prefill;
                                                             fitted jointly with T_p on every request)

Fitting is non-negative least squares (scipy ``nnls``) on columns scaled to unit maximum, with a
few Huber reweighting passes so that timing outliers of a busy machine do not steer it; the
uncertainty of each part is the covariance of its coefficients over a bootstrap of requests
(``coef_cov``), so ``*_sd`` gives a standard error of any prediction.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from specledger.cost.levels import fit_row_levels, levelled
from specledger.cost.pricer import step_s_each
from specledger.cost.serialized import CostModelDict, PartDict
from specledger.cost.surface import CostSurface
from specledger.errors import SpecLedgerError
from specledger.records import PLAIN_DRAFTER, RequestRecord, RoundRecord

FORWARD_TERMS = ("1", "spec", "rows", "batch", "ctx", "rows_ctx")
SURFACE_TERMS = ("surface",)  # T_s = s · Σ(R, B, c) when a measured surface prices the forward
PREFILL_TERMS = ("1", "P", "P2")
DRAFT_TERMS = ("1", "g", "ctx", "g_ctx")
OTHER_TERMS = ("1", "L", "ctx", "out")
BEGIN_TERMS = ("1", "P")
SLOT_TERM = "P_lnS"  # prefill into a server of S sequence slots (a serving fit, see simulate.profile)
OVERHEAD_TERMS = ("1", "B")  # per-step overhead of a batched step (a serving fit)
NOISE_QUANTILES = np.linspace(0.0, 1.0, 101)  # the quantiles the step-noise ratios are stored at
KIND = "cost-model"


def forward_features(total_rows: float, batch: float, context: float) -> dict[str, float]:
    """Features of T_s (see module docstring); all non-negative and non-decreasing in rows and context."""
    extra = max(float(total_rows) - float(batch), 0.0)
    return {
        "1": 1.0,
        "spec": 1.0 if extra > 0 else 0.0,
        "rows": max(extra - 1.0, 0.0),
        "batch": max(float(batch) - 1.0, 0.0),
        "ctx": float(batch) * float(context),
        "rows_ctx": extra * float(context),
    }


def prefill_features(prompt_tokens: float) -> dict[str, float]:
    p = float(prompt_tokens)
    return {"1": 1.0, "P": p, "P2": p * p / 1000.0}


def slot_prefill_features(prompt_tokens: float, slots: float) -> dict[str, float]:
    """:func:`prefill_features` plus P ln S (S >= 1 sequence slots)."""
    x = prefill_features(prompt_tokens)
    x[SLOT_TERM] = float(prompt_tokens) * math.log(max(float(slots), 1.0))
    return x


def draft_features(gamma: float, context: float) -> dict[str, float]:
    g, c = float(gamma), float(context)
    return {"1": 1.0, "g": g, "ctx": c, "g_ctx": g * c}


def other_features(committed: float, context: float, output: float = 0.0) -> dict[str, float]:
    return {"1": 1.0, "L": float(committed), "ctx": float(context), "out": float(output)}


def begin_features(prompt_tokens: float) -> dict[str, float]:
    return {"1": 1.0, "P": float(prompt_tokens)}


@dataclass
class Part:
    """y = Σ coef[t]·x[t] with coef ≥ 0; ``cov`` is the bootstrap covariance of the coefficients."""

    terms: list[str]
    coef: list[float]
    cov: list[list[float]] | None = None
    rms_s: float | None = None
    n_obs: int = 0

    def value(self, x: dict[str, float]) -> float:
        return float(sum(c * x[t] for t, c in zip(self.terms, self.coef)))

    def sd(self, x: dict[str, float]) -> float:
        """Standard error of :meth:`value` from the coefficient covariance (0 without one)."""
        if not self.cov:
            return 0.0
        v = np.array([x[t] for t in self.terms])
        var = float(v @ np.asarray(self.cov) @ v)
        return math.sqrt(max(var, 0.0))

    def to_dict(self) -> PartDict:
        return {"terms": list(self.terms), "coef": list(self.coef), "cov": self.cov, "rms_s": self.rms_s,
                "n_obs": self.n_obs}

    @classmethod
    def from_dict(cls, d: PartDict) -> Part:
        return cls(list(d["terms"]), [float(c) for c in d["coef"]], d.get("cov"), d.get("rms_s"),
                   int(d.get("n_obs", 0)))

    @classmethod
    def zero(cls, terms: Sequence[str]) -> Part:
        return cls(list(terms), [0.0] * len(terms))


HUBER_K = 2.0  # residuals beyond k robust standard deviations are down-weighted (timing outliers)


def _nnls(x: np.ndarray, y: np.ndarray, robust_iters: int = 3) -> np.ndarray:
    """Non-negative least squares on columns scaled to unit maximum (constant-zero columns get 0),
    made robust to timing outliers (a busy machine) by a few Huber reweighting passes:
    w_i = min(1, k·σ̂ / |r_i|) with σ̂ = 1.4826·MAD of the residuals."""
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    w = np.ones(len(y))
    beta = np.zeros(x.shape[1])
    for it in range(robust_iters + 1):
        sw = np.sqrt(w)
        beta, _ = nnls(xs * sw[:, None], y * sw, maxiter=50 * x.shape[1])
        if it == robust_iters or len(y) <= x.shape[1]:
            break
        r = y - xs @ beta
        sigma = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        if sigma <= 0:
            break
        w = np.minimum(1.0, HUBER_K * sigma / np.maximum(np.abs(r), 1e-300))
    return beta / scale


def fit_part(
    terms: Sequence[str],
    rows: Sequence[dict[str, float]],
    y: Sequence[float],
    groups: Sequence[Any] | None = None,
    n_boot: int = 30,
    seed: int = 0,
) -> Part:
    """NNLS fit of ``y`` on the features ``rows`` (dicts over ``terms``), with a bootstrap over
    ``groups`` (e.g. request ids: rounds of one request are resampled together) for the covariance."""
    terms = list(terms)
    if not rows:
        return Part.zero(terms)
    x = np.array([[r[t] for t in terms] for r in rows], dtype=float)
    yv = np.asarray(y, dtype=float)
    beta = _nnls(x, yv)
    resid = yv - x @ beta
    cov = None
    if n_boot > 1 and len(rows) > len(terms):
        g = np.asarray(groups if groups is not None else np.arange(len(rows)))
        uniq, inverse = np.unique(g, return_inverse=True)
        members = [np.flatnonzero(inverse == i) for i in range(len(uniq))]
        rng = np.random.default_rng(seed)
        samples = []
        for _ in range(n_boot):
            pick = rng.integers(0, len(uniq), len(uniq))
            idx = np.concatenate([members[i] for i in pick])
            samples.append(_nnls(x[idx], yv[idx]))
        cov = np.cov(np.array(samples).T).reshape(len(terms), len(terms)).tolist()
    return Part(terms, [float(b) for b in beta], cov, float(np.sqrt(np.mean(resid**2))), len(rows))


@dataclass
class CostModel:
    """Seconds of every part of a request on one machine/device (see module docstring for the forms).

    Monotone and physically sane by construction: non-negative coefficients on non-decreasing
    features, so ``round_s(rows > 1, c) >= round_s(1, c)`` and ``step_s`` never falls with rows.
    """

    source: str
    forward: Part
    prefill: Part
    draft: dict[str, Part] = field(default_factory=dict)
    other: dict[str, Part] = field(default_factory=dict)
    begin: dict[str, Part] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    surface: CostSurface | None = None  # measured forward shape; forward then has SURFACE_TERMS
    overhead: Part | None = None  # per-step overhead o0 + o1·B of a batched step (a serving fit); else per request
    forward_ratios: list[float] = field(default_factory=list)  # step noise: t / fitted, 101 quantiles
    prefill_ratios: list[float] = field(default_factory=list)  # prefill noise at fixed work, 101 quantiles
    row_levels: dict[int, float] = field(default_factory=dict)  # solo surface: λ_r per rows (cost/levels.py)

    def forward_x(self, total_rows: float, batch: float, context: float) -> dict[str, float]:
        """Features of one forward for :attr:`forward`: the surface's seconds, or the linear form's features."""
        if self.surface is not None:
            if self.surface.batches == (1,):  # a solo surface: a packed step costs what its total rows cost solo
                rows = max(int(total_rows), 1)
                if self.row_levels:
                    return {"surface": levelled(self.surface.round_s, self.row_levels, rows, context)}
                return {"surface": self.surface.round_s(rows, context)}
            return {"surface": self.surface.step_s(total_rows, batch, context)}
        return forward_features(total_rows, batch, context)

    def forward_vector(self, total_rows: float, batch: float, context: float) -> np.ndarray:
        """:meth:`forward_x` as an array in the order of ``forward.terms``."""
        x = self.forward_x(total_rows, batch, context)
        return np.array([x[t] for t in self.forward.terms])

    # -- the contract (specledger/notes PERFMODEL_API) ------------------------------------
    def prefill_s(self, prompt_tokens: int, slots: int = 1) -> float:
        """T_p(P): target prefill of ``prompt_tokens`` (drafter ``begin`` not included); a serving fit with
        the P ln S term also prices the server's ``slots``."""
        if SLOT_TERM in self.prefill.terms:
            return self.prefill.value(slot_prefill_features(prompt_tokens, slots))
        return self.prefill.value(prefill_features(prompt_tokens))

    @property
    def slot_dependent_prefill(self) -> bool:
        """Whether :meth:`prefill_s` depends on the server's slot count (the simulator then passes it)."""
        return SLOT_TERM in self.prefill.terms

    @property
    def has_noise(self) -> bool:
        """Whether the model carries measured step noise (:meth:`jitter`)."""
        return bool(self.forward_ratios or self.prefill_ratios)

    def jitter(self, u: float) -> tuple[float, float]:
        """(forward, prefill) multipliers at quantile ``u`` in [0, 1) of the measured ratios (1 without them):
        the machine's own step-time noise, so tails (ITL P99, stalls) are not those of a perfectly steady
        machine. The simulator passes a keyed uniform (:func:`specledger.simulate.chains.keyed_stream`)."""
        f = float(np.interp(u, NOISE_QUANTILES, self.forward_ratios)) if self.forward_ratios else 1.0
        p = float(np.interp(u, NOISE_QUANTILES, self.prefill_ratios)) if self.prefill_ratios else 1.0
        return f, p

    def round_s(self, rows: int, context: float) -> float:
        """Solo target forward over ``rows`` = γ + 1 rows at ``context`` tokens (verify time)."""
        return self.step_s(rows, 1, context)

    def step_s(self, total_rows: int, batch: int, context: float) -> float:
        """One packed forward over ``total_rows`` rows of ``batch`` requests at mean context ``context``."""
        if batch < 1 or total_rows < batch:
            raise ValueError(f"a step needs total_rows >= batch >= 1, got rows={total_rows} batch={batch}")
        return self.forward.value(self.forward_x(total_rows, batch, context))

    def step_s_many(self, rows: np.ndarray, batch: int, context: np.ndarray) -> np.ndarray:
        """:meth:`step_s` for every (rows_s, context_s), rows clipped below at ``batch``."""
        b = max(int(batch), 1)
        return step_s_each(self, np.maximum(rows, b), b, context)

    def draft_s(self, drafter: str, gamma: int, context: float = 0.0) -> float:
        """One request's drafting time in one round asking ``gamma`` candidates (0 when gamma = 0)."""
        if gamma <= 0 or drafter in (PLAIN_DRAFTER, ""):
            return 0.0
        part = self.draft.get(drafter)
        return part.value(draft_features(gamma, context)) if part else 0.0

    def other_s(self, batch: int = 1, drafter: str = PLAIN_DRAFTER, committed: float = 1.0,
                context: float = 0.0, output: float = 0.0) -> float:
        """Per-round overhead (sampling, acceptance, cache and stop checks, detokenisation). A serving fit
        measured it per batched step (:attr:`overhead`, o0 + o1·B); else ``batch`` times the per-request
        overhead of the solo rounds."""
        if self.overhead is not None:
            return self.overhead.value({"1": 1.0, "B": float(batch)})
        part = self.other.get(drafter) or self.other.get(PLAIN_DRAFTER)
        per = part.value(other_features(committed, context, output)) if part else 0.0
        return max(int(batch), 1) * per

    def begin_s(self, drafter: str, prompt_tokens: int) -> float:
        """Drafter start-up inside the prefill (index building etc.), 0 for plain decoding."""
        part = self.begin.get(drafter)
        return part.value(begin_features(prompt_tokens)) if part else 0.0

    # -- uncertainty -------------------------------------------------------------------------
    def round_sd(self, rows: int, context: float) -> float:
        return self.forward.sd(self.forward_x(rows, 1, context))

    def prefill_sd(self, prompt_tokens: int) -> float:
        return self.prefill.sd(prefill_features(prompt_tokens))

    def perturbed(self, rng: np.random.Generator) -> CostModel:
        """A draw of the model from its coefficient uncertainty (normal, clipped at 0)."""

        def draw(p: Part) -> Part:
            if not p.cov:
                return p
            c = rng.multivariate_normal(p.coef, np.asarray(p.cov), method="eigh")
            return Part(p.terms, [max(float(v), 0.0) for v in c], p.cov, p.rms_s, p.n_obs)

        return CostModel(self.source, draw(self.forward), draw(self.prefill),
                         {k: draw(v) for k, v in self.draft.items()},
                         {k: draw(v) for k, v in self.other.items()},
                         {k: draw(v) for k, v in self.begin.items()}, dict(self.meta), self.surface,
                         draw(self.overhead) if self.overhead is not None else None, self.forward_ratios,
                         self.prefill_ratios, self.row_levels)

    # -- persistence ---------------------------------------------------------------------
    def to_dict(self) -> CostModelDict:
        return {
            "kind": KIND,
            "source": self.source,
            "forms": {
                "forward": "T_s(R,B,c) = f0 + f_s*[R>B] + f_r*max(R-B-1,0) + f_b*(B-1) + f_c*B*c + f_rc*(R-B)*c",
                "prefill": "T_p(P) = p0 + p1*P + p2*P^2/1000",
                "draft": "T_d(g,c) = d0 + d1*g + d2*c + d3*g*c (0 at g=0)",
                "other": "T_o(L,c,o) = o0 + o1*L + o2*c + o3*o (o = output tokens so far)",
                "begin": "T_b(P) = b0 + b1*P",
            },
            "forward": self.forward.to_dict(),
            "prefill": self.prefill.to_dict(),
            "draft": {k: v.to_dict() for k, v in self.draft.items()},
            "other": {k: v.to_dict() for k, v in self.other.items()},
            "begin": {k: v.to_dict() for k, v in self.begin.items()},
            "meta": self.meta,
            "surface": self.surface.to_dict() if self.surface is not None else None,
            "overhead": self.overhead.to_dict() if self.overhead is not None else None,
            "forward_ratios": self.forward_ratios,
            "prefill_ratios": self.prefill_ratios,
            "row_levels": {str(k): v for k, v in self.row_levels.items()},
        }

    @classmethod
    def from_dict(cls, d: CostModelDict) -> CostModel:
        try:
            return cls(
                source=str(d.get("source", "")),
                forward=Part.from_dict(d["forward"]),
                prefill=Part.from_dict(d["prefill"]),
                draft={k: Part.from_dict(v) for k, v in d.get("draft", {}).items()},
                other={k: Part.from_dict(v) for k, v in d.get("other", {}).items()},
                begin={k: Part.from_dict(v) for k, v in d.get("begin", {}).items()},
                meta=dict(d.get("meta", {})),
                surface=CostSurface.from_dict(d["surface"]) if d.get("surface") else None,
                overhead=Part.from_dict(d["overhead"]) if d.get("overhead") else None,
                forward_ratios=[float(v) for v in d.get("forward_ratios", [])],
                prefill_ratios=[float(v) for v in d.get("prefill_ratios", [])],
                row_levels={int(k): float(v) for k, v in (d.get("row_levels") or {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecLedgerError(f"malformed cost model ({exc}); re-run `specledger calibrate`") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON atomically (``specledger.rundir.write_json_atomic``)."""
        from specledger.rundir import write_json_atomic

        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostModel:
        from specledger.rundir import read_json

        p = Path(path)
        if not p.exists():
            raise SpecLedgerError(f"cost model not found: {p}; run `specledger calibrate --out {p}` or re-run")
        return cls.from_dict(read_json(p, "re-run `specledger calibrate`"))


# -- fitting from a run's traces --------------------------------------------------------------


def _fit_by(
    records: Sequence[RequestRecord],
    terms: Sequence[str],
    pick: Callable[[RoundRecord], bool],
    feats: Callable[[RoundRecord, RequestRecord], dict[str, float]],
    value: Callable[[RoundRecord], float],
    n_boot: int,
) -> Part | None:
    xs, ys, gs = [], [], []
    for r in records:
        for rd in r.rounds:
            if pick(rd):
                xs.append(feats(rd, r))
                ys.append(value(rd))
                gs.append(r.request_id)
    return fit_part(terms, xs, ys, gs, n_boot=n_boot) if xs else None


def outside_rounds(r: RequestRecord) -> float:
    """Seconds of a request outside its rounds: the prefill (with the drafter's begin) and the first
    token's emission, T - Σ t_round (never below the recorded t_prefill)."""
    return max(r.total_time - sum(rd.t_round for rd in r.rounds), r.t_prefill)


def fit_prefill_begin(records: Sequence[RequestRecord], n_boot: int = 30) -> tuple[Part, dict[str, Part]]:
    """T_p and every drafter's T_b from one joint fit of all requests' time outside their rounds:

        outside_rounds(r) = T_p(P) + Σ_d [drafter(r) = d]·T_b,d(P)

    The prefill is the same target forward whatever the drafter, so every request (plain and
    speculative) measures it; begin is what a drafter adds on top. One NNLS over all requests (Huber,
    bootstrap over prompts, so a prompt's plain and speculative requests are resampled together)
    rather than T_p from plain requests alone and T_b from their clipped residuals: the clip
    max(·, 0) biases T_b upward whenever T_p is noisy, and plain requests are a minority of a run."""
    drafters = sorted({r.drafter for r in records if r.drafter != PLAIN_DRAFTER})
    begin_cols = [(d, t, f"begin[{d}]:{t}") for d in drafters for t in BEGIN_TERMS]
    terms = [*PREFILL_TERMS, *(name for _, _, name in begin_cols)]
    rows = []
    for r in records:
        x = prefill_features(r.prompt_tokens)
        b = begin_features(r.prompt_tokens)
        x.update({name: (b[t] if r.drafter == d else 0.0) for d, t, name in begin_cols})
        rows.append(x)
    joint = fit_part(terms, rows, [outside_rounds(r) for r in records],
                     [r.prompt_id or r.request_id for r in records], n_boot)

    def sub(idx: list[int], names: Sequence[str], n_obs: int) -> Part:
        cov = np.asarray(joint.cov)[np.ix_(idx, idx)].tolist() if joint.cov else None
        return Part(list(names), [joint.coef[i] for i in idx], cov, joint.rms_s, n_obs)

    prefill = sub(list(range(len(PREFILL_TERMS))), PREFILL_TERMS, len(records))
    begin = {}
    for d in drafters:
        idx = [len(PREFILL_TERMS) + k for k, (dd, _, _) in enumerate(begin_cols) if dd == d]
        begin[d] = sub(idx, BEGIN_TERMS, sum(r.drafter == d for r in records))
    return prefill, begin


def fit_cost_model(records: Iterable[RequestRecord], source: str = "", n_boot: int = 30,
                   surface: CostSurface | None = None) -> CostModel:
    """Fit every part from a run's traces (all drafters share the target forward and prefill).

    Forward: every solo round's ``t_verify`` against rows = proposed + 1 and its context: with a
    ``surface``, one level factor s (t_verify ≈ s · Σ(rows, 1, c), robust NNLS); else the linear form.
    Prefill and begin: one joint fit over every request's time outside its rounds
    (:func:`fit_prefill_begin`); with no plain request, the prefill is fitted on all requests and
    begin on the non-negative rest.
    Draft / other: per drafter, rounds that asked γ > 0 for drafting (other: every round).
    """
    records = [r for r in records]
    if not records:
        raise SpecLedgerError("no requests to fit a cost model on; run `specledger run` first")
    solo = [r for r in records if all(rd.batch_size <= 1 for rd in r.rounds)]
    levels: dict[int, float] = {}
    if surface is not None:
        forward = _fit_by(solo, SURFACE_TERMS, lambda rd: True,
                          lambda rd, r: {"surface": surface.round_s(rd.proposed + 1, rd.context_len)},
                          lambda rd: rd.t_verify, n_boot) or Part(list(SURFACE_TERMS), [1.0])
        if surface.batches == (1,):
            levels = fit_row_levels(((rd.proposed + 1, rd.t_verify, surface.round_s(rd.proposed + 1, rd.context_len))
                                     for r in solo for rd in r.rounds), forward.coef[0])
    else:
        forward = _fit_by(solo, FORWARD_TERMS, lambda rd: True,
                          lambda rd, r: forward_features(rd.proposed + 1, 1, rd.context_len),
                          lambda rd: rd.t_verify, n_boot) or Part.zero(FORWARD_TERMS)
    begin: dict[str, Part] = {}
    if any(r.drafter == PLAIN_DRAFTER for r in records):
        prefill, begin = fit_prefill_begin(records, n_boot)
    else:  # no plain request: T_p and T_b are not separable; the prefill takes all, begin the clipped rest
        prefill = fit_part(PREFILL_TERMS, [prefill_features(r.prompt_tokens) for r in records],
                           [outside_rounds(r) for r in records], [r.prompt_id or r.request_id for r in records],
                           n_boot)
    draft: dict[str, Part] = {}
    other: dict[str, Part] = {}
    for d in sorted({r.drafter for r in records}):
        recs = [r for r in records if r.drafter == d]
        o = _fit_by(recs, OTHER_TERMS, lambda rd: True, lambda rd, r: other_features(rd.committed, rd.context_len,
                                                                                   rd.context_len - r.prompt_tokens),
                    lambda rd: rd.t_other, n_boot)
        if o is not None:
            other[d] = o
        if d == PLAIN_DRAFTER:
            continue
        dr = _fit_by(recs, DRAFT_TERMS, lambda rd: int(rd.gamma) > 0,
                     lambda rd, r: draft_features(rd.gamma, rd.context_len), lambda rd: rd.t_draft, n_boot)
        if dr is not None:
            draft[d] = dr
        if d not in begin:
            resid = [max(outside_rounds(r) - prefill.value(prefill_features(r.prompt_tokens)), 0.0) for r in recs]
            begin[d] = fit_part(BEGIN_TERMS, [begin_features(r.prompt_tokens) for r in recs], resid,
                                [r.request_id for r in recs], n_boot)
    draft_gammas = {d: sorted({int(rd.gamma) for r in records if r.drafter == d for rd in r.rounds if rd.gamma > 0})
                    for d in draft}
    return CostModel(source or "fitted from traces", forward, prefill, draft, other, begin,
                     {"requests": len(records), "draft_gammas": draft_gammas}, surface, row_levels=levels)
