"""Intervals that stay valid however often they are looked at: a confidence sequence for a mean.

The race (:mod:`specledger.mainjob.race`) asks for the decisions after every round and stops a comparison as
soon as its interval clears a threshold, so a fixed-n interval (Student's t at level α per look) would be
wrong far more often than α over a race. Every paired interval of the decisions (:mod:`specledger.analysis.paired`:
S against plain and each ratio of two settings) is instead ``log R ± m_n · sd(u) / √n`` with the multiplier
``m_n`` of Lai's (1976) confidence sequence for a normal mean with unknown variance (the scale-invariant
normal mixture; Wang & Ramdas 2023, "Anytime-valid t-tests and confidence sequences for Gaussian means with
unknown variance"). With ``ρ²`` the mixture's prior variance of the standardised effect ``μ/σ``::

    q_n = 1 − (α / √(1 + nρ²))^(2/n)
    m_n = √( (n − 1) · q_n · (1 + nρ²) / (nρ² − q_n · (1 + nρ²)) )      (∞ when the denominator is ≤ 0)

It is the inversion of the mixture martingale ``M_n = (1 + nρ²)^(-1/2) · (1 − ρ² S_n² / ((1 + nρ²) Q_n))^(-n/2)``
(``S_n``, ``Q_n``: sum and sum of squares of the values minus the hypothesised mean), which starts at 1 and is
a martingale under the null for every σ, so by Ville's inequality the true mean leaves ``x̄_n ± m_n s_n / √n``
at *some* n with probability at most α: the guarantee holds over every look, whenever the looking stops.
For large n, ``m_n² → (1 + nρ²)/(nρ²) · 2 log(√(1 + nρ²)/α)``: the Robbins normal mixture with the running
variance, i.e. the asymptotic confidence sequence of Waudby-Smith, Arnold, Wu, Howard & Ramdas ("Time-uniform
central limit theory and asymptotic confidence sequences"), which carries the guarantee to per-prompt values
that are not normal; for few prompts the exact normal-theory form keeps it where the running variance is itself
unsteady (at ρ² = 2 and α = 0.05 the interval is unbounded below 4 prompts, m_4 = 12, m_6 = 4.8, m_10 = 3.9,
m_16 = 3.6, m_48 = 3.4; a per-look one-sided t at 5 % is 2.0-1.7 there).
"""

from __future__ import annotations

import math
from functools import lru_cache

#: the mixture's prior variance ρ² of the standardised effect: sets where the sequence is tightest. 2 keeps it
#: near its floor from 6 prompts on (the decisions of a default run are taken at 6-16 prompts)
MIXTURE_RHO2 = 2.0


@lru_cache(maxsize=4096)
def cs_multiplier(n: int, alpha: float, rho2: float = MIXTURE_RHO2) -> float:
    """``m_n`` of the module doc: ``x̄_n ± m_n · s_n / √n`` (``s_n`` the sample SD, n − 1 degrees of freedom) is a
    two-sided ``1 − α`` confidence sequence for the mean of i.i.d. normal values, valid over all n at once.
    ``math.inf`` when n < 2 or the mixture cannot exclude anything yet."""
    if n < 2:
        return math.inf
    x = n * rho2
    q = -math.expm1((2.0 / n) * (math.log(alpha) - 0.5 * math.log1p(x)))
    den = x - q * (1.0 + x)
    return math.sqrt((n - 1) * q * (1.0 + x) / den) if den > 0 else math.inf


def interval_level(alpha: float) -> float:
    """The coverage of the decisions' intervals at ``decision_alpha`` = α: ``1 − α``, over a whole race."""
    return 1.0 - alpha


__all__ = ["MIXTURE_RHO2", "cs_multiplier", "interval_level"]
