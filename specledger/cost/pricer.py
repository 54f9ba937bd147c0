"""The one cost type: what every forecast prices a step with (the protocol only; every implementation imports
this module, and the one loader of cost files, :func:`specledger.cost.loader.load_pricer`, imports them).

:class:`StepPricer` is the contract. There is one implementation per *source* of the numbers, each saying
in ``source`` where they came from:

==========  ===============================================  ============================================
source      class                                            built by
==========  ===============================================  ============================================
measured    :class:`specledger.cost.costmodel.CostModel`  a run's rounds (forward = s · Σ, the run's own
                                                             measured surface Σ and one fitted level s), a
                                                             serving run's batched steps
                                                             (:func:`specledger.simulate.profile.fit_serving_cost`)
imported    :class:`specledger.cost.serving.SurfaceCost`     a surface measured elsewhere (``calibrate
                                                             --import``, a GPU, another engine)
roofline    :class:`specledger.cost.roofline.RooflineCost`   a model config and a hardware table (a lower
                                                             bound plus assumed overheads; never measured)
==========  ===============================================  ============================================

A measured cost model may also carry the machine's step-to-step noise (``has_noise`` and ``jitter(u)``, the
(forward, prefill) multipliers at quantile u); the simulator applies it when present.

Everything that prices a step goes through one of them: ``predict`` and the report's forecasts, the
in-run check, ``simulate`` (step and fast paths), and the goodput γ policy of the engine, ``serve`` and the
simulator (:class:`specledger.cost.step_cost.StepCost` reads its forward curve from a pricer, it keeps
no pricing rule of its own).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class StepPricer(Protocol):
    """Seconds of each part of a step. ``rows`` are query rows (a request's last token plus its candidates,
    summed over the batch for ``total_rows``); ``context`` is tokens already in each request's KV cache."""

    @property
    def source(self) -> str:
        """Where the numbers come from (measured / imported / roofline, and what is assumed)."""
        ...

    def prefill_s(self, prompt_tokens: int, slots: int = 1) -> float:
        """Prefill of ``prompt_tokens`` into a server with ``slots`` sequence slots."""
        ...

    def step_s(self, total_rows: int, batch: int, context: float) -> float:
        """One packed target forward over ``total_rows`` rows of ``batch`` requests at mean ``context``."""
        ...

    def step_s_many(self, rows: np.ndarray, batch: int, context: np.ndarray) -> np.ndarray:
        """:meth:`step_s` for many steps of one batch size (the same floats)."""
        ...

    def round_s(self, rows: int, context: float) -> float:
        """A solo round's target forward: ``step_s(rows, 1, context)``."""
        ...

    def draft_s(self, drafter: str, gamma: int, context: float = 0.0) -> float:
        """One request's drafting in one round asking ``gamma`` candidates (0 at γ = 0)."""
        ...

    def other_s(self, batch: int = 1) -> float:
        """Per-step overhead outside forward and drafting (sampling, acceptance, scheduling)."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict :func:`specledger.cost.loader.load_pricer` reads back."""
        ...


def step_s_each(pricer: Any, rows: np.ndarray, batch: int, context: np.ndarray) -> np.ndarray:
    """``pricer.step_s`` at every (rows_s, context_s): a pricer's vectorised path is the same floats."""
    return np.array([pricer.step_s(r, batch, c) for r, c in zip(rows.tolist(), context.tolist())], dtype=np.float64)


__all__ = ["StepPricer", "step_s_each"]
