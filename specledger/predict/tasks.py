"""The work behind ``specledger calibrate`` and ``specledger predict`` (the commands: :mod:`specledger.cli.predict`):
option checks, a surface import, and a run's forecast for a configuration it did not run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specledger.errors import SpecLedgerError


def import_surface(source: Path, out: Path) -> Any:
    """A surface measured elsewhere (import format, JSON Lines) written to ``out``: the surface alone in the import
    format when ``out`` ends in .jsonl, else a surface profile. Returns the :class:`CostSurface`."""
    from specledger.cost.surface import CostSurface

    surface = CostSurface.from_jsonl(source)
    if str(out).endswith(".jsonl"):
        from specledger.rundir import write_text_atomic

        write_text_atomic(out, surface.to_jsonl())
    else:
        surface.save(out)
    return surface


def calibration_contexts(contexts: str, repeats: int, device: str) -> list[int]:
    """The grid's context lengths from ``--contexts``, after checking ``--repeats`` and ``--device``."""
    from specledger.engine.calibrate import check_device

    try:
        ctxs = [int(c) for c in contexts.split(",") if c.strip()]
    except ValueError:
        raise SpecLedgerError(f"--contexts must be comma-separated integers, got {contexts!r}") from None
    if not ctxs or min(ctxs) < 1:
        raise SpecLedgerError("--contexts needs at least one context length >= 1")
    if repeats < 1:
        raise SpecLedgerError(f"--repeats must be >= 1, got {repeats}")
    check_device(device)
    return ctxs


def check_predict_options(gamma: int, max_tokens: int | None) -> None:
    """Reject a γ below 1 (plain decoding is the baseline) or an output budget below 1."""
    if gamma < 1:
        raise SpecLedgerError(f"--gamma must be >= 1 (plain decoding is the baseline), got {gamma}")
    if max_tokens is not None and max_tokens < 1:
        raise SpecLedgerError(f"--max-tokens must be >= 1, got {max_tokens}")


def forecast_chains(run_dir: Path, drafter: str, gamma: int, max_tokens: int | None, cost: Path | None,
                    categories: str | None) -> tuple[Any, list[Any]]:
    """The run's models and its per-category predictions for ``drafter`` at ``gamma`` (chains), from the run's
    lowest-temperature requests; ``categories`` comma-separated (None: all)."""
    from specledger.predict.predict import measured_baseline, predict_run, request_noise, window_levels
    from specledger.predict.rundata import load_run_models

    models = load_run_models(run_dir, cost)
    if drafter not in models.acceptance.drafters():
        known = ", ".join(models.acceptance.drafters()) or "none"
        raise SpecLedgerError(f"{run_dir} has no measured requests of drafter {drafter!r} (it has: {known}); "
                              "predict a drafter the run measured")
    cats = [c for c in categories.split(",") if c] if categories else None
    if cats:
        unknown = sorted(set(cats) - set(models.acceptance.categories()))
        if unknown:
            raise SpecLedgerError(f"unknown categories {', '.join(unknown)}; the run has "
                                  f"{', '.join(models.acceptance.categories())}")
    preds = predict_run(models.cost, models.acceptance, drafter, gamma, max_tokens, cats,
                        replay=models.replay, noise=request_noise(models.cost, models.records),
                        baseline=measured_baseline(models.records, max_tokens),
                        window=window_levels(models.cost, models.records))
    return models, preds
