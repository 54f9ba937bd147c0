"""``specledger report RUN_DIR``: rebuild summary.json + report.html from traces, print the verdict
(:func:`specledger.report.build.build_report`; the console output: :mod:`specledger.report.console`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def report(
    run_dir: Annotated[Path, typer.Argument(help="Run folder holding traces.jsonl (and run.json).")],
    slo: Annotated[
        Path | None,
        typer.Option(
            "--slo", help="SLO file (.toml or .json): ttft_p99_ms, tpot_p50_ms, itl_p99_ms, stall_ms, ..."
        ),
    ] = None,
    open_: Annotated[bool, typer.Option("--open", help="Open report.html in a browser afterwards.")] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print summary.json to stdout instead of the table.")
    ] = False,
    resamples: Annotated[
        int, typer.Option("--resamples", min=0, help="Bootstrap resamples for simulated loads' speed-up interval "
                                                 "(measured ones use the decisions' own).")
    ] = 1000,
    seed: Annotated[int, typer.Option("--seed", help="Bootstrap seed.")] = 0,
    verbose: Annotated[bool, typer.Option("--verbose", help="Print the full tables after the answer.")] = False,
    simulate_loads: Annotated[
        str | None,
        typer.Option("--simulate-loads", help="Loads to simulate beyond the measured ones, e.g. 64,256, or none "
                     "(default: the run's own, run.json config.simulate_loads)."),
    ] = None,
) -> None:
    """Rebuild summary.json and a self-contained report.html from recorded traces (nothing is re-run; simulated
    loads are simulated again, seeded, from the same traces)."""
    from specledger.load_points import parse_loads
    from specledger.report.build import build_report

    sim = parse_loads(simulate_loads, "--simulate-loads", "64,256", allow_none=True)
    summary, html_path = build_report(run_dir, slo, n_resamples=resamples, seed=seed, simulate_loads=sim)
    if json_output:
        typer.echo(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        from rich.console import Console

        from specledger.report.console import print_answer
        from specledger.report.console_experiments import print_experiments

        console = Console()
        print_answer(summary, console, verbose=verbose)
        if verbose or not summary.get("verdicts"):  # an import or a probe without a baseline: its figures
            print_experiments(summary, console)
        console.print(f"report: {html_path}\nsummary: {html_path.with_name('summary.json')}")
    if open_:
        import webbrowser

        webbrowser.open(html_path.resolve().as_uri())
