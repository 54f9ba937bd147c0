"""``specledger calibrate`` and ``specledger predict``: thin verbs over specledger.predict
(:mod:`specledger.predict.tasks`, :mod:`specledger.engine.calibrate`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specledger.engine.choices import DTYPE_HELP


def calibrate(
    out: Annotated[Path, typer.Option(help="Where to write the cost model (JSON; its forward points go to "
                                           "NAME.surface.json beside it), or the surface alone in the import "
                                           "format when it ends in .jsonl.")] = Path("cost_model.json"),
    import_: Annotated[Path | None, typer.Option("--import", help="A measured surface in the import format (JSON "
                                                                  "Lines: batch, q, ctx, ms): write it as a "
                                                                  "surface profile to --out, no model load.")]
    = None,
    target: Annotated[str | None, typer.Option(
        help="GGUF file or HF model dir (default: bundled SmolLM2-135M).")] = None,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "auto",
    device: Annotated[str, typer.Option(help="cpu, or cuda where torch sees one.")] = "cpu",
    repeats: Annotated[int, typer.Option(help="Timed repeats per grid point (median).")] = 3,
    contexts: Annotated[str, typer.Option(help="Comma-separated context lengths of the grid.")] = "64,256,1024,2048",
) -> None:
    """Measure the cost surface (rows x context x batch, prefill, drafting) on this machine, about a minute;
    or, with --import, turn a surface measured elsewhere (e.g. on a GPU) into a profile."""
    from rich.console import Console

    if import_ is not None:
        from specledger.predict.tasks import import_surface

        surface = import_surface(import_, out)
        Console().print(f"{surface!r}\nwrote {out}", markup=False)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specledger.engine.calibrate import calibrate as run_calibration
    from specledger.engine.calibrate import grid_size, surface_path, write_calibration
    from specledger.predict.tasks import calibration_contexts

    ctxs = calibration_contexts(contexts, repeats, device)
    console = Console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:
        task = bar.add_task("calibrating", total=grid_size(ctxs))
        cost = run_calibration(target, dtype, device, ctxs, repeats,
                               progress=lambda msg: bar.update(task, advance=1, description=msg))
    write_calibration(cost, out)
    console.print(f"{cost.source}")
    for rows in (1, 5, 9):
        console.print(f"  round rows={rows} ctx=1024: {cost.round_s(rows, 1024) * 1e3:.2f} ms "
                      f"(± {cost.round_sd(rows, 1024) * 1e3:.2f})")
    console.print(f"  prefill 512 tokens: {cost.prefill_s(512) * 1e3:.1f} ms")
    console.print(f"wrote {out}" + ("" if str(out).endswith(".jsonl") else f" and {surface_path(out)}"))


def predict(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `specledger run`.")],
    drafter: Annotated[str, typer.Option(help="A drafter the run measured (its acceptance is needed).")],
    gamma: Annotated[int, typer.Option(help="Candidates per round to predict (>= 1).")],
    max_tokens: Annotated[int | None, typer.Option(help="Output budget (default: the run's).")] = None,
    cost: Annotated[Path | None, typer.Option(help="A cost model from `specledger calibrate` to use instead.")] = None,
    categories: Annotated[str | None, typer.Option(help="Comma-separated categories (default: all).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
    tree_budget: Annotated[int | None, typer.Option(help="Forecast token trees of N nodes per round (rows = N + 1, "
                                                         "depth <= --gamma) instead of chains.")] = None,
) -> None:
    """Predict end-to-end speed-up and tokens/s per category for a configuration that was not run
    (from the run's lowest-temperature requests)."""
    from specledger.predict.tasks import check_predict_options, forecast_chains

    check_predict_options(gamma, max_tokens)
    if tree_budget is not None:  # trees: specledger.predict.tree_forecast (acceptance measured or from the DP)
        from specledger.predict.tree_forecast import forecast_cli

        forecast_cli(run_dir, drafter, gamma, tree_budget, max_tokens, cost, categories, as_json)
        return
    models, preds = forecast_chains(run_dir, drafter, gamma, max_tokens, cost, categories)
    if as_json:
        print(json.dumps([p.to_dict() for p in preds], indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"predicted end to end: {drafter} γ={gamma}, max_tokens="
                    f"{max_tokens or models.max_tokens or 'as run'}")
    for col in ("category", "prompts", "rounds/request", "tokens/s", "speed-up S", "S 5-95 %"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for p in preds:
        t.add_row(p.category, str(p.requests), f"{p.rounds_per_request:.1f}", f"{p.predicted_tokens_per_s:.1f}",
                  f"{p.predicted_speedup:.3f}", f"{p.interval[0]:.3f} - {p.interval[1]:.3f}")
    console.print(t)
    console.print(f"cost model: {models.cost.source}")
    for p in preds[:1]:
        console.print(f"assumption: {p.assumption}")
        for term, where in p.extra["term_sources"].items():
            console.print(f"  {term}: {where}")
