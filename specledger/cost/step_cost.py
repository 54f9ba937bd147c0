"""The step cost a batched goodput policy plans with: a forward curve read off a pricer, plus drafting.

Under continuous batching one step runs a single packed forward over R rows (every running
request's last token plus its candidates), so the price of a candidate is what one more row
adds to that forward, T_fwd(R + 1) - T_fwd(R), paid by everybody in the batch. ``T_fwd`` is
priced by a :class:`specledger.cost.pricer.StepPricer` (the one cost type), at R rows over
min(R, slots) requests and the planning context: the engine and ``serve`` measure it
(:func:`specledger.engine.step_cost.calibrate_step_cost`, which times the model's packed forward and
builds a :class:`StepCost` with :meth:`StepCost.from_points`); the simulator passes its own cost.
``StepCost`` keeps no pricing rule of its own, and needs neither torch nor a model.

Drafting is the other per-candidate price: model-free drafters cost microseconds, model drafters
a forward of their own. ``StepCost`` keeps the running seconds per proposed candidate,
d = sum(t_draft) / sum(proposed) with exponential forgetting, shared by all requests that use it.
"""

from __future__ import annotations

from collections.abc import Sequence

from specledger.cost.pricer import StepPricer


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


__all__ = ["StepCost"]
