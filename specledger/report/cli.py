"""``specledger report RUN_DIR``: rebuild summary.json + report.html from traces, print the verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

_STATUS = {"pass": "[green]✓[/]", "fail": "[red]✗[/]", "not assessed": "[dim]–[/]"}


def _f(x: Any, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """Compact table (one row per setting: S with CI, E[L], tok/s, round ms, gates) and the verdicts."""
    console = console or Console()
    table = Table(title="specledger: speculative decoding ledger", show_lines=False, header_style="bold")
    for col, justify in (
        ("setting", "left"),
        ("S [95% CI]", "right"),
        ("pred S", "right"),
        ("E[L]", "right"),
        ("tok/s", "right"),
        ("round ms", "right"),
        ("T0·E[L] ms", "right"),
        ("C Q L Cap", "center"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for b in summary.get("baselines", []):
        table.add_row(
            b["label"],
            "1 (ref)",
            "",
            _f(b["rounds"]["el_full"]),
            _f(b["totals"]["tokens_per_s"], 1),
            _f(b["rounds"]["t_round_ms"]),
            "",
            "",
        )
    for s in summary.get("scenarios", []):
        lo, hi = s.get("speedup_ci") or (None, None)
        rec = s.get("reconciliation") or {}
        t0 = s.get("t0_ms")
        el = s["rounds"]["el_full"]
        gates = " ".join(
            _STATUS.get(s.get("gates", {}).get(g, {}).get("status", ""), "?")
            for g in ("correctness", "quality", "latency", "capacity")
        )
        speed = "n/a" if s.get("speedup") is None else f"{s['speedup']:.3f} [{_f(lo, 2)}, {_f(hi, 2)}]"
        table.add_row(
            s["label"],
            speed,
            _f(rec.get("predicted_speedup"), 3),
            _f(el),
            _f(s["totals"]["tokens_per_s"], 1),
            _f(s["rounds"]["t_round_ms"]),
            _f(t0 * el if t0 is not None and el is not None else None),
            gates,
        )
    console.print(table)
    console.print(
        "[dim]gates: C correctness, Q quality, L latency, Cap capacity (✓ pass, ✗ fail, – not assessed)[/]"
    )
    for v in summary.get("verdicts", []):
        head = f"deploy {v['drafter']} γ={v['gamma']}" if v["decision"] == "deploy" else "off"
        colour = "green" if v["decision"] == "deploy" else "yellow"
        console.print(f"[bold]{v['category']} T={v['temperature']:g}[/]: [{colour}]{head}[/] — {v['reason']}")


def _ci(row: dict[str, Any]) -> str:
    lo, hi = row.get("speedup_ci") or (None, None)
    speed = _f(row.get("speedup"), 3)
    return speed if lo is None or hi is None else f"{speed} [{_f(lo)}, {_f(hi)}]"


def _same(row: dict[str, Any]) -> str:
    c = row.get("correctness")
    if not c:
        return "ref"
    colour = "green" if c["all_identical"] else "red"
    return f"[{colour}]{c['identical']}/{c['of']}[/]"


def print_experiments(summary: dict[str, Any], console: Console | None = None) -> None:
    """Tables of the side experiments in ``summary["experiments"]`` (quantization four-way, policies)."""
    console = console or Console()
    experiments = summary.get("experiments") or {}
    q = experiments.get("quantization")
    if q:
        table = Table(title=f"quantization four-way ({q['drafter']} γ={q['gamma']}, {len(q['prompts'])} prompts)",
                      header_style="bold")
        for col in ("setting", "tok/s", "S vs fp32 plain [95% CI]", "E[L]", "identical to verifier", "task score"):
            table.add_column(col, justify="left" if col == "setting" else "right")
        for r in q["settings"]:
            table.add_row(r["setting"], _f(r["tokens_per_s"], 1), _ci(r), _f(r["el_full"]) if r["speculative"] else "1",
                          _same(r), _f(r.get("quality_mean"), 3))
        console.print(table)
        for line in q.get("statements", []):
            console.print(f"  {line}")
    p = experiments.get("policies")
    if p:
        table = Table(title=f"speculation-length policies ({p['drafter']}, {len(p['prompts'])} prompts)",
                      header_style="bold")
        for col in ("setting", "tok/s", "S [95% CI]", "mean γ", "E[L]", "accept", "identical"):
            table.add_column(col, justify="left" if col == "setting" else "right")
        for r in p["settings"]:
            table.add_row(r["setting"], _f(r["tokens_per_s"], 1), _ci(r), _f(r["mean_gamma"]), _f(r["el_full"]),
                          _f(r["acceptance_rate"], 3), _same(r))
        console.print(table)
        if p.get("goodput_vs_best_static"):
            console.print(f"  {p['goodput_vs_best_static']['statement']}")


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
        int, typer.Option("--resamples", min=0, help="Bootstrap resamples for the speed-up CI.")
    ] = 1000,
    seed: Annotated[int, typer.Option("--seed", help="Bootstrap seed.")] = 0,
) -> None:
    """Rebuild summary.json and a self-contained report.html from recorded traces (nothing is re-run)."""
    from specledger.report.build import build_report

    summary, html_path = build_report(run_dir, slo, n_resamples=resamples, seed=seed)
    if json_output:
        typer.echo(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        console = Console()
        print_summary(summary, console)
        print_experiments(summary, console)
        console.print(f"report: {html_path}\nsummary: {html_path.with_name('summary.json')}")
    if open_:
        import webbrowser

        webbrowser.open(html_path.resolve().as_uri())
