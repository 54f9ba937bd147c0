"""The console side of ``specledger probe --loads``: the per-load table, then the report's verdicts,
gates and schedule (:func:`specledger.report.cli.print_summary`, the renderer of ``specledger run``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from specledger.probe.loads import LoadPoint, without_results
from specledger.probe.outputs import probe_loads_run
from specledger.probe.safe_text import safe
from specledger.rundir import HTML_NAME, META_NAME, PROBE_JSON, TRACE_NAME


def _fmt(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def summary_in_memory(points: list[LoadPoint], wl: Any, label: str, gamma: str | None, tok: Any,
                       slo: Any) -> dict[str, Any] | None:
    """Without --out: the same summary (gates, verdicts, schedule) from the records kept in memory."""
    from specledger.summary import summarize

    records, meta = probe_loads_run(points, wl, label, gamma, tok, "probe")
    return summarize(records, meta, slo) if records else None


def render_loads_table(console: Console, points: list[LoadPoint]) -> None:
    """One row per load: each endpoint's throughput, TTFT P99 and TPOT P50, the throughput ratio, failures."""
    base = any("baseline" in p.full for p in points)
    table = Table(title="specledger probe at loads (closed loop)")
    for col in ["load", "tok/s", "TTFT P99 ms", "TPOT P50 ms", "ok / failed"] + (
            ["plain tok/s", "plain TTFT P99 ms", "plain TPOT P50 ms", "plain ok / failed", "tok/s ratio", "first"]
            if base else []):
        table.add_column(col, justify="left" if col in ("load", "first") else "right")

    def cells(report: dict[str, Any]) -> list[str]:
        s = report["summary"]
        return [_fmt(s.get("output_throughput_tok_s"), 1), _fmt((s.get("ttft_ms") or {}).get("p99"), 1),
                _fmt((s.get("tpot_ms") or {}).get("p50"), 1), f"{s.get('requests_ok')} / {s.get('requests_failed')}"]

    for p in points:
        row = [str(p.load), *cells(p.full["probe"])]
        if base and "baseline" in p.full:
            row += [*cells(p.full["baseline"]), _fmt((p.full.get("speedup") or {}).get("throughput_ratio"), 3),
                    "endpoint" if p.order[0] == "probe" else "baseline"]
        table.add_row(*(safe(cell, 200) for cell in row))
    console.print(table)
    for p in points:
        for role in p.order:
            for w in p.full[role].get("warnings", []):
                console.print(f"[yellow]warning (load {p.load}, {role}):[/yellow] {safe(w, 400)}")


def show_loads(points: list[LoadPoint], summary: dict[str, Any] | None, out: Path | None, as_json: bool) -> None:
    """``--json``: every load's figures with the verdicts and schedules; else the table, then the summary."""
    if as_json:
        doc = {"loads": [{"load": p.load, "order": list(p.order), **without_results(p.full)} for p in points],
               "verdicts": (summary or {}).get("verdicts", []), "schedules": (summary or {}).get("schedules", [])}
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    console = Console()
    render_loads_table(console, points)
    if out is not None:
        print_run_report(console, out, summary)
    elif summary is not None:
        from specledger.report.cli import print_summary

        print_summary(summary, console)


def print_run_report(console: Console, out: Path, summary: dict[str, Any] | None) -> None:
    """The report's tables and verdicts (as `specledger run` prints them), then where the files are."""
    from specledger.report.cli import print_summary

    if summary is not None and any(summary.get(k) for k in ("baselines", "scenarios", "load_scenarios",
                                                              "load_baselines")):
        print_summary(summary, console)
    else:
        console.print("[yellow]no request finished: the run folder holds no traces to compare[/]")
    written = [out / name for name in (PROBE_JSON, TRACE_NAME, META_NAME) if (out / name).is_file()]
    console.print("wrote " + ", ".join(safe(p) for p in written))
    console.print(f"report: {safe(out / HTML_NAME)} (rebuild with `specledger report {safe(out)}`)")
