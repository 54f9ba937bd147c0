"""The one loader of cost files: a cost profile (a file, or the dict read from one) -> the
:class:`specledger.cost.pricer.StepPricer` of its ``kind``.

It sits above every implementation it builds -- the measured :class:`specledger.cost.costmodel.CostModel`,
the imported :class:`specledger.cost.serving.SurfaceCost`, the :class:`specledger.cost.roofline.RooflineCost`
-- so that they import only the protocol module (:mod:`specledger.cost.pricer`), never the loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specledger.cost.costmodel import CostModel
from specledger.cost.pricer import StepPricer
from specledger.cost.roofline import roofline_from_dict
from specledger.cost.serving import SurfaceCost
from specledger.cost.surface import KIND as SURFACE_KIND
from specledger.cost.surface import CostSurface
from specledger.errors import require
from specledger.rundir import read_json


def pricer_from_dict(d: dict[str, Any], where: str = "cost profile") -> StepPricer:
    """The pricer a dict describes, by its ``kind``: ``cost-surface`` (imported), ``roofline``, else a measured
    cost model (``cost-model``, and ``serving-fit`` written before the serving fit became a cost model)."""
    require(isinstance(d, dict), f"{where} is not a cost profile (a JSON object); re-run `specledger calibrate`")
    if d.get("kind") == SURFACE_KIND:
        return SurfaceCost(CostSurface.from_dict(d, where))
    if d.get("kind") == "roofline":
        return roofline_from_dict(d)
    return CostModel.from_dict(d)


def load_pricer(path: str | Path) -> StepPricer:
    """A cost file: a measured cost model (``specledger calibrate``, a run's ``cost_model.json``, a serving fit),
    a measured surface (``kind: cost-surface`` or the import-format ``.jsonl``), or a roofline profile."""
    p = Path(path)
    require(p.is_file(), f"cost profile not found: {p}; run `specledger calibrate --out {p}` or give --hardware")
    if p.suffix == ".jsonl":
        return SurfaceCost(CostSurface.from_jsonl(p))
    return pricer_from_dict(read_json(p, "give a cost profile JSON (`specledger calibrate --out FILE`)"), str(p))


__all__ = ["load_pricer", "pricer_from_dict"]
