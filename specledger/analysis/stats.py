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
