"""Speculation-length policies: who picks gamma each round.

A policy is asked ``choose(context_len)`` before every round and told the outcome with
``observe(proposed, accepted)`` after it. gamma = 0 means a plain decoding step.
"""

from __future__ import annotations

from specledger.errors import require


class GammaPolicy:
    name: str = "policy"

    def reset(self) -> None:
        """A new request starts."""

    def choose(self, context_len: int) -> int:
        raise NotImplementedError

    def observe(self, proposed: int, accepted: int) -> None:
        """The round proposed ``proposed`` candidates and ``accepted`` (K) were accepted."""


class StaticGamma(GammaPolicy):
    """The same gamma every round."""

    def __init__(self, gamma: int) -> None:
        require(isinstance(gamma, int) and gamma >= 0, f"gamma must be an integer >= 0, got {gamma!r}")
        self.gamma = gamma
        self.name = str(gamma)

    def choose(self, context_len: int) -> int:
        return self.gamma


class HeuristicGamma(GammaPolicy):
    """Hugging Face's "heuristic" schedule: +2 after a fully accepted round, -1 otherwise (floor 1)."""

    def __init__(self, start: int = 4, max_gamma: int = 16) -> None:
        self.start, self.max_gamma = start, max_gamma
        self.name = "heuristic"
        self.gamma = start

    def reset(self) -> None:
        self.gamma = self.start

    def choose(self, context_len: int) -> int:
        return self.gamma

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        if accepted == proposed:
            self.gamma = min(self.max_gamma, self.gamma + 2)
        else:
            self.gamma = max(1, self.gamma - 1)


def as_policy(gamma: int | GammaPolicy) -> GammaPolicy:
    return gamma if isinstance(gamma, GammaPolicy) else StaticGamma(gamma)
