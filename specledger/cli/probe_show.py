"""What ``specledger probe``, ``import`` and ``inspect`` print: the tables of :mod:`specledger.probe.tables`
drawn with Rich, then the report's verdicts, gates and schedule (:func:`specledger.report.console.print_summary`,
the renderer of ``specledger run``). Every value a server or a file supplies is escaped with
:func:`specledger.probe.safe_text.safe`."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from specledger.probe.documents import EndpointReport, Speedup
from specledger.probe.endpoint_loads import LoadPoint, without_results
from specledger.probe.launch_runs import SpecRun
from specledger.probe.safe_text import safe
from specledger.probe.tables import (
    LAUNCH_COLUMNS,
    MAX_CELL,
    fmt,
    launch_rows,
    loads_table,
    loads_warnings,
    ratio_rows,
    report_table,
)
from specledger.records import GammaSpec
from specledger.rundir import HTML_NAME, META_NAME, PROBE_JSON, TRACE_NAME


def make_console() -> Console:
    """The terminal's width on a terminal; 200 columns when stdout is a file or a pipe (CI, ``| tee``), where
    Rich would otherwise cut every table to 80 ("pla…", "tok…")."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def render_report(
    console: Console, title: str, columns: Mapping[str, EndpointReport], ratios: Speedup | None
) -> None:
    """One table with a column per endpoint, speed-up rows for a baseline, warnings below. Every title,
    name and value is escaped (:func:`~specledger.probe.safe_text.safe`): they may come from a server."""
    table = Table(title=safe(title, 200))
    table.add_column("figure")
    for name in columns:
        table.add_column(safe(name, 200), overflow="fold")
    labels, per_column, warnings = report_table(columns)
    for label in labels:
        table.add_row(safe(label), *[safe(rows.get(label, "-"), 4 * MAX_CELL) for rows in per_column.values()])
    if ratios:
        for label, value in ratio_rows(ratios):
            table.add_row(label, safe(value))
    console.print(table)
    for name, warning in warnings:
        console.print(f"[yellow]warning ({safe(name, 200)}):[/yellow] {safe(warning, 400)}")


def render_loads_table(console: Console, points: list[LoadPoint]) -> None:
    """One row per load: each endpoint's throughput, TTFT P99 and TPOT P50, the throughput ratio, failures."""
    columns, rows = loads_table(points)
    table = Table(title="specledger probe at loads (closed loop)")
    for col in columns:
        table.add_column(col, justify="left" if col in ("load", "first") else "right")
    for row in rows:
        table.add_row(*(safe(cell, 200) for cell in row))
    console.print(table)
    for load, role, w in loads_warnings(points):
        console.print(f"[yellow]warning (load {load}, {role}):[/yellow] {safe(w, 400)}")


def show_loads(points: list[LoadPoint], summary: dict[str, Any] | None, out: Path | None, as_json: bool,
               verbose: bool = False) -> None:
    """``--json``: every load's figures with the verdicts and schedules; else the answer as ``specledger run``
    prints it (:func:`print_answer_lines`), the per-load table and the full tables only with ``verbose``."""
    if as_json:
        doc = {"loads": [{"load": p.load, "order": list(p.order), **without_results(p.full)} for p in points],
               "verdicts": (summary or {}).get("verdicts", []), "schedules": (summary or {}).get("schedules", []),
               **{k: summary[k] for k in ("mix", "disturbance") if (summary or {}).get(k)}}
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    console = make_console()
    if verbose:
        render_loads_table(console, points)
    else:
        for load, role, w in loads_warnings(points)[:3]:
            console.print(f"[yellow]warning (load {load}, {role}):[/yellow] {safe(w, 400)}")
    if out is not None:
        print_run_report(console, out, summary, verbose)
    elif summary is not None:
        print_answer_lines(console, summary, verbose)


def print_answer_lines(console: Console, summary: dict[str, Any], verbose: bool = False) -> None:
    """The answer ``specledger run`` prints (:func:`specledger.report.console.answer_lines`: one line per category,
    the schedule), each line as it is (no markup, control characters shown); the full tables after it with
    ``verbose``."""
    from specledger.report.console import print_answer

    print_answer(summary, console, verbose=verbose)


def print_run_report(console: Console, out: Path, summary: dict[str, Any] | None, verbose: bool = False) -> None:
    """The answer (as `specledger run` prints it; the tables too with ``verbose``), then where the files are."""
    if summary is not None and any(summary.get(k) for k in ("baselines", "scenarios", "load_scenarios",
                                                              "load_baselines")):
        print_answer_lines(console, summary, verbose)
    else:
        console.print("[yellow]no request finished: the run folder holds no traces to compare[/]")
    written = [out / name for name in (PROBE_JSON, TRACE_NAME, META_NAME) if (out / name).is_file()]
    console.print("wrote " + ", ".join(safe(p) for p in written))
    console.print(f"report: {safe(out / HTML_NAME)} (rebuild with `specledger report {safe(out)}`)")


def render_launch_table(console: Console, runs: Mapping[str, SpecRun], gammas: Mapping[str, GammaSpec | None]
                        ) -> None:
    """``probe --launch``: one row per (configuration, load) (:func:`specledger.probe.tables.launch_rows`)."""
    table = Table(title="specledger probe --launch: every configuration at every load (closed loop)")
    for col in LAUNCH_COLUMNS:
        table.add_column(col, justify="left" if col in ("spec", "agree") else "right")
    for row in launch_rows(runs, gammas):
        table.add_row(*(safe(c, 200) for c in row))
    console.print(table)


def show_launch(runs: Mapping[str, SpecRun], summary: dict[str, Any], out: Path, as_json: bool,
                verbose: bool = False) -> None:
    """``--json``: the summary's verdicts, schedules, engine counters; else the answer (one line per category,
    the schedule), the engine's own paste-ready command per configuration deployed, each configuration's
    pooled ledger and the counters' reconciliation, the order, then the paths; ``verbose`` adds the
    per-(configuration, load) table and the full tables."""
    launch = summary.get("launch") or {}
    if as_json:
        doc = {k: summary.get(k) for k in ("verdicts", "schedules", "engine_counters", "launch", "mix", "disturbance")}
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    console = make_console()
    gammas = {name: spec.get("gamma") for name, spec in (launch.get("specs") or {}).items()}
    if verbose:
        render_launch_table(console, runs, gammas)
    print_launch_answer(console, summary, verbose)
    written = [out / name for name in (PROBE_JSON, TRACE_NAME, META_NAME) if (out / name).is_file()]
    console.print("wrote " + ", ".join(safe(p) for p in written))
    console.print(f"report: {safe(out / HTML_NAME)} (rebuild with `specledger report {safe(out)}`)")


def print_launch_answer(console: Console, summary: dict[str, Any], verbose: bool) -> None:
    """The answer, then one paste-ready command per distinct configuration the schedules deploy (every one with
    ``verbose``), one ledger line and one counters line per configuration, and the order."""
    launch = summary.get("launch") or {}
    print_answer_lines(console, summary, verbose)
    seen: set[str] = set()
    for s in summary.get("schedules") or []:
        engine = s.get("engine") or {}
        head = f"  paste-ready ({safe(engine.get('kind') or 'engine')}) {safe(s['category'])} T={s['temperature']:g}: "
        command = engine.get("command")
        if not verbose and (not command or command in seen):
            continue
        seen.add(command or "")
        console.print(head + (safe(command, 2000) if command else "no speculative setting: serve plainly"),
                      highlight=False, soft_wrap=True, markup=False)
        if engine.get("note") and verbose:
            console.print(f"    [dim]{safe(engine['note'], 400)}[/dim]")
    for name, spec in (launch.get("specs") or {}).items():
        led = spec.get("ledger") or {}
        if led.get("el_reported") is not None:
            rates = ", ".join(f"{r:.2f}" for r in (led.get("per_position_rates") or [])[:8])
            console.print(f"ledger ({safe(name)}, γ={safe(spec.get('gamma'))} configured, pooled over every load): "
                          f"E[L] {led['el_reported']:.3f} tokens per round over {led.get('rounds')} rounds, "
                          f"{fmt(led.get('acceptance_rate'), 3)} of drafted tokens accepted, Pr(K ≥ i) by position: "
                          f"{rates or '-'}", highlight=False, soft_wrap=True)
        elif name != "off":
            console.print(f"ledger ({safe(name)}): the server drafted nothing during the run", highlight=False)
    for name, rec in (summary.get("engine_counters") or {}).items():
        if name != "off":
            console.print(f"engine counters ({safe(name)}): {safe(rec.get('verdict') or '', 600)}", highlight=False,
                          soft_wrap=True)
    if launch.get("order"):
        console.print(f"[dim]order: {safe(launch['order'], 400)}[/dim]", soft_wrap=True)
