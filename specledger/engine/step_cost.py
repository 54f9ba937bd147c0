"""The step cost a batched goodput policy plans with: a forward curve read off a pricer, plus drafting.

Under continuous batching one step runs a single packed forward over R rows (every running
request's last token plus its candidates), so the price of a candidate is what one more row
adds to that forward, T_fwd(R + 1) - T_fwd(R), paid by everybody in the batch. ``T_fwd`` is
priced by a :class:`specledger.cost.pricer.StepPricer` (the one cost type), at R rows over
min(R, slots) requests and the planning context: the engine and ``serve`` measure it
(:func:`calibrate_step_cost`: the model's packed forward timed at a ladder of row counts spread over
several sequence slots, median of repeats after one untimed warm-up per row count, read as a measured
surface -- isotonic in rows, monotone and labelled beyond the ladder); the simulator passes its own cost.
``StepCost`` keeps no pricing rule of its own.

Drafting is the other per-candidate price: model-free drafters cost microseconds, model drafters
a forward of their own. ``StepCost`` keeps the running seconds per proposed candidate,
d = sum(t_draft) / sum(proposed) with exponential forgetting, shared by all requests that use it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from specledger.cost.pricer import StepPricer

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192)


class StepCost:
    """T_fwd(rows) = pricer.step_s(rows, min(rows, slots), context), plus the learned draft cost per candidate."""

    def __init__(self, pricer: StepPricer, context: float = 128.0, slots: int = 16, forget: float = 0.99) -> None:
        self.pricer, self.context, self.slots, self.forget = pricer, float(context), max(int(slots), 1), forget
        self._draft_s = 0.0
        self._draft_n = 0.0
        self._forward: dict[float, float] = {}

    @classmethod
    def from_points(cls, rows: Sequence[int], seconds: Sequence[float], source: str = "measured packed forwards",
                    context: int = 0, forget: float = 0.99) -> StepCost:
        """A forward curve over total packed rows from measured (rows, seconds): a measured surface along rows
        (one point per row count; see :class:`specledger.cost.surface.CostSurface` for its rules)."""
        from specledger.cost.serving import SurfaceCost
        from specledger.cost.surface import CostSurface, SurfacePoint

        pts = [SurfacePoint(1, int(r), int(context), float(t)) for r, t in zip(rows, seconds)]
        if len(pts) < 2 or len({p.rows for p in pts}) != len(pts):
            raise ValueError("a step cost needs at least two distinct row counts")
        return cls(SurfaceCost(CostSurface(pts, source)), context, slots=1, forget=forget)

    def forward_s(self, rows: float) -> float:
        """T_fwd(rows): one packed forward over ``rows`` rows (cached per row count)."""
        r = float(rows)
        s = self._forward.get(r)
        if s is None:
            b = min(max(int(r), 1), self.slots)
            s = self._forward[r] = float(self.pricer.step_s(max(r, b), b, self.context))  # type: ignore[arg-type]
        return s

    def observe_draft(self, proposed: int, t_draft: float) -> None:
        """A request drafted ``proposed`` candidates in ``t_draft`` seconds."""
        if proposed > 0 and t_draft >= 0:
            self._draft_s = self.forget * self._draft_s + t_draft
            self._draft_n = self.forget * self._draft_n + proposed

    def draft_s_per_candidate(self) -> float:
        return self._draft_s / self._draft_n if self._draft_n > 0 else 0.0

    def step_s(self, batch: int, gamma: float) -> float:
        """Seconds of a step where ``batch`` requests each propose ``gamma`` candidates (on average:
        a fraction is fine): T_fwd(batch * (gamma + 1)) + batch * gamma * d."""
        return self.forward_s(batch * (gamma + 1)) + batch * gamma * self.draft_s_per_candidate()

    def fresh(self) -> StepCost:
        """The same forward curve with no draft-cost history (one per drafter setting)."""
        return StepCost(self.pricer, self.context, self.slots, self.forget)


def _spread(rows: int, slots: int, start: int) -> tuple[list[int], list[int]]:
    """``rows`` packed rows over ``min(rows, slots)`` slots, each slot's rows at consecutive positions."""
    used = min(rows, slots)
    slot_ids, positions = [], []
    for s in range(used):
        n = rows // used + (1 if s < rows % used else 0)
        slot_ids += [s] * n
        positions += list(range(start, start + n))
    return slot_ids, positions


def calibrate_step_cost(model: Any, rows: Sequence[int] = DEFAULT_ROWS, context: int = 128, slots: int = 16,
                        repeats: int = 3) -> StepCost:
    """Time ``model.forward_packed`` at each row count (rows spread over up to ``slots`` sequences,
    each at ``context`` tokens of history): one untimed warm-up, then the median of ``repeats``."""
    per_slot = max(rows) // min(max(rows), slots) + 1
    cap = min(model.config.max_seq_len, context + per_slot + 8)
    start = max(0, min(context, cap - per_slot - 1))
    cache = model.new_cache(cap, batch_size=min(slots, max(rows)))
    times = []
    with torch.inference_mode():
        for r in rows:
            slot_ids, positions = _spread(r, slots, start)
            tokens = [(7 * i + 3) % model.config.vocab_size for i in range(r)]
            model.forward_packed(tokens, slot_ids, positions, cache)  # warm-up: kernels for this M
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                model.forward_packed(tokens, slot_ids, positions, cache)
                samples.append(time.perf_counter() - t0)
            times.append(statistics.median(samples))
    return StepCost.from_points(rows, times, f"packed forwards of {type(model).__name__} over up to {slots} slots "
                                f"at context {context}, median of {repeats}", context=start)


_CACHE: dict[int, StepCost] = {}


def step_cost_for(model: Any) -> StepCost:
    """The calibrated cost of ``model`` (measured once per process and model object)."""
    key = id(model)
    if key not in _CACHE:
        _CACHE[key] = calibrate_step_cost(model)
    return _CACHE[key]
