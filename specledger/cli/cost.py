"""``specledger cost``: the step prices a surface gives, and where each comes from
(:mod:`specledger.cost.price_table`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def cost(
    profile: Annotated[Path, typer.Argument(help="A surface profile (`calibrate --out`, `calibrate --import`) or "
                                                 "an import-format .jsonl.")],
    batch: Annotated[str, typer.Option(help="Comma-separated batch sizes (requests per step).")] = "1",
    rows: Annotated[str, typer.Option(help="Comma-separated rows per request (γ + 1).")] = "1,2,4,8,16",
    context: Annotated[str, typer.Option(help="Comma-separated context lengths (tokens in each KV cache).")] = "512",
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
) -> None:
    """Print the step time forecasts will use at each point, and whether it was measured, interpolated or
    extrapolated (with the relative standard error forecasts give it)."""
    from specledger.cost.price_table import int_list, price_table
    from specledger.cost.surface import CostSurface

    surface = CostSurface.load(profile)
    table = price_table(surface, int_list(batch, "--batch", 1), int_list(rows, "--rows", 1),
                        int_list(context, "--context", 0))
    if as_json:
        print(json.dumps(table, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    style = {"measured": "green", "interpolated": "cyan", "extrapolated": "bold red"}
    t = Table(title=f"one target forward, from {profile}")
    for col in ("context", "batch", "rows/request", "ms", "± %", "source"):
        t.add_column(col, justify="left" if col == "source" else "right")
    for p in table:
        t.add_row(str(p["context"]), str(p["batch"]), str(p["rows"]), f"{p['ms']:.3f}", f"{100 * p['rel_sd']:.0f}",
                  f"[{style[p['source']]}]{p['source']}[/]")
    console = Console()
    console.print(t)
    console.print(f"{surface.source}; measured rows {surface.rows_axis}, batches {surface.batches}, "
                  f"contexts {surface.contexts}")
