"""Small statistics helpers: percentiles and the paired prompt bootstrap of a throughput ratio."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

PERCENTILES: tuple[int, ...] = (50, 95, 99)


def finite_or_none(x: float | None) -> float | None:
    """``x`` as a plain float, or None when it is missing, NaN or infinite (JSON has no NaN)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def distribution(values: Sequence[float], scale: float = 1.0) -> dict[str, float | int | None]:
    """Summary of a sample: n, mean, P50/P95/P99, max, each multiplied by ``scale`` (e.g. 1e3 for ms).

    Percentiles use linear interpolation between order statistics (numpy's default); an empty
    sample gives None for every figure, never 0.
    """
    arr = np.asarray(list(values), dtype=float)
    out: dict[str, float | int | None] = {"n": int(arr.size)}
    if arr.size == 0:
        out.update({"mean": None, "max": None, **{f"p{q}": None for q in PERCENTILES}})
        return out
    out["mean"] = float(arr.mean() * scale)
    for q in PERCENTILES:
        out[f"p{q}"] = float(np.percentile(arr, q) * scale)
    out["max"] = float(arr.max() * scale)
    return out


def ratio_of_totals(tokens: np.ndarray, seconds: np.ndarray) -> float:
    """Long-run speed Σ tokens / Σ seconds (never the mean of per-item speeds); NaN if no time."""
    total = float(np.sum(seconds))
    return float(np.sum(tokens)) / total if total > 0 else math.nan


def paired_speedup_bootstrap(
    spec_tokens: np.ndarray,
    spec_seconds: np.ndarray,
    base_tokens: np.ndarray,
    base_seconds: np.ndarray,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """Speed-up S = (Σtok/Σt)_spec / (Σtok/Σt)_plain over paired prompts, with a percentile bootstrap CI.

    Arrays are aligned by prompt (index i is the same prompt on both sides). Each resample draws
    prompts with replacement and applies the *same* draw to both sides (paired), so the prompt
    mix cancels. Returns (point, low, high); the CI is (NaN, NaN) with fewer than 2 prompts.
    """
    arrays = [np.asarray(a, dtype=float) for a in (spec_tokens, spec_seconds, base_tokens, base_seconds)]
    n = arrays[0].size
    if n == 0:
        return math.nan, math.nan, math.nan
    point = ratio_of_totals(arrays[0], arrays[1]) / ratio_of_totals(arrays[2], arrays[3])
    if n < 2 or n_resamples < 1:
        return point, math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_resamples, n))
    st, ss, bt, bs = (a[idx].sum(axis=1) for a in arrays)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = (st / ss) / (bt / bs)
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return point, math.nan, math.nan
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(ratios, [alpha, 1.0 - alpha])
    return point, float(low), float(high)


def log_ratio_t_interval(ratios: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """A t-interval for the typical ratio from independent paired repeats: exp(mean(log r) ± t_(n-1) s/√n).

    Used where the unit of replication is a whole repeated run (a serving load point), so a handful
    of values: a percentile bootstrap over 3-5 values is too narrow, the t-interval is not.
    (NaN, NaN) with fewer than 2 finite positive ratios."""
    from scipy import stats as sps

    logs = np.log([r for r in ratios if r is not None and math.isfinite(r) and r > 0])
    n = logs.size
    if n < 2:
        return math.nan, math.nan
    half = float(sps.t.ppf(0.5 + level / 2.0, n - 1)) * float(logs.std(ddof=1)) / math.sqrt(n)
    centre = float(logs.mean())
    return math.exp(centre - half), math.exp(centre + half)
