"""Who picks gamma in the simulator: the engine's own policies (:mod:`specledger.engine.policy`).

Static gammas and the batch-size schedule depend on nothing per request, so one ``choose`` per step
serves the whole batch (the fast path a million requests need). Heuristic, EMA and goodput keep
per-request state: each simulated request gets its own policy object, asked and told every round
exactly as :class:`specledger.engine.batch.BatchScheduler` asks and tells it. Goodput plans with a
:class:`specledger.cost.step_cost.StepCost` priced by the simulator's cost model, shared by one
replica's requests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specledger.cost.step_cost import StepCost
from specledger.engine.policy import (
    AcceptanceChain,
    BatchScheduleGamma,
    GammaPolicy,
    make_policy,
    parse_gamma_spec,
)

STATELESS = ("batch",)


def step_cost_from(cost: Any, context: float = 128.0, slots: int = 16) -> StepCost:
    """The goodput policy's step cost priced by the simulator's own ``cost``:
    T_fwd(r) = step_s(r, min(r, slots), context)."""
    return StepCost(cost, context, slots)


class GammaPlan:
    """gamma for every running request of a step, from a static int or a policy name."""

    def __init__(self, spec: int | str, cost: Any = None) -> None:
        spec = parse_gamma_spec(spec)
        self.spec = spec
        self.static = spec if isinstance(spec, int) else None
        self.name = str(spec)
        self._batch: BatchScheduleGamma | None = (make_policy(spec) if spec in STATELESS  # type: ignore[assignment]
                                                  else None)
        self._cost, self._step_cost = cost, None
        self._chain = AcceptanceChain() if spec == "goodput" else None
        self._per_batch: dict[int, int] = {}

    @property
    def vectorised(self) -> bool:
        return self.static is not None or self._batch is not None

    def new_policy(self) -> GammaPolicy:
        """A per-request policy (its ``reset`` done), sharing the plan's step cost and acceptance chain."""
        if self.spec == "goodput" and self._step_cost is None and self._cost is not None:
            self._step_cost = step_cost_from(self._cost)
        p = make_policy(self.spec, step_cost=self._step_cost, chain=self._chain)
        p.reset()
        return p

    def choose(self, batch: int, contexts: np.ndarray, policies: list[GammaPolicy] | None) -> np.ndarray:
        if self.static is not None:
            return np.full(batch, self.static, dtype=np.int64)
        if self._batch is not None:
            return np.full(batch, self._batch.choose(0, batch), dtype=np.int64)
        assert policies is not None
        return np.fromiter((p.choose(int(c), batch) for p, c in zip(policies, contexts)), dtype=np.int64,
                           count=batch)

    def per_batch_size(self, max_batch: int) -> dict[int, int]:
        """A vectorised plan's gamma for every decoding batch size 1..``max_batch``."""
        if len(self._per_batch) < max_batch:
            zeros = np.zeros(max_batch, dtype=np.int64)
            self._per_batch.update((k, int(self.choose(k, zeros[:k], None)[0])) for k in range(1, max_batch + 1))
        return self._per_batch
