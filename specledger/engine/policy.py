"""Speculation-length policies: who picks gamma each round.

A policy is asked ``choose(context_len, batch_size)`` before every round and told the outcome
with ``observe(proposed, accepted, t_round)`` after it. gamma = 0 means a plain decoding step.

Policies compared side by side:
  static      the same gamma every round
  heuristic   Hugging Face's "heuristic" schedule: +2 after a fully accepted round, -1 otherwise
  ema         an acceptance-EMA controller (in the spirit of SGLang's adaptive speculation)
  batch       a batch-size schedule (vLLM's num_speculative_tokens_per_batch_size idea)
  goodput     ours: maximise expected committed tokens per second, E[L](a, gamma) / T_round(gamma),
              from an online linear cost fit and the running acceptance estimate; gamma = 0 allowed
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from itertools import accumulate
from typing import Any

from specledger.errors import SpecLedgerError, require
from specledger.ledger.acceptance import expected_length_from_chain, survival_from_chain
from specledger.records import GammaSpec


class GammaPolicy:
    name: str = "policy"

    def reset(self) -> None:
        """A new request starts (per-request state only; learned costs may persist)."""

    def choose(self, context_len: int, batch_size: int = 1) -> int:
        raise NotImplementedError

    def observe(self, proposed: int, accepted: int, t_round: float | None = None,
                t_draft: float | None = None) -> None:
        """The round proposed ``proposed`` candidates, ``accepted`` (K) were accepted, and it took ``t_round`` s."""


class StaticGamma(GammaPolicy):
    """The same gamma every round."""

    def __init__(self, gamma: int) -> None:
        require(isinstance(gamma, int) and gamma >= 0, f"gamma must be an integer >= 0, got {gamma!r}")
        self.gamma = gamma
        self.name = str(gamma)

    def choose(self, context_len: int, batch_size: int = 1) -> int:
        return self.gamma


class _AdaptiveGamma(GammaPolicy):
    """A gamma that ``observe`` moves and each new request restarts at ``start``."""

    def __init__(self, start: int, max_gamma: int) -> None:
        self.start, self.max_gamma = start, max_gamma
        self.gamma = start

    def reset(self) -> None:
        self.gamma = self.start

    def choose(self, context_len: int, batch_size: int = 1) -> int:
        return self.gamma


class HeuristicGamma(_AdaptiveGamma):
    """+2 after a fully accepted round, -1 otherwise (floor 1, cap ``max_gamma``); reset per request."""

    name = "heuristic"

    def __init__(self, start: int = 4, max_gamma: int = 16) -> None:
        super().__init__(start, max_gamma)

    def observe(self, proposed: int, accepted: int, t_round: float | None = None,
                t_draft: float | None = None) -> None:
        if proposed == 0:
            return
        self.gamma = min(self.max_gamma, self.gamma + 2) if accepted == proposed else max(1, self.gamma - 1)


def geometric_acceptance_update(proposed: int, accepted: int) -> tuple[int, int]:
    """(successes, trials) of the per-position acceptance a under the constant-a model: a round with
    K accepted of n proposed saw K successes and, if K < n, one failure (the first rejection)."""
    return accepted, accepted + (1 if accepted < proposed else 0)


class EmaGamma(_AdaptiveGamma):
    """gamma = the length whose marginal candidate is still accepted with probability >= ``threshold``:
    the largest g with a^g >= threshold, a = EMA of the geometric acceptance estimate."""

    name = "ema"

    def __init__(self, start: int = 4, max_gamma: int = 8, alpha: float = 0.3, threshold: float = 0.3) -> None:
        super().__init__(start, max_gamma)
        self.alpha, self.threshold = alpha, threshold
        self.a = 0.7

    def observe(self, proposed: int, accepted: int, t_round: float | None = None,
                t_draft: float | None = None) -> None:
        if proposed == 0:
            return
        s, t = geometric_acceptance_update(proposed, accepted)
        self.a = (1 - self.alpha) * self.a + self.alpha * (s / t)
        a = min(max(self.a, 1e-6), 1 - 1e-6)
        self.gamma = int(min(self.max_gamma, max(1, math.floor(math.log(self.threshold) / math.log(a)))))


class BatchScheduleGamma(GammaPolicy):
    """gamma from the batch size: the entry with the largest batch-size key <= the current batch size."""

    def __init__(self, schedule: Mapping[int, int] | None = None) -> None:
        self.schedule = dict(sorted((schedule or {1: 4, 4: 3, 8: 2, 16: 1, 32: 0}).items()))
        require(1 in self.schedule, "a batch-size schedule must say what to do at batch size 1")
        self.name = "batch"

    def choose(self, context_len: int, batch_size: int = 1) -> int:
        g = 0
        for b, gamma in self.schedule.items():
            if b <= batch_size:
                g = gamma
        return g


class AcceptanceChain:
    """Conditional acceptance a_j = P(candidate j accepted | candidates 1..j-1 accepted), j = 1..n,
    from decayed counts: a round that proposed m and accepted K is a trial at positions
    1..min(K+1, m) and a success at 1..K (E[L] = 1 + Σ_i Π_{j≤i} a_j comes from the chain, not from one a).

    Sparse positions shrink toward the position before: a_j = (s_j + w a_(j-1)) / (t_j + w),
    a_0 = ``prior`` -- so a drafter whose acceptance rises along the draft (copying) is not
    assumed to stop where the evidence does."""

    def __init__(self, n: int = 16, prior: float = 0.7, weight: float = 2.0, forget: float = 0.97) -> None:
        self.n, self.prior, self.weight, self.forget = n, prior, weight, forget
        self.s = [0.0] * (n + 1)
        self.t = [0.0] * (n + 1)

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        f = self.forget
        self.s = [x * f for x in self.s]
        self.t = [x * f for x in self.t]
        for j in range(1, min(accepted + 1, proposed, self.n) + 1):
            self.t[j] += 1.0
            if j <= accepted:
                self.s[j] += 1.0

    def rates(self) -> list[float]:
        """[a_1, ..., a_n]."""
        out, prev = [], self.prior
        for j in range(1, self.n + 1):
            prev = (self.s[j] + self.weight * prev) / (self.t[j] + self.weight)
            out.append(prev)
        return out

    def expected_lengths(self, max_gamma: int) -> list[float]:
        """[E[L](1), ..., E[L](max_gamma)], E[L](g) = 1 + sum_{i<=g} prod_{j<=i} a_j (the ledger's
        :func:`~specledger.ledger.acceptance.expected_length_from_chain`, for every prefix at once)."""
        return list(accumulate(survival_from_chain(self.rates()[:max_gamma]), initial=1.0))[1:]

    def expected_length(self, gamma: int) -> float:
        return expected_length_from_chain(self.rates()[:gamma])

    def seeded(self, weight: float = 4.0, first_weight: float = 1.0) -> AcceptanceChain:
        """A fresh chain (same settings) holding this one's rates as pseudo-trials: ``first_weight``
        at position 1 and ``weight`` beyond. Whether a text lends itself to drafting at all (a_1)
        is the request's own, so a new request learns it quickly; how acceptance runs on once the
        first candidate holds (a_2, a_3, ...) is the drafter's, so it carries over strongly."""
        new = AcceptanceChain(self.n, self.prior, self.weight, self.forget)
        for j, a in enumerate(self.rates(), start=1):
            w = first_weight if j == 1 else weight
            new.s[j], new.t[j] = w * a, w
        return new


class GoodputGamma(GammaPolicy):
    """Ours: choose gamma in 0..max_gamma maximising expected committed tokens per second.

    E[L](g) = 1 + sum_{i<=g} prod_{j<=i} a_j from the conditional acceptance chain
    (:class:`AcceptanceChain`): each request starts from the chain learned over earlier requests
    (``chain``, shared; by default this instance's own, kept across ``reset``) as a few
    pseudo-rounds, and updates its own copy with exponential forgetting. gamma = 0 means a plain
    step; while at 0, one round in ``probe_every`` still proposes 1 candidate so the acceptance
    estimate keeps up with the text.

    Solo (no ``step_cost``): T(g) = c0 + c1 g fitted online by weighted least squares over
    recent rounds (``prior`` seeds it: (c0, c1) seconds); maximise E[L](g) / T(g).

    Batched (``step_cost`` given, a :class:`specledger.cost.step_cost.StepCost` shared by the requests
    of one engine): a candidate is a row in the step's packed forward that every request waits
    for, so the request plans as if the ``batch_size`` requests beside it chose like it does.
    Model-free drafters often propose fewer than asked (no match), so the request also tracks its
    fill f = proposed / asked (decayed, prior 1) and maximises
    (1 - f + f E[L](g)) / (T_fwd(B (1 + f g)) + B f g d), with T_fwd measured at start-up and
    d the drafting seconds per candidate learned from the rounds.
    """

    def __init__(self, max_gamma: int = 8, prior: tuple[float, float] | None = None, forget: float = 0.97,
                 probe_every: int = 8, step_cost: Any = None, chain: AcceptanceChain | None = None) -> None:
        self.max_gamma, self.forget, self.probe_every = max_gamma, forget, probe_every
        self.name = "goodput"
        self.prior = prior
        self.step_cost = step_cost
        self.shared_chain = chain if chain is not None else AcceptanceChain(max_gamma, forget=0.99)
        self.chain = self.shared_chain.seeded()
        self._w = self._wx = self._wy = self._wxx = self._wxy = 0.0  # decayed LS sums of (gamma, seconds)
        self._zero_streak = 0
        self._asked = self._filled = 1.0  # decayed candidates asked for / proposed (batched mode)
        self._last_g = 0
        if prior is not None:
            c0, c1 = prior
            for g in (0, 4):  # two pseudo-observations encode the prior line
                self._add_cost(g, c0 + c1 * g, weight=2.0)

    def reset(self) -> None:
        self.chain = self.shared_chain.seeded()  # what earlier requests taught, as a few pseudo-rounds
        self._zero_streak = 0
        self._asked = self._filled = 1.0
        self._last_g = 0

    def fill(self) -> float:
        """Fraction of the candidates asked for that the drafter actually proposed (decayed)."""
        return min(1.0, self._filled / self._asked) if self._asked > 0 else 1.0

    def _add_cost(self, g: float, y: float, weight: float = 1.0) -> None:
        f = self.forget
        self._w = f * self._w + weight
        self._wx = f * self._wx + weight * g
        self._wy = f * self._wy + weight * y
        self._wxx = f * self._wxx + weight * g * g
        self._wxy = f * self._wxy + weight * g * y

    def cost_line(self) -> tuple[float, float] | None:
        """(c0, c1) of T(g) = c0 + c1 g, or None until two distinct gammas were seen."""
        det = self._w * self._wxx - self._wx**2
        if self._w <= 0 or abs(det) < 1e-12 * max(1.0, self._w * self._wxx):
            return None
        c1 = (self._w * self._wxy - self._wx * self._wy) / det
        c0 = (self._wy - c1 * self._wx) / self._w
        return c0, max(c1, 0.0)

    def acceptance(self) -> float:
        """a_1, the request's current first-position acceptance estimate."""
        return self.chain.rates()[0]

    def _round_cost(self, batch_size: int) -> Callable[[int], float] | None:
        """g -> expected seconds of a round at that gamma, or None while the cost is still unknown."""
        if self.step_cost is not None:
            b, f, cost = max(1, batch_size), self.fill(), self.step_cost
            return lambda g: cost.step_s(b, f * g)  # the drafter fills f of the g asked for
        line = self.cost_line()
        if line is None:
            return None
        c0, c1 = line
        return lambda g: c0 + c1 * g

    def choose(self, context_len: int, batch_size: int = 1) -> int:
        cost = self._round_cost(batch_size)
        if cost is None:  # learn the cost line first: alternate two gammas
            return 1 if self._w < 1 else 4
        f = self.fill() if self.step_cost is not None else 1.0
        best_g, best = 0, 1.0 / max(cost(0), 1e-9)
        for g, length in enumerate(self.chain.expected_lengths(self.max_gamma), start=1):
            rate = (1 - f + f * length) / max(cost(g), 1e-9)
            if rate > best * 1.0001:
                best_g, best = g, rate
        if best_g == 0:
            self._zero_streak += 1
            if self._zero_streak % self.probe_every == 0:
                best_g = 1
        else:
            self._zero_streak = 0
        self._last_g = best_g
        return best_g

    def observe(self, proposed: int, accepted: int, t_round: float | None = None,
                t_draft: float | None = None) -> None:
        if t_round is not None:
            self._add_cost(proposed, t_round)
        if self.step_cost is not None and t_draft is not None:
            self.step_cost.observe_draft(proposed, t_draft)
        if self._last_g > 0:
            self._asked = self.forget * self._asked + self._last_g
            self._filled = self.forget * self._filled + min(proposed, self._last_g)
        self.chain.observe(proposed, accepted)
        self.shared_chain.observe(proposed, accepted)


POLICIES = ("static", "heuristic", "ema", "batch", "goodput")
GAMMA_POLICIES = POLICIES[1:]  # the names a gamma spec may give (a static gamma is given as its integer)


def parse_gamma_spec(spec: int | str, flag: str = "gamma") -> int | str:
    """A gamma spec, as every front end takes it: an integer >= 0 (``4`` or ``"4"``) -> that int, or a
    policy name (:data:`GAMMA_POLICIES`) -> the name; anything else is a one-line error naming ``flag``."""
    if isinstance(spec, str) and spec.strip().isdigit():
        return int(spec.strip())
    if isinstance(spec, int) and not isinstance(spec, bool):
        require(spec >= 0, f"{flag} must be >= 0, got {spec}")
        return spec
    if isinstance(spec, str) and spec.strip() in GAMMA_POLICIES:
        return spec.strip()
    raise SpecLedgerError(f"{flag} must be an integer >= 0 or one of: {', '.join(GAMMA_POLICIES)}; got {spec!r}")


def make_policy(spec: str | int, step_cost: Any = None, chain: AcceptanceChain | None = None) -> GammaPolicy:
    """``4`` / ``"4"`` -> static; ``"heuristic"``, ``"ema"``, ``"batch"``, ``"goodput"`` -> that policy.
    ``step_cost`` (a shared :class:`specledger.cost.step_cost.StepCost`) makes goodput plan batched steps;
    ``chain`` (a shared :class:`AcceptanceChain`) carries its acceptance across requests."""
    if isinstance(spec, int) or str(spec).isdigit():
        return StaticGamma(int(spec))
    table = {"heuristic": HeuristicGamma, "ema": EmaGamma, "batch": BatchScheduleGamma, "goodput": GoodputGamma}
    if spec not in table:
        raise SpecLedgerError(f"unknown gamma policy {spec!r}; use an integer or one of {', '.join(table)}")
    if spec == "goodput":
        return GoodputGamma(step_cost=step_cost, chain=chain)
    return table[spec]()


def as_policy(gamma: GammaSpec | GammaPolicy) -> GammaPolicy:
    """The policy a γ spec names (a static γ, a policy name: :func:`make_policy`), or the policy itself."""
    if isinstance(gamma, GammaPolicy):
        return gamma
    return StaticGamma(gamma) if isinstance(gamma, int) else make_policy(gamma)
