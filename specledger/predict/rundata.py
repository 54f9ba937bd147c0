"""A run directory's prediction inputs: its records, its cost model and its acceptance chains."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specledger.cost.costmodel import CostModel, Part, fit_cost_model
from specledger.errors import SpecLedgerError
from specledger.predict.acceptance import AcceptanceModel
from specledger.predict.check import usable
from specledger.predict.replay import Replayer, run_forecast_inputs
from specledger.records import RequestRecord
from specledger.rundir import COST_MODEL_JSON as COST_NAME
from specledger.rundir import RunDir


@dataclass
class RunModels:
    records: list[RequestRecord]
    cost: CostModel
    acceptance: AcceptanceModel
    max_tokens: int | None
    meta: dict[str, Any]
    replay: Replayer | None = None


def _is_zero(p: Part | None) -> bool:
    return p is None or not any(p.coef)


def with_fallback(cost: CostModel, fallback: CostModel) -> CostModel:
    """``cost`` with every per-drafter part it lacks (or has as all zeros, e.g. calibrate's ``other``)
    taken from ``fallback``."""
    def merge(a: dict[str, Part], b: dict[str, Part]) -> dict[str, Part]:
        out = {k: v for k, v in a.items() if not _is_zero(v)}
        for k, v in b.items():
            out.setdefault(k, v)
        return out

    return CostModel(f"{cost.source}; missing parts from {fallback.source}", cost.forward, cost.prefill,
                     merge(cost.draft, fallback.draft), merge(cost.other, fallback.other),
                     merge(cost.begin, fallback.begin), dict(cost.meta), cost.surface)


def load_run_models(run_dir: str | Path, cost_path: str | Path | None = None) -> RunModels:
    """Records of the run's main job, its cost model (``cost_path``, else the run's ``cost_model.json``,
    else fitted from its traces now) and its acceptance chains (each knows the run's max_tokens)."""
    run = RunDir(run_dir)
    d = run.path
    records = usable(run.records())
    meta = run.meta()
    if not records:
        raise SpecLedgerError(f"{d}: no solo, static-gamma requests to predict from; run `specledger run` first")
    max_tokens = (meta.get("config") or {}).get("max_tokens")
    surface, replay = run_forecast_inputs(records, meta)
    fitted: CostModel | None = None
    if cost_path is not None:
        cost = CostModel.load(cost_path)
        fitted = fit_cost_model(records, source=f"fitted from {d.name}", surface=surface)
        cost = with_fallback(cost, fitted)
    elif (d / COST_NAME).exists():
        cost = CostModel.load(d / COST_NAME)
    else:
        cost = fit_cost_model(records, source=f"fitted from {d.name}", surface=surface)
    acc = AcceptanceModel.from_records(records)
    if isinstance(max_tokens, int):
        for cat in acc.categories():
            for drafter in acc.drafters():
                for c in acc.requests(cat, drafter):
                    c.max_tokens = max_tokens
    return RunModels(records, cost, acc, max_tokens if isinstance(max_tokens, int) else None, meta, replay)
