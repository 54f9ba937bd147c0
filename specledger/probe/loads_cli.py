"""The console side of ``specledger probe --loads``: the per-load table, then the report's verdicts,
gates and schedule (:func:`specledger.report.cli.print_summary`, the renderer of ``specledger run``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from specledger.probe.loads import LoadPoint, without_results
from specledger.probe.outputs import probe_loads_run
from specledger.probe.safe_text import safe
from specledger.rundir import HTML_NAME, META_NAME, PROBE_JSON, TRACE_NAME


def make_console() -> Console:
    """The terminal's width on a terminal; 200 columns when stdout is a file or a pipe (CI, ``| tee``), where
    Rich would otherwise cut every table to 80 ("pla…", "tok…")."""
    return Console() if sys.stdout.isatty() else Console(width=200)


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
    console = make_console()
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


def render_launch_table(console: Console, runs: dict[str, Any], gammas: dict[str, Any]) -> None:
    """``probe --launch``: one row per (configuration, load): throughput and its ratio to off at that load,
    latency, the pooled acceptance length of the server's counters, and drafted / accepted tokens summed
    per request against the server's counter deltas (:func:`specledger.probe.counters.engine_counters_over`, every
    repeat's window of that load)."""
    from specledger.probe.counters import engine_counters_over
    from specledger.probe.launch import BASELINE_SPEC, point_windows, pooled_ledger

    table = Table(title="specledger probe --launch: every configuration at every load (closed loop)")
    for col in ("spec", "γ", "load", "tok/s", "vs off", "TTFT P99 ms", "TPOT P50 ms", "ok / failed",
                "E[L] (server)", "accepted / drafted: per request | server", "agree"):
        table.add_column(col, justify="left" if col in ("spec", "agree") else "right")
    base = {p.load: p.full["probe"]["summary"] for p in runs[BASELINE_SPEC].points} if BASELINE_SPEC in runs else {}
    for name, run in runs.items():
        for p in sorted(run.points, key=lambda q: q.load):
            s = p.full["probe"]["summary"]
            off = base.get(p.load) or {}
            ratio = (s.get("output_throughput_tok_s") / off["output_throughput_tok_s"]
                     if s.get("output_throughput_tok_s") and off.get("output_throughput_tok_s") else None)
            rec = engine_counters_over(p.results, point_windows(p))
            el = pooled_ledger([p], None).get("el_reported")
            per, srv = rec["per_request_sum"], rec["server"]
            pair = (f"{_fmt(per['accepted'])} / {_fmt(per['draft_tokens'])} | "
                    f"{_fmt(srv['accepted'])} / {_fmt(srv['draft_tokens'])}")
            agree = {True: "yes", False: "NO", None: "-"}[rec["agree"]]
            table.add_row(*(safe(c, 200) for c in (
                name, str(gammas.get(name, "")), str(p.load), _fmt(s.get("output_throughput_tok_s"), 1),
                "1 (ref)" if name == BASELINE_SPEC else _fmt(ratio, 3), _fmt((s.get("ttft_ms") or {}).get("p99"), 1),
                _fmt((s.get("tpot_ms") or {}).get("p50"), 1), f"{s.get('requests_ok')} / {s.get('requests_failed')}",
                _fmt(el, 3), pair, agree)))
    console.print(table)


def show_launch(runs: dict[str, Any], summary: dict[str, Any], out: Path, as_json: bool) -> None:
    """``--json``: the summary's verdicts, schedules, engine counters; else the table, the report's verdicts
    and schedule, the engine's own paste-ready command per schedule, and the counters' reconciliation."""
    launch = summary.get("launch") or {}
    if as_json:
        doc = {k: summary.get(k) for k in ("verdicts", "schedules", "engine_counters", "launch")}
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    console = make_console()
    gammas = {name: spec.get("gamma") for name, spec in (launch.get("specs") or {}).items()}
    render_launch_table(console, runs, gammas)
    print_run_report(console, out, summary)
    for s in summary.get("schedules") or []:
        engine = s.get("engine") or {}
        head = f"  paste-ready ({safe(engine.get('kind') or 'engine')}) {safe(s['category'])} T={s['temperature']:g}: "
        command = engine.get("command")
        console.print(head + (safe(command, 2000) if command else "no speculative setting: serve plainly"),
                      highlight=False, soft_wrap=True, markup=False)
        if engine.get("note"):
            console.print(f"    [dim]{safe(engine['note'], 400)}[/dim]")
    for name, spec in (launch.get("specs") or {}).items():
        led = spec.get("ledger") or {}
        if led.get("el_reported") is not None:
            rates = ", ".join(f"{r:.2f}" for r in (led.get("per_position_rates") or [])[:8])
            console.print(f"ledger ({safe(name)}, γ={safe(spec.get('gamma'))} configured, pooled over every load): "
                          f"E[L] {led['el_reported']:.3f} tokens per round over {led.get('rounds')} rounds, "
                          f"{_fmt(led.get('acceptance_rate'), 3)} of drafted tokens accepted, Pr(K ≥ i) by position: "
                          f"{rates or '-'}", highlight=False)
        elif name != "off":
            console.print(f"ledger ({safe(name)}): the server drafted nothing during the run", highlight=False)
    for name, rec in (summary.get("engine_counters") or {}).items():
        if name != "off":
            console.print(f"engine counters ({safe(name)}): {safe(rec.get('verdict') or '', 600)}", highlight=False)
    if launch.get("order"):
        console.print(f"[dim]order: {safe(launch['order'], 400)}[/dim]")
