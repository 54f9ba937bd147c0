"""The cost files as JSON (``cost_model.json``, a cost surface profile), by their keys: what
:meth:`specledger.cost.costmodel.CostModel.to_dict` and :meth:`specledger.cost.surface.CostSurface.to_dict` write
and their ``from_dict`` read back. Coefficients in seconds per unit of their term, times in seconds."""

from __future__ import annotations

from typing import Any, TypedDict


class PartDict(TypedDict):
    """One part y = Σ coef[t]·x[t]: its terms and coefficients, their bootstrap covariance (None: not drawn), the
    fit's RMS residual and its observations."""

    terms: list[str]
    coef: list[float]
    cov: list[list[float]] | None
    rms_s: float | None
    n_obs: int


class SurfacePointDict(TypedDict):
    """One measured forward: ``batch`` requests of ``rows`` query tokens over ``context`` cached tokens, its
    median ``seconds`` over ``repeats`` timings."""

    batch: int
    rows: int
    context: int
    seconds: float
    repeats: int


class CostSurfaceDict(TypedDict):
    """A measured cost surface; ``meta``: where it came from as its writer tells (an import's file and the
    extra keys of its lines: free-form)."""

    kind: str
    source: str
    meta: dict[str, Any]
    points: list[SurfacePointDict]


class ImportLineDict(TypedDict, total=False):
    """One line of the surface import format (``calibrate --import FILE.jsonl``): ``q`` rows per request,
    ``ctx`` cached tokens, ``ms`` one forward's milliseconds; ``repeats`` when not 1."""

    batch: int
    q: int
    ctx: int
    ms: float
    repeats: int


class CostModelDict(TypedDict):
    """A fitted cost model: each part's form as text, the parts (per drafter where they depend on it), the
    measured surface the forward is priced on, noise quantiles and the solo surface's level per rows."""

    kind: str
    source: str
    forms: dict[str, str]
    forward: PartDict
    prefill: PartDict
    draft: dict[str, PartDict]
    other: dict[str, PartDict]
    begin: dict[str, PartDict]
    meta: dict[str, Any]  # what the fit was made from, as its writer tells (free-form)
    surface: CostSurfaceDict | None
    overhead: PartDict | None
    forward_ratios: list[float]
    prefill_ratios: list[float]
    row_levels: dict[str, float]  # rows (as JSON keys) -> level
