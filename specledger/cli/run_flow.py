"""``specledger run`` on the terminal: the plan from the options, the target loaded, the main job (and
``--full``'s side experiments) under a progress bar, the report written and the answer printed."""

from __future__ import annotations

import sys
import time
from typing import Any

from specledger.cli.interrupt import note_resume
from specledger.errors import SpecLedgerError
from specledger.gates.slo import load_slo
from specledger.mainjob.options import RunOptions, check_inputs, parse_budget, plan_from_options


def run_main_job(opts: RunOptions) -> None:
    """The whole verb: plan, checks (before any model loads), the job, the report, the answer."""
    started = time.monotonic()
    budget_s = parse_budget(opts.budget)
    from rich.console import Console
    from rich.markup import escape

    from specledger.bench.progress import live_progress
    from specledger.mainjob.job import record_bandwidth
    from specledger.mainjob.job import run as run_plan
    from specledger.report.build import build_report
    from specledger.report.console import print_answer
    from specledger.rundir import SUMMARY_NAME

    console = Console(width=None if sys.stdout.isatty() else 160)
    if opts.quick and opts.full:
        raise SpecLedgerError("choose one of --quick and --full")
    plan, run_dir = plan_from_options(opts, budget_s)
    check_inputs(plan)  # the plan, the workload file and the budget, before a folder exists or a model loads
    from specledger.gates import check_target_load

    check_target_load(load_slo(opts.slo), sorted({1, *plan.loads}), plan.simulate_loads)  # before any model loads

    from specledger.engine.device import resolve_device

    resolve_device(opts.device)  # a one-line error before anything is written

    console.print(f"[bold]specledger run[/] -> {run_dir}  (Ctrl-C keeps every finished request; "
                  f"continue with --resume {run_dir})")
    note_resume(f"specledger run --resume {run_dir}")  # the line Ctrl-C prints (specledger.cli.interrupt)
    engine = load_target(console, opts.target, opts.dtype, opts.device)
    from specledger.engine.build import weights_line

    console.print(weights_line(engine), highlight=False)
    console.print(f"target: {engine.name} ({engine.dtype}), drafters: {', '.join(plan.drafters)}, "
                  f"gammas: {plan.gammas}, temperatures: {plan.temperatures}, loads: "
                  + (f"{min(plan.loads)}..{max(plan.loads)} (bisected where the decision changes, within the budget)"
                     if getattr(plan, "locate_loads", False) else f"{sorted({1, *plan.loads})}")
                  + (f", simulated loads: {plan.simulate_loads}" if plan.simulate_loads else ""))
    with live_progress(console, 48, remaining=True) as progress:
        run_plan(run_dir, plan, engine, resume=opts.resume is not None, progress=progress,
                 on_warning=lambda w: console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False),
                 slo=load_slo(opts.slo), started=started)
        if plan.side_experiments:  # --full: quantization four-way, gamma policies, serving under load
            from specledger.bench.sweep import run_side_experiments

            run_side_experiments(engine, run_dir, plan.seed, progress,
                                 lambda w: console.print(f"[yellow]warning:[/] {w}"))
    with console.status("analysing traces and writing the report"):
        record_bandwidth(run_dir, engine)
        summary, html = build_report(run_dir, opts.slo)
    print_answer(summary, console, verbose=opts.verbose)
    console.print(f"report: {html}\nsummary: {run_dir / SUMMARY_NAME}")


def load_target(console: Any, target: str | None, dtype: str, device: str) -> Any:
    """The target engine, under a status line (on the CPU, ``auto`` is what a CPU user deploys)."""
    from specledger.engine.build import build_engine

    with console.status("loading the target model (first use converts the GGUF once, ~30 s)"):
        return build_engine(target, dtype) if device == "cpu" else build_engine(target, dtype, device)

