"""Full-round cost, speed-up, and the choice of speculation length.

A speculative round costs T_round = T_draft + T_verify + T_other (sampling, cache
maintenance, sync, scheduling) and commits E[L] tokens on average; plain decoding costs T0
per token. In the simplified steady-state ledger

    S = T0 · E[L] / E[T_round],

so speculation pays only if E[T_round] < T0 · E[L] (the *break-even round time*). Long-run
speed is total committed tokens ÷ total time, never an unweighted mean of per-round speeds.

γ = 0 always means plain decoding: E[L] = 1 and a "round" costs T0, so S = 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from specledger.errors import SpecLedgerError, require
from specledger.ledger.acceptance import (
    check_chain,
    check_gamma,
    expected_length_constant,
    expected_length_from_chain,
)
from specledger.ledger.expr import CostExpression, parse_cost_expression


def _positive_ms(value: float, name: str) -> float:
    number = float(value)
    require(
        math.isfinite(number) and number > 0, f"{name} is {value!r} ms; it must be a positive number of ms"
    )
    return number


def _non_negative_ms(value: float, name: str) -> float:
    number = float(value)
    require(math.isfinite(number) and number >= 0, f"{name} is {value!r} ms; it must be >= 0 ms")
    return number


# --------------------------------------------------------------------------- one round


@dataclass(frozen=True)
class RoundTime:
    """T_round = T_draft + T_verify + T_other, in ms."""

    draft_ms: float
    verify_ms: float
    other_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.other_ms


def round_time_ms(draft_ms: float, verify_ms: float, other_ms: float = 0.0) -> float:
    """T_round = T_draft + T_verify + T_other (each ≥ 0 ms, total > 0)."""
    total = (
        _non_negative_ms(draft_ms, "draft time")
        + _non_negative_ms(verify_ms, "verify time")
        + _non_negative_ms(other_ms, "other time")
    )
    return _positive_ms(total, "round time")


def break_even_round_ms(base_ms: float, expected_length: float) -> float:
    """T0 · E[L]: the round time at which speculation exactly ties plain decoding."""
    require(expected_length >= 1, f"E[L] is {expected_length}; a full round commits at least one token")
    return _positive_ms(base_ms, "base time T0") * expected_length


def speedup(base_ms: float, expected_length: float, round_ms: float) -> float:
    """S = T0 · E[L] / E[T_round]; > 1 exactly when E[T_round] < T0 · E[L]."""
    return break_even_round_ms(base_ms, expected_length) / _positive_ms(round_ms, "round time")


def speedup_or_nan(base_ms: float, expected_length: float, round_ms: float) -> float:
    """S = T0 · E[L] / E[T_round] of measured figures (any one time unit), as :func:`speedup` but never
    an error: NaN when T0 · E[L] or the round time is not finite, or the round time is 0 (no full
    rounds to measure). With E[L] = ΣL / n and E[T_round] = ΣT / n it is also T0 · ΣL / ΣT."""
    even = base_ms * expected_length
    if not round_ms or not (math.isfinite(even) and math.isfinite(round_ms)):
        return math.nan
    return even / round_ms


def ms_per_token(round_ms: float, expected_length: float) -> float:
    """Average ms per committed token: E[T_round] / E[L] (compare with T0)."""
    require(expected_length >= 1, f"E[L] is {expected_length}; a full round commits at least one token")
    return _positive_ms(round_ms, "round time") / expected_length


def leviathan_improvement_factor(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Leviathan et al. 2023, Thm 3.8: (1 − α^{γ+1}) / ((1 − α)(γc + 1)); (γ+1)/(γc+1) at α = 1.

    α is the (constant) acceptance rate, c = draft step time / target step time, and the
    verify round is assumed to cost one target step (T_verify = T0, T_other = 0).
    """
    require(cost_ratio >= 0 and math.isfinite(cost_ratio), f"cost ratio c is {cost_ratio}; it must be >= 0")
    return expected_length_constant(alpha, gamma) / (check_gamma(gamma) * cost_ratio + 1.0)


# --------------------------------------------------------------------------- long-run speed


def speed_from_totals(committed_tokens: Sequence[float], seconds: Sequence[float]) -> float:
    """Long-run speed = Σ committed tokens / Σ time (tokens/s). The only honest average."""
    require(
        len(committed_tokens) == len(seconds), "token and time lists differ in length; pair them per round"
    )
    require(len(seconds) > 0, "no rounds given; need at least one round")
    require(
        all(t >= 0 for t in seconds) and all(n >= 0 for n in committed_tokens),
        "tokens and times must be >= 0",
    )
    total_time = sum(seconds)
    require(total_time > 0, "total time is 0; cannot form a speed")
    return sum(committed_tokens) / total_time


def unweighted_mean_speed(committed_tokens: Sequence[float], seconds: Sequence[float]) -> float:
    """(1/n) Σ tokens_i / time_i: the misleading average (a fast short round weighs like a slow long one)."""
    require(
        len(committed_tokens) == len(seconds), "token and time lists differ in length; pair them per round"
    )
    require(len(seconds) > 0, "no rounds given; need at least one round")
    require(all(t > 0 for t in seconds), "every round or request needs a positive time to form its own speed")
    return sum(n / t for n, t in zip(committed_tokens, seconds)) / len(seconds)


@dataclass(frozen=True)
class SpeedAveraging:
    """Totals speed vs the unweighted mean of per-item speeds, and how far the latter is off."""

    totals_tokens_per_s: float
    unweighted_mean_tokens_per_s: float

    @property
    def mean_overstates_by(self) -> float:
        """unweighted_mean / totals − 1 (positive: the naive mean flatters the system)."""
        return self.unweighted_mean_tokens_per_s / self.totals_tokens_per_s - 1.0


def compare_speed_averages(committed_tokens: Sequence[float], seconds: Sequence[float]) -> SpeedAveraging:
    """Both averages side by side. They agree only when every item takes the same time.

    totals = Σn/Σt weighs each item by its time; the unweighted mean Σ(n/t)/m weighs each item
    equally, so short bursty rounds (many tokens, little time) inflate it.
    """
    return SpeedAveraging(
        totals_tokens_per_s=speed_from_totals(committed_tokens, seconds),
        unweighted_mean_tokens_per_s=unweighted_mean_speed(committed_tokens, seconds),
    )


# --------------------------------------------------------------------------- cost models


class CostModel(Protocol):
    """Round time (ms) as a function of the number of candidates γ ≥ 1."""

    label: str

    def round_ms(self, gamma: int) -> float: ...

    def supported_gammas(self, max_gamma: int) -> list[int]: ...


@dataclass(frozen=True)
class ExpressionCostModel:
    """T_round(k) from an expression in k, e.g. ``10+0.7*k+0.1*k^2`` (parsed safely)."""

    expression: CostExpression

    @property
    def label(self) -> str:
        return self.expression.text

    def round_ms(self, gamma: int) -> float:
        return _positive_ms(self.expression(check_gamma(gamma)), f"round time {self.label!r} at k={gamma}")

    def supported_gammas(self, max_gamma: int) -> list[int]:
        return list(range(1, check_gamma(max_gamma) + 1))


@dataclass(frozen=True)
class TableCostModel:
    """Measured round times: γ → ms. Only the measured γ values are defined (no interpolation)."""

    table: Mapping[int, float]

    def __post_init__(self) -> None:
        require(len(self.table) > 0, "the round-time table is empty; give entries like 1:10.8,2:11.8")
        for gamma, ms in self.table.items():
            require(
                check_gamma(gamma) >= 1, "round-time table keys are γ ≥ 1 (γ = 0 is plain decoding at T0)"
            )
            _positive_ms(ms, f"measured round time at γ={gamma}")

    @property
    def label(self) -> str:
        return "measured " + ",".join(f"{g}:{self.table[g]:g}" for g in sorted(self.table))

    def round_ms(self, gamma: int) -> float:
        if gamma not in self.table:
            raise SpecLedgerError(
                f"no measured round time for γ={gamma}; measured γ values are {sorted(self.table)}"
            )
        return float(self.table[gamma])

    def supported_gammas(self, max_gamma: int) -> list[int]:
        return sorted(g for g in self.table if g <= max_gamma)


@dataclass(frozen=True)
class SplitCostModel:
    """T_round(k) = T_draft(k) + T_verify(k) + T_other(k), each an expression in k."""

    draft: CostExpression
    verify: CostExpression
    other: CostExpression

    @property
    def label(self) -> str:
        return f"draft {self.draft.text} + verify {self.verify.text} + other {self.other.text}"

    def split(self, gamma: int) -> RoundTime:
        k = check_gamma(gamma)
        return RoundTime(
            draft_ms=_non_negative_ms(self.draft(k), f"draft time at k={k}"),
            verify_ms=_non_negative_ms(self.verify(k), f"verify time at k={k}"),
            other_ms=_non_negative_ms(self.other(k), f"other time at k={k}"),
        )

    def round_ms(self, gamma: int) -> float:
        parts = self.split(gamma)
        return round_time_ms(parts.draft_ms, parts.verify_ms, parts.other_ms)

    def supported_gammas(self, max_gamma: int) -> list[int]:
        return list(range(1, check_gamma(max_gamma) + 1))


def parse_cost_model(text: str) -> ExpressionCostModel | TableCostModel:
    """``"10+0.7*k+0.1*k^2"`` → expression model; ``"1:10.8,2:11.8,4:14.4"`` → measured table."""
    stripped = text.strip() if isinstance(text, str) else ""
    if ":" not in stripped:
        return ExpressionCostModel(parse_cost_expression(stripped))
    table: dict[int, float] = {}
    for item in stripped.split(","):
        key, sep, value = item.partition(":")
        require(bool(sep), f"round-time table entry {item!r} is not 'gamma:ms'; write e.g. 1:10.8,2:11.8")
        try:
            gamma, ms = int(key.strip()), float(value.strip())
        except ValueError:
            raise SpecLedgerError(f"round-time table entry {item!r} is not 'gamma:ms' with numbers") from None
        require(gamma not in table, f"round-time table repeats γ={gamma}; give each γ once")
        table[gamma] = ms
    return TableCostModel(table)


# --------------------------------------------------------------------------- the ledger


def _expected_length(chain: Sequence[float], gamma: int) -> float:
    require(
        gamma <= len(chain),
        f"γ={gamma} needs the acceptance of {gamma} positions but only {len(chain)} are known",
    )
    return expected_length_from_chain(chain[:gamma])


def round_cost_ms(model: CostModel, gamma: int, base_ms: float) -> float:
    """Cost of one round with γ candidates; γ = 0 is plain decoding and costs T0."""
    return _positive_ms(base_ms, "base time T0") if check_gamma(gamma) == 0 else model.round_ms(gamma)


@dataclass(frozen=True)
class LedgerRow:
    """One γ under one cost model: E[L], round ms, ms/token, S = T0·E[L]/T_round, pays = S > 1."""

    gamma: int
    expected_length: float
    round_ms: float
    ms_per_token: float
    break_even_ms: float
    speedup: float

    @property
    def pays(self) -> bool:
        return self.round_ms < self.break_even_ms


def ledger_row(chain: Sequence[float], gamma: int, base_ms: float, model: CostModel) -> LedgerRow:
    """The ledger for γ candidates with conditional chain a_1..a_γ (chain may be longer)."""
    g = check_gamma(gamma)
    chain = check_chain(chain)
    length = _expected_length(chain, g)
    cost = round_cost_ms(model, g, base_ms)
    return LedgerRow(
        gamma=g,
        expected_length=length,
        round_ms=cost,
        ms_per_token=ms_per_token(cost, length),
        break_even_ms=break_even_round_ms(base_ms, length),
        speedup=speedup(base_ms, length, cost),
    )


def ledger_rows(
    chain: Sequence[float], gammas: Sequence[int], base_ms: float, model: CostModel
) -> list[LedgerRow]:
    """:func:`ledger_row` for each γ in ``gammas``."""
    return [ledger_row(chain, g, base_ms, model) for g in gammas]


@dataclass(frozen=True)
class MarginalRow:
    """Going from γ_prev to γ candidates: what the extra candidates add and cost.

    delta_length = E[L](γ) − E[L](γ_prev) = Σ_{i=γ_prev+1..γ} Pr(K ≥ i) (= a^γ for one step at
    constant a); plain_value_ms = delta_length · T0 is what those tokens would cost by plain
    decoding.
    """

    gamma_from: int
    gamma: int
    delta_length: float
    delta_cost_ms: float
    plain_value_ms: float
    speedup: float
    delta_speedup: float

    @property
    def cheaper_than_plain(self) -> bool:
        """The marginal rule: worth it against plain decoding iff ΔE[L]·T0 > Δcost."""
        return self.plain_value_ms > self.delta_cost_ms

    @property
    def raises_speedup(self) -> bool:
        """Exact rule for S: ΔE[L]/Δcost > E[L]/T_round (marginal tokens/ms beat the average)."""
        return self.delta_speedup > 0


def marginal_table(
    chain: Sequence[float], base_ms: float, model: CostModel, max_gamma: int
) -> list[MarginalRow]:
    """Marginal rows between consecutive defined γ in 0..min(max_gamma, len(chain)).

    When S > 1 the exact condition for S to rise (ΔE/ΔC > E/C) is stricter than the plain-
    decoding rule (ΔE·T0 > ΔC), so the speed-maximising γ can be smaller than the last γ
    whose extra candidate is still "cheaper than plain decoding".
    """
    chain = check_chain(chain)
    limit = min(check_gamma(max_gamma), len(chain))
    gammas = [0, *model.supported_gammas(limit)]
    rows: list[MarginalRow] = []
    previous = ledger_row(chain, 0, base_ms, model)
    for g in gammas[1:]:
        current = ledger_row(chain, g, base_ms, model)
        delta_length = current.expected_length - previous.expected_length
        rows.append(
            MarginalRow(
                gamma_from=previous.gamma,
                gamma=g,
                delta_length=delta_length,
                delta_cost_ms=current.round_ms - previous.round_ms,
                plain_value_ms=delta_length * base_ms,
                speedup=current.speedup,
                delta_speedup=current.speedup - previous.speedup,
            )
        )
        previous = current
    return rows


def best_point(points: Iterable[tuple[int, float]]) -> tuple[int, float]:
    """argmax_γ S(γ) over (γ, S) points, the one definition of the optimal γ: the (γ, S) of the largest
    S, ties to the smaller γ; a non-finite S never beats a finite one (γ = 0 means plain decoding)."""
    return min(points, key=lambda p: (-p[1] if math.isfinite(p[1]) else math.inf, p[0]))


def best_gamma(points: Iterable[tuple[int, float]]) -> int:
    """The γ of :func:`best_point`."""
    return best_point(points)[0]


@dataclass(frozen=True)
class OptimalGamma:
    """argmax_γ S(γ) over the searched γ (ties → the smallest γ); γ = 0 means 'off'."""

    best: LedgerRow
    searched: tuple[LedgerRow, ...]


def optimal_gamma(chain: Sequence[float], base_ms: float, model: CostModel, max_gamma: int) -> OptimalGamma:
    """Search γ ∈ {0} ∪ {defined γ ≤ min(max_gamma, len(chain))} for the largest S = T0·E[L]/T_round(γ).

    γ = 0 is plain decoding (E[L] = 1, cost T0, S = 1), so the optimum never loses to plain
    decoding under the model, and S(best) ≥ S(γ) for every searched γ.
    """
    chain = check_chain(chain)
    limit = min(check_gamma(max_gamma), len(chain))
    rows = tuple(ledger_rows(chain, [0, *model.supported_gammas(limit)], base_ms, model))
    by_gamma = {row.gamma: row for row in rows}
    return OptimalGamma(best=by_gamma[best_gamma((row.gamma, row.speedup) for row in rows)], searched=rows)
