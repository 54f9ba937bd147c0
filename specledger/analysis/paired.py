"""Paired comparisons of settings on the same prompts: ratio-of-totals intervals and equivalence (TOST).

Every figure the verdict compares is a ratio of per-prompt totals. A setting's speed-up over plain
decoding is ``S = (Σ tok_a / Σ t_a) / (Σ tok_0 / Σ t_0)``; two settings compared on the prompts both
ran give ``S_a / S_b = (Σ tok_a / Σ t_a) / (Σ tok_b / Σ t_b)`` (plain decoding cancels). Prompt
difficulty moves both sides of a pair alike, so the paired ratio is far tighter than two marginal
intervals.

Interval: the ratio estimator's linearisation. With ``log R = Σ_k s_k log Σ_i x_{k,i}`` (signs
``s_k = ±1``), each prompt's influence is ``u_i = Σ_k s_k x_{k,i} / mean(x_k)``; then
``Var(log R) ≈ Var(u) / n`` and the interval is ``exp(log R ± m_n · sd(u) / √n)`` with ``m_n`` the
confidence-sequence multiplier of :func:`specledger.analysis.sequential.cs_multiplier`: a two-sided ``1 − α``
interval that holds at every look of a race at once (unbounded below 4 prompts, 4.8 at 6, 3.9 at 10).

Decisions from [lo, hi] (each wrong with probability at most α over a whole race, however often it looks):

- *a faster than b*: lo > 1; *b faster*: hi < 1;
- *equivalent within margin m* (two one-sided tests, Schuirmann's TOST): 1/(1+m) < lo and hi < 1+m;
- otherwise *open*: more prompts are needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specledger.analysis.sequential import cs_multiplier

FASTER, SLOWER, EQUIVALENT, OPEN = "a faster", "b faster", "equivalent", "open"


@dataclass(frozen=True)
class RatioInterval:
    """A paired ratio of totals over ``n`` prompts with its two-sided ``1 − α`` interval [lo, hi] (a confidence
    sequence: it holds at every look of a race at once)."""

    ratio: float
    lo: float
    hi: float
    n: int

    def verdict(self, margin: float) -> str:
        """:data:`EQUIVALENT` when [lo, hi] lies inside [1/(1+m), 1+m] (TOST), else :data:`FASTER` /
        :data:`SLOWER` when the interval excludes 1, else :data:`OPEN`."""
        if math.isnan(self.lo) or math.isnan(self.hi):
            return OPEN
        if 1.0 / (1.0 + margin) < self.lo and self.hi < 1.0 + margin:
            return EQUIVALENT
        if self.lo > 1.0:
            return FASTER
        if self.hi < 1.0:
            return SLOWER
        return OPEN

    def to_dict(self) -> dict[str, float | int | list[float]]:
        return {"ratio": self.ratio, "ci": [self.lo, self.hi], "n": self.n}


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (scipy), ``df`` >= 1: the fixed-n, per-look interval the decisions used before their
    confidence sequence (kept for the noise benchmark's half-widths and the race simulation's comparison)."""
    from scipy.stats import t

    return float(t.ppf(p, df))


def ratio_interval(parts: Sequence[tuple[Sequence[float], int]], alpha: float = 0.05) -> RatioInterval:
    """``R = Π_k (Σ_i x_{k,i})^{s_k}`` over prompts i with its two-sided ``1 − α`` interval (module doc).

    ``parts``: (per-prompt values aligned by prompt, sign ±1). Too few prompts (fewer than 4 at α = 0.05:
    the sequence's multiplier is infinite there), or a total that is not positive, give an infinite interval
    (nothing can be decided from it)."""
    columns = [xs for xs, _ in parts]
    n = len(columns[0]) if columns else 0
    if n == 0 or any(len(c) != n for c in columns):
        return RatioInterval(math.nan, -math.inf, math.inf, n)
    x, signs = np.array(columns, dtype=float), np.array([float(sign) for _, sign in parts])
    sums = x.sum(axis=1)
    if not all(s > 0 and math.isfinite(s) for s in sums.tolist()):
        return RatioInterval(math.nan, -math.inf, math.inf, n)
    log_r = float(signs @ np.log(sums))
    if n < 2:
        return RatioInterval(math.exp(log_r), -math.inf, math.inf, n)
    u = signs @ (x * (n / sums)[:, None])
    u -= float(u.sum()) / n
    sd = math.sqrt(float(u @ u) / (n - 1))
    return _around(log_r, cs_multiplier(n, alpha), sd / math.sqrt(n), n)


def stratified_ratio(strata: Sequence[tuple[float, Sequence[Sequence[float]]]], signs: Sequence[int],
                     alpha: float = 0.05) -> RatioInterval:
    """``R = Π_k (Σ_c w_c · mean_c(x_k))^{s_k}`` over strata c (categories, each with weight ``w_c`` and its
    per-prompt values ``x_k`` aligned by prompt) with its two-sided ``1 − α`` interval: the same
    linearisation as :func:`ratio_interval`, stratified. With ``g_i = Σ_k s_k x_{k,i} / X_k`` (``X_k`` the
    weighted total), ``Var(log R) ≈ Σ_c w_c² var_c(g) / n_c`` and the confidence-sequence multiplier at
    ``Σ_c (n_c − 1)`` degrees of freedom (``m_{df+1}``; one stratum gives :func:`ratio_interval`'s). A stratum
    of positive weight with fewer than 2 prompts, too few prompts in all, or a total that is not positive, give
    an infinite interval. ``n`` is the number of prompts over every stratum."""
    used = [(float(w), [[float(v) for v in xs] for xs in arrays]) for w, arrays in strata if w > 0]
    n = sum(len(arrays[0]) if arrays else 0 for _, arrays in used)
    if not used or any(not arrays or not arrays[0] or any(len(a) != len(arrays[0]) for a in arrays)
                       for _, arrays in used):
        return RatioInterval(math.nan, -math.inf, math.inf, n)
    totals = [math.fsum(w * math.fsum(arrays[k]) / len(arrays[k]) for w, arrays in used) for k in range(len(signs))]
    if any(not (t > 0 and math.isfinite(t)) for t in totals):
        return RatioInterval(math.nan, -math.inf, math.inf, n)
    log_r = math.fsum(sign * math.log(t) for t, sign in zip(totals, signs))
    ratio = math.exp(log_r)
    if any(len(arrays[0]) < 2 for _, arrays in used):
        return RatioInterval(ratio, -math.inf, math.inf, n)
    var, df = 0.0, 0
    for w, arrays in used:
        m = len(arrays[0])
        g = [math.fsum(sign * arrays[k][i] / totals[k] for k, sign in enumerate(signs)) for i in range(m)]
        mu = math.fsum(g) / m
        var += w * w * math.fsum((x - mu) ** 2 for x in g) / (m - 1) / m
        df += m - 1
    return _around(log_r, cs_multiplier(df + 1, alpha), math.sqrt(var), n)


def _around(log_r: float, multiplier: float, se: float, n: int) -> RatioInterval:
    """``exp(log R ± multiplier · se)``; unbounded (−∞, ∞) while the multiplier is infinite (too few prompts)."""
    if not math.isfinite(multiplier):
        return RatioInterval(math.exp(log_r), -math.inf, math.inf, n)
    half = multiplier * se
    return RatioInterval(math.exp(log_r), math.exp(log_r - half), math.exp(log_r + half), n)


@dataclass(frozen=True)
class PerPrompt:
    """One setting's per-prompt totals: committed tokens and seconds (repeats summed), keyed by prompt."""

    tokens: Mapping[str, float]
    seconds: Mapping[str, float]

    @classmethod
    def from_dict(cls, d: Mapping[str, Sequence]) -> PerPrompt:
        """From ``{"prompts": [...], "tokens": [...], "seconds": [...]}`` (the scenario dicts' form)."""
        ids = list(d.get("prompts") or [])
        return cls(dict(zip(ids, d.get("tokens") or [])), dict(zip(ids, d.get("seconds") or [])))

    def prompts(self) -> set[str]:
        return {p for p in self.tokens if p in self.seconds}


def speedup_interval(spec: PerPrompt, plain: PerPrompt, alpha: float = 0.05) -> RatioInterval:
    """S = (Σ tok / Σ t)_spec / (Σ tok / Σ t)_plain on the prompts both ran."""
    shared = sorted(spec.prompts() & plain.prompts())
    return ratio_interval([
        ([spec.tokens[p] for p in shared], 1), ([spec.seconds[p] for p in shared], -1),
        ([plain.tokens[p] for p in shared], -1), ([plain.seconds[p] for p in shared], 1),
    ], alpha)


def setting_ratio(a: PerPrompt, b: PerPrompt, alpha: float = 0.05) -> RatioInterval:
    """S_a / S_b on the prompts both settings ran (their common plain baseline cancels)."""
    return speedup_interval(a, b, alpha)


__all__ = ["EQUIVALENT", "FASTER", "OPEN", "SLOWER", "PerPrompt", "RatioInterval", "ratio_interval",
           "setting_ratio", "speedup_interval", "stratified_ratio", "t_quantile"]
