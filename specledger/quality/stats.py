"""Paired comparison of task scores: speculative vs plain decoding on the same prompts.

Pairs are positions where both scores exist. With differences ``d_i = spec_i - base_i``:

* ``mean_difference`` = mean(d); ``ci95`` = percentile interval of the mean of ``d``
  resampled with replacement (paired bootstrap, ``n_bootstrap`` draws, seeded);
* ``p_value`` (bootstrap, two-sided) = min(1, 2 * min(P*(mean <= 0), P*(mean >= 0))) over the
  bootstrap distribution -- 1.0 when every difference is zero;
* ``sign_test_p`` = exact two-sided binomial test of wins vs losses (ties dropped), 1.0
  without any win or loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import binomtest

from specledger.errors import require


def _valid(value: float | None) -> bool:
    return value is not None and not isinstance(value, bool) and np.isfinite(value)


def paired_scores(
    base_scores: Sequence[float | None], spec_scores: Sequence[float | None]
) -> tuple[np.ndarray, np.ndarray]:
    """``(base, spec)`` arrays of the positions scored on both sides."""
    require(
        len(base_scores) == len(spec_scores),
        f"quality comparison needs one score per prompt on both sides, got {len(base_scores)} plain "
        f"and {len(spec_scores)} speculative: score the same prompts in the same order",
    )
    pairs = [(b, s) for b, s in zip(base_scores, spec_scores) if _valid(b) and _valid(s)]
    base = np.array([b for b, _ in pairs], dtype=float)
    spec = np.array([s for _, s in pairs], dtype=float)
    return base, spec


def bootstrap_means(differences: np.ndarray, n_bootstrap: int, seed: int) -> np.ndarray:
    """Means of ``n_bootstrap`` resamples (with replacement) of ``differences``."""
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, len(differences), size=(n_bootstrap, len(differences)))
    return differences[indices].mean(axis=1)


def compare_quality(
    base_scores: Sequence[float | None],
    spec_scores: Sequence[float | None],
    n_bootstrap: int = 10_000,
    seed: int = 0,
) -> dict:
    """Means, paired difference, bootstrap CI and p-value, and sign test (see the module doc).

    Keys: ``n_pairs``, ``n_unscored`` (positions skipped because either side is None),
    ``base_mean``, ``spec_mean``, ``mean_difference``, ``ci95`` ([low, high]), ``p_value``,
    ``wins``, ``losses``, ``ties``, ``sign_test_p``. Statistics are None with no pairs.
    """
    require(n_bootstrap >= 1, f"n_bootstrap must be >= 1, got {n_bootstrap}")
    base, spec = paired_scores(base_scores, spec_scores)
    n_pairs = len(base)
    summary: dict = {"n_pairs": n_pairs, "n_unscored": len(base_scores) - n_pairs}
    if n_pairs == 0:
        return (
            summary
            | dict.fromkeys(("base_mean", "spec_mean", "mean_difference", "ci95", "p_value", "sign_test_p"))
            | {"wins": 0, "losses": 0, "ties": 0}
        )
    differences = spec - base
    boot = bootstrap_means(differences, n_bootstrap, seed)
    p_value = min(1.0, 2 * min(float(np.mean(boot <= 0)), float(np.mean(boot >= 0))))
    wins, losses = int(np.sum(differences > 0)), int(np.sum(differences < 0))
    sign_p = 1.0 if wins + losses == 0 else float(binomtest(wins, wins + losses, 0.5).pvalue)
    return summary | {
        "base_mean": float(base.mean()),
        "spec_mean": float(spec.mean()),
        "mean_difference": float(differences.mean()),
        "ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
        "p_value": p_value,
        "wins": wins,
        "losses": losses,
        "ties": n_pairs - wins - losses,
        "sign_test_p": sign_p,
    }
