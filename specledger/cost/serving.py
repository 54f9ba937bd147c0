"""A measured cost surface as a simulator cost (``simulate --profile surface.json``).

The simulator prices a step with ``prefill_s``, ``step_s``, ``round_s``, ``draft_s`` and ``other_s``
(:mod:`specledger.simulate.replica`, :mod:`specledger.simulate.fastpath`). A surface measures only the
target forward, so the other parts are assumptions, stated in :attr:`SurfaceCost.source`:

* forward: the surface (:meth:`CostSurface.step_s`), every distinct price's label tallied in ``labels``;
* prefill of P tokens: one forward of P rows at batch 1, context 0, read off the same surface (beyond the
  measured rows that is an extrapolation along rows, and labelled so in ``labels``);
* drafting: 0 (a model-free drafter -- n-gram, suffix -- costs microseconds; a draft model is not priced);
* other (sampling, scheduling): 0, not in a surface file.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from specledger.cost.pricer import step_s_each
from specledger.cost.surface import CostSurface


class SurfaceCost:
    """The imported :class:`specledger.cost.pricer.StepPricer`: a surface measured elsewhere, nothing fitted."""

    def __init__(self, surface: CostSurface) -> None:
        self.surface = surface
        top = max(surface.rows_axis)
        self.source = (f"{surface.source}; forward from the surface, prefill = one forward of P rows at batch 1, "
                       f"context 0 off the same surface (extrapolated beyond {top} rows), drafting 0 (model-free "
                       "drafters assumed; a draft model is not priced), other 0 (not in a surface file)")
        self.labels: Counter[str] = Counter()  # source label of every distinct forward / prefill price
        self._steps: dict[tuple[int, int, float], float] = {}
        self._prefills: dict[int, float] = {}

    def _price(self, rows: float, batch: int, context: float) -> float:
        look = self.surface.lookup(rows, batch, context)
        self.labels[look.source] += 1
        return look.seconds

    def step_s(self, total_rows: int, batch: int, context: float) -> float:
        """One packed forward: the surface at total_rows / batch rows per request (cached per point)."""
        key = (int(total_rows), int(batch), float(context))
        s = self._steps.get(key)
        if s is None:
            b = max(key[1], 1)
            s = self._steps[key] = self._price(max(key[0], b) / b, b, key[2])
        return s

    def step_s_many(self, rows: np.ndarray, batch: int, context: np.ndarray) -> np.ndarray:
        """:meth:`step_s` for every (rows_s, context_s)."""
        return step_s_each(self, rows, batch, context)

    def round_s(self, rows: int, context: float) -> float:
        return self.step_s(rows, 1, context)

    def prefill_s(self, prompt_tokens: int, slots: int = 1) -> float:
        """One forward of ``prompt_tokens`` rows at batch 1, context 0 (see the module docstring; no slot term)."""
        s = self._prefills.get(prompt_tokens)
        if s is None:
            s = self._prefills[prompt_tokens] = self._price(max(int(prompt_tokens), 1), 1, 0)
        return s

    def draft_s(self, drafter: str, gamma: int, context: float = 0.0) -> float:
        return 0.0

    def other_s(self, batch: int = 1) -> float:
        return 0.0

    def to_dict(self) -> dict[str, Any]:
        return self.surface.to_dict()


__all__ = ["SurfaceCost"]
