"""Acceptance vocabularies and the expected committed length E[L].

One speculative round proposes γ candidates; K ∈ {0..γ} is the accepted prefix length and a
full (untruncated) round commits L = K + 1 tokens (the +1 is the target's correction or bonus
token). Everything here is exact arithmetic on those definitions; no independence between
positions is ever assumed.

Vocabularies people meet, and the names used here:

* **conditional chain** ``a_1..a_γ``: a_j = Pr(position j accepted | positions 1..j-1 accepted).
* **survival / per-position rates** ``s_1..s_γ``: s_i = Pr(K ≥ i) = Π_{j≤i} a_j. This is what
  vLLM reports per position: ``num_accepted_tokens_per_pos[i] / num_drafts`` = Pr(K ≥ i+1).
* **K histogram**: counts (or probabilities) of K = 0..γ over full rounds.
* **mean accepted per draft** E[K] = accepted / drafts (no bonus token).
* **mean acceptance length** E[L] = 1 + E[K] (with the bonus token). vLLM's
  ``mean acceptance length`` is 1 + accepted/drafts; SGLang's ``spec_accept_length`` already
  counts the bonus token, so it is E[L] as well.
* **draft acceptance rate** Σ accepted / Σ proposed tokens (vLLM's ``acceptance rate``): a
  token-level ratio, *not* a conditional a_j.

Averages across requests come in two named kinds, never silently mixed: **pooled**
(Σ accepted / Σ drafts, every round weighs the same) and **per-request** (mean of each
request's own ratio, every request weighs the same).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from specledger.errors import SpecLedgerError, require

_TOLERANCE = 1e-9


# --------------------------------------------------------------------------- validation


def check_probability(value: float, name: str = "acceptance") -> float:
    """Return ``value`` as float if it is a finite probability in [0, 1]; else SpecLedgerError."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecLedgerError(f"{name} {value!r} is not a number; give a probability in [0, 1]") from None
    require(
        math.isfinite(number) and 0.0 <= number <= 1.0,
        f"{name} {value!r} is outside [0, 1]; give a probability between 0 and 1",
    )
    return number


def check_gamma(gamma: int, name: str = "gamma") -> int:
    """Return ``gamma`` if it is a non-negative integer (number of candidates per round)."""
    require(
        isinstance(gamma, int) and not isinstance(gamma, bool),
        f"{name} {gamma!r} is not an integer; give a whole number of candidates >= 0",
    )
    require(gamma >= 0, f"{name} {gamma} is negative; give a number of candidates >= 0")
    return gamma


def check_chain(chain: Iterable[float], name: str = "acceptance chain") -> tuple[float, ...]:
    """Validate a sequence of probabilities (each in [0, 1]) and return it as a tuple."""
    values = tuple(chain)
    return tuple(check_probability(value, f"{name} entry {index + 1}") for index, value in enumerate(values))


# --------------------------------------------------------------------------- E[L]


def survival_from_chain(chain: Sequence[float]) -> list[float]:
    """Pr(K ≥ i) for i = 1..γ from a conditional chain: Pr(K ≥ i) = Π_{j≤i} a_j (chain rule)."""
    survival: list[float] = []
    running = 1.0
    for value in check_chain(chain):
        running *= value
        survival.append(running)
    return survival


def expected_length_from_chain(chain: Sequence[float]) -> float:
    """E[L] = 1 + Σ_{i=1..γ} Pr(K ≥ i), Pr(K ≥ i) = Π_{j≤i} a_j; γ = len(chain).

    Tail-sum identity for the non-negative integer K; no independence between positions.
    Always 1 ≤ E[L] ≤ γ + 1 and non-decreasing in every a_j.
    """
    return 1.0 + sum(survival_from_chain(chain))


def expected_length_constant(acceptance: float, gamma: int) -> float:
    """E[L] = 1 + a + … + a^γ = (1 − a^{γ+1}) / (1 − a); its limit is γ + 1 at a = 1."""
    a = check_probability(acceptance)
    g = check_gamma(gamma)
    if a == 1.0:
        return float(g + 1)
    return (1.0 - a ** (g + 1)) / (1.0 - a)


def marginal_gain_constant(acceptance: float, gamma: int) -> float:
    """ΔE[L] from adding candidate γ+1 to γ candidates at constant a: a^{γ+1}."""
    a = check_probability(acceptance)
    return a ** (check_gamma(gamma) + 1)


def marginal_gain_from_chain(chain: Sequence[float], gamma: int) -> float:
    """ΔE[L] from adding candidate γ+1: Pr(K ≥ γ+1) = Π_{j≤γ+1} a_j (needs len(chain) ≥ γ+1)."""
    g = check_gamma(gamma)
    require(
        len(chain) >= g + 1,
        f"the acceptance chain has {len(chain)} entries; the gain of candidate {g + 1} needs a_{g + 1}",
    )
    return survival_from_chain(chain[: g + 1])[-1]


def check_histogram(counts: Sequence[float]) -> tuple[float, ...]:
    """Validate counts of K = 0..γ: non-empty, finite, non-negative, positive total."""
    values = tuple(counts)
    require(len(values) > 0, "the K histogram is empty; give counts of K = 0..γ, e.g. 10,20,70")
    checked: list[float] = []
    for index, value in enumerate(values):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise SpecLedgerError(f"histogram count for K={index} ({value!r}) is not a number") from None
        require(
            math.isfinite(number) and number >= 0,
            f"histogram count for K={index} is {value!r}; counts must be >= 0",
        )
        checked.append(number)
    require(sum(checked) > 0, "the K histogram has no observations (all counts are 0); give some counts > 0")
    return tuple(checked)


def expected_length_from_histogram(counts: Sequence[float]) -> float:
    """E[L] = mean of K + 1 over observed full rounds: Σ_k (k+1)·n_k / Σ_k n_k (index k = K)."""
    values = check_histogram(counts)
    total = sum(values)
    return sum((k + 1) * n for k, n in enumerate(values)) / total


def histogram_from_observations(accepted: Iterable[int], gamma: int) -> list[int]:
    """Counts of K = 0..γ from a list of observed accepted-prefix lengths (each 0 ≤ K ≤ γ)."""
    g = check_gamma(gamma)
    counts = [0] * (g + 1)
    for k in accepted:
        require(
            isinstance(k, int) and 0 <= k <= g,
            f"accepted length {k!r} is outside 0..{g}; K must be an integer no larger than γ",
        )
        counts[k] += 1
    return counts


# --------------------------------------------------------------------------- conversions


def check_survival(survival: Sequence[float], name: str = "per-position rate") -> tuple[float, ...]:
    """Validate Pr(K ≥ i), i = 1..γ: each in [0, 1] and non-increasing in i (K ≥ i+1 implies K ≥ i)."""
    values = check_chain(survival, name)
    for index in range(1, len(values)):
        require(
            values[index] <= values[index - 1] + _TOLERANCE,
            f"{name} {index + 1} ({values[index]}) exceeds {name} {index} ({values[index - 1]}); "
            "unconditional per-position rates Pr(K ≥ i) cannot increase with i",
        )
    return values


def conditional_ratios(survival: Sequence[float]) -> list[float | None]:
    """a_i = Pr(K ≥ i) / Pr(K ≥ i−1) with Pr(K ≥ 0) = 1, as measured: not validated, not clamped,
    None where Pr(K ≥ i−1) = 0 (unobservable). For showing a server's counters as they are."""
    out: list[float | None] = []
    previous = 1.0
    for value in survival:
        out.append(value / previous if previous > 0 else None)
        previous = value
    return out


def conditional_from_survival(survival: Sequence[float]) -> list[float]:
    """a_i = Pr(K ≥ i) / Pr(K ≥ i−1) with Pr(K ≥ 0) = 1, from validated rates (:func:`check_survival`).

    The survival rates may be vLLM's per-position rates (accepted_per_pos[i] / num_drafts =
    Pr(K ≥ i+1)). Where Pr(K ≥ i−1) = 0 the conditional is unobservable; it is reported as 0,
    which keeps the round trip survival → conditional → survival exact.
    """
    return [0.0 if a is None else min(1.0, a) for a in conditional_ratios(check_survival(survival))]


def per_position_from_conditional(chain: Sequence[float]) -> list[float]:
    """Conditional a_j → vLLM-style unconditional per-position rates Pr(K ≥ i) = Π_{j≤i} a_j."""
    return survival_from_chain(chain)


def per_position_from_counts(accepted_per_position: Sequence[float], num_drafts: float) -> list[float]:
    """vLLM's per-position acceptance: ``num_accepted_tokens_per_pos[i] / num_drafts`` = Pr(K ≥ i+1)."""
    require(num_drafts > 0, f"num_drafts is {num_drafts}; need at least one draft to form a rate")
    return list(check_survival([count / num_drafts for count in accepted_per_position]))


def probabilities_from_histogram(counts: Sequence[float]) -> list[float]:
    """Pr(K = k) = n_k / Σ n for k = 0..γ."""
    values = check_histogram(counts)
    total = sum(values)
    return [n / total for n in values]


def survival_from_histogram(counts: Sequence[float]) -> list[float]:
    """Pr(K ≥ i) = Σ_{k ≥ i} n_k / Σ n for i = 1..γ (γ = len(counts) − 1)."""
    probabilities = probabilities_from_histogram(counts)
    survival: list[float] = []
    tail = 0.0
    for p in reversed(probabilities[1:]):
        tail += p
        survival.append(min(1.0, tail))
    return list(reversed(survival))


def conditional_from_histogram(counts: Sequence[float]) -> list[float]:
    """Histogram of K = 0..γ → conditional a_1..a_γ (via Pr(K ≥ i); 0 where unobservable)."""
    return conditional_from_survival(survival_from_histogram(counts))


def histogram_from_survival(survival: Sequence[float]) -> list[float]:
    """Pr(K = k) for k = 0..γ from Pr(K ≥ i), i = 1..γ, with γ = len(survival).

    Pr(K = k) = Pr(K ≥ k) − Pr(K ≥ k+1), with Pr(K ≥ 0) = 1 and Pr(K ≥ γ+1) = 0: the rates
    determine the histogram only once γ (the number of proposed positions) is fixed.
    """
    values = check_survival(survival)
    extended = [1.0, *values, 0.0]
    return [max(0.0, extended[k] - extended[k + 1]) for k in range(len(values) + 1)]


def histogram_from_per_position(rates: Sequence[float]) -> list[float]:
    """vLLM per-position rates for positions 1..γ → Pr(K = 0..γ) (γ = number of rates)."""
    return histogram_from_survival(rates)


def histogram_from_conditional(chain: Sequence[float]) -> list[float]:
    """Conditional a_1..a_γ → Pr(K = 0..γ) for rounds that propose exactly γ = len(chain) candidates."""
    return histogram_from_survival(survival_from_chain(chain))


# --------------------------------------------------------------------------- mean lengths


def mean_accepted_per_draft(accepted_tokens: float, num_drafts: float) -> float:
    """E[K] without the bonus token: accepted / drafts (drafts = verification rounds)."""
    require(num_drafts > 0, f"num_drafts is {num_drafts}; need at least one draft")
    require(accepted_tokens >= 0, f"accepted token count {accepted_tokens} is negative")
    return accepted_tokens / num_drafts


def vllm_mean_acceptance_length(accepted_tokens: float, num_drafts: float) -> float:
    """vLLM's mean acceptance length, bonus token included: E[L] = 1 + accepted / drafts."""
    return 1.0 + mean_accepted_per_draft(accepted_tokens, num_drafts)


def length_with_bonus(mean_accepted: float) -> float:
    """E[L] = E[K] + 1: add the target's correction/bonus token to a mean accepted count."""
    require(mean_accepted >= 0, f"mean accepted count {mean_accepted} is negative")
    return mean_accepted + 1.0


def length_without_bonus(mean_length: float) -> float:
    """E[K] = E[L] − 1: strip the bonus token from a mean acceptance length that includes it."""
    require(mean_length >= 1, f"mean acceptance length {mean_length} < 1; a length with the bonus is >= 1")
    return mean_length - 1.0


def expected_length_from_sglang_accept_length(accept_length: float) -> float:
    """SGLang's ``spec_accept_length`` already counts the bonus token: it *is* E[L] (checked ≥ 1)."""
    require(
        accept_length >= 1,
        f"SGLang accept length {accept_length} < 1; it counts the bonus token, so it is at least 1",
    )
    return float(accept_length)


def mean_accepted_from_sglang_accept_length(accept_length: float) -> float:
    """SGLang ``spec_accept_length`` → accepted draft tokens per round E[K] = accept_length − 1."""
    return expected_length_from_sglang_accept_length(accept_length) - 1.0


def draft_acceptance_rate(accepted_tokens: float, draft_tokens: float) -> float:
    """Token-level rate Σ accepted / Σ proposed candidates (vLLM ``acceptance rate``); not a_j."""
    require(draft_tokens > 0, f"draft token count is {draft_tokens}; need proposed tokens to form a rate")
    require(
        0 <= accepted_tokens <= draft_tokens, "accepted tokens must lie between 0 and the proposed tokens"
    )
    return accepted_tokens / draft_tokens


def _paired(numerators: Sequence[float], denominators: Sequence[float]) -> list[tuple[float, float]]:
    require(
        len(numerators) == len(denominators),
        "accepted and draft lists differ in length; pair them per request",
    )
    require(len(numerators) > 0, "no requests given; need at least one request")
    pairs = list(zip(numerators, denominators))
    for accepted, drafts in pairs:
        require(drafts > 0, f"a request has {drafts} drafts; every request needs at least one")
        require(accepted >= 0, f"a request has {accepted} accepted tokens; counts must be >= 0")
    return pairs


def pooled_mean_accepted(accepted: Sequence[float], drafts: Sequence[float]) -> float:
    """Pooled mean accepted per draft: Σ accepted_r / Σ drafts_r (each round weighs the same)."""
    pairs = _paired(accepted, drafts)
    return sum(a for a, _ in pairs) / sum(d for _, d in pairs)


def per_request_mean_accepted(accepted: Sequence[float], drafts: Sequence[float]) -> float:
    """Per-request mean accepted per draft: (1/R) Σ_r accepted_r / drafts_r (each request weighs the same)."""
    pairs = _paired(accepted, drafts)
    return sum(a / d for a, d in pairs) / len(pairs)
