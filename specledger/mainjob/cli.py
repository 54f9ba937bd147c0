"""``specledger run``: the main job -- sweep, trace, analyse, report, verdict."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from specledger.errors import SpecLedgerError
from specledger.gates.slo import load_slo
from specledger.load_points import parse_loads


def _csv(text: str | None, cast=str) -> list | None:
    from specledger.bench.sweep import parse_csv

    return None if text is None else parse_csv(text, cast)


def parse_budget(text: str | None) -> float | None | bool:
    """"330", "90s", "6m", "1h" -> seconds; "none" -> False (no race); None -> None (the preset's)."""
    if text is None:
        return None
    t = text.strip().lower()
    if t in ("none", "off", "0"):
        return False
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:], None)
    number = t[:-1] if scale else t
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value < float("inf")):
        raise SpecLedgerError(f"--budget {text!r} is not a time; give seconds or minutes, e.g. 330, 90s or 6m")
    return value


def run(
    quick: Annotated[bool, typer.Option("--quick", help="About 2 minutes: 3 categories, 2 prompts each, gamma 4, loads 1 and 16 (64 simulated).")] = False,
    full: Annotated[bool, typer.Option("--full", help="Hours: 8 prompts per category, gamma 1-8, T 0 and 0.8, "
                                                       "then the sweep's quant4, policies and serving experiments.")] = False,
    out: Annotated[Path | None, typer.Option(help="Run directory (default: runs/<timestamp>).")] = None,
    resume: Annotated[Path | None, typer.Option(help="Continue an interrupted run in this directory.")] = None,
    categories: Annotated[str | None, typer.Option(help="Comma-separated categories.")] = None,
    drafters: Annotated[str | None, typer.Option(help="Comma-separated drafters (ngram,suffix,layerskip,quant-self,model,head).")] = None,
    gammas: Annotated[str | None, typer.Option(help="Comma-separated gammas, e.g. 1,2,4,8.")] = None,
    tree_budgets: Annotated[str | None, typer.Option(help="Comma-separated token-tree node budgets per round, "
                                                        "0 = chain, e.g. 0,8,16 (a tree's depth <= gamma).")] = None,
    tree_shape: Annotated[str | None, typer.Option(help="Tree rounds propose: dynamic (EAGLE-2 best-first, default) | "
                                                      "dp (the DP's static shape, assumed acceptance) | dp:0.6,0.2 "
                                                      "| dp:RUN_DIR (acceptance by depth x rank measured there).")]
    = None,
    temperatures: Annotated[str | None, typer.Option(help="Comma-separated temperatures, e.g. 0,0.8.")] = None,
    n: Annotated[int | None, typer.Option("--n", help="Prompts per category.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Tokens generated per request (default 40; code 96 and "
                                                        "math 64 so that a function or an answer can finish; "
                                                        "given, it applies to every category).")] = None,
    workload: Annotated[Path | None, typer.Option(help="Your own JSONL workload instead of the built-in categories.")] = None,
    target: Annotated[str | None, typer.Option(help="GGUF file or HF model dir (default: bundled SmolLM2-135M).")] = None,
    dtype: Annotated[str, typer.Option(help="auto (CPU: a GGUF target's own quantized blocks, as gguf: what a CPU user "
                                            "deploys; GPU: bfloat16) | float32 | bfloat16 | gguf | q8_0 | q4_0 | "
                                            "q4_1 (every linear quantized so) | int8")] = "auto",
    device: Annotated[str, typer.Option(help="cpu, or cuda[:N] on a machine with an NVIDIA GPU (dtype auto = bfloat16 there).")] = "cpu",
    layers: Annotated[str | None, typer.Option(help="layerskip layers (default: calibrate).")] = None,
    draft: Annotated[str | None, typer.Option(help="Draft model path for the 'model' drafter; a .safetensors head file for 'head'.")] = None,
    loads: Annotated[str | None, typer.Option(help="Concurrencies, e.g. 1,4,16: every setting also runs under "
                                                   "continuous batching at each load > 1 (default: 1,16; 1,4,16 adds ~2.5 min).")] = None,
    simulate_loads: Annotated[str | None, typer.Option(help="Loads beyond the measured ones, e.g. 64,256: after the "
                                                           "measured part the simulator (priced by this run's own "
                                                           "cost model) runs every setting at each; those verdicts "
                                                           "are labelled simulated, with the simulator's error at "
                                                           "the measured loads > 1 beside them. Every preset "
                                                           "simulates 64 (about a second); give loads to replace it, "
                                                           "e.g. 64,256, or none.")] = None,
    slo: Annotated[Path | None, typer.Option(help="SLO file (TOML/JSON): latency/capacity targets, target_load "
                                                  "(a measured or a simulated load).")] = None,
    seed: Annotated[int, typer.Option(help="Workload sampling and sampling seed.")] = 0,
    budget: Annotated[str | None, typer.Option(help="Time budget of the run, start to report (e.g. 330, 90s, 6m; "
                                                  "default 6m, so that `make run` fits 8 minutes with set-up). "
                                                  "After the first prompts the job races: more prompts where a "
                                                  "decision is open, clearly losing settings dropped, until every "
                                                  "decision is resolved or the budget is spent. 'none': no race.")]
    = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Print the full tables (ledger, gates, every verdict) "
                                          "after the answer.")] = False,
    sequential: Annotated[bool, typer.Option("--sequential", help="Run a prompt's settings one after the other "
                                             "(default: side by side, one round of each in turn, so the machine's "
                                             "drift cancels in the speed-ups).")] = False,
) -> None:
    """Run plain decoding and every drafter over real workloads; write traces, report.html, summary.json and the verdict."""
    started = time.monotonic()
    budget_s = parse_budget(budget)
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from specledger.engine.build import build_engine, deploy_dtype
    from specledger.mainjob.job import RunPlan, preset
    from specledger.mainjob.job import run as run_plan
    from specledger.report.build import build_report
    from specledger.report.console import print_answer
    from specledger.rundir import META_NAME, SUMMARY_NAME, RunDir

    console = Console(width=None if sys.stdout.isatty() else 160)
    if quick and full:
        raise SpecLedgerError("choose one of --quick and --full")
    if resume is not None:
        rd = RunDir(resume)
        if not rd.meta_path.exists():
            if resume.is_dir() and not (rd.trace_path.exists() and rd.trace_path.stat().st_size):
                raise SpecLedgerError(f"{resume} has no {META_NAME}: the run stopped before it wrote its plan, and "
                                      f"nothing was measured; start it again with --out {resume}")
            raise SpecLedgerError(f"{resume} has no {META_NAME}; it is not a run directory")
        meta = rd.meta(f"start a new run with --out instead of --resume {resume}")
        try:
            plan = RunPlan(**meta["config"])
        except (KeyError, TypeError):
            raise SpecLedgerError(f"{rd.meta_path} holds no run plan ('config'); start a new run with --out") from None
        run_dir = resume
    else:
        plan = preset("quick" if quick else "full" if full else "default")
        for attr, value in (
            ("categories", _csv(categories)), ("drafters", _csv(drafters)), ("gammas", _csv(gammas, int)),
            ("model_gammas", _csv(gammas, int)), ("tree_budgets", _csv(tree_budgets, int)), ("tree_shape", tree_shape),
            ("temperatures", _csv(temperatures, float)), ("n_per_category", n), ("max_tokens", max_tokens),
            ("layers", layers), ("draft", draft), ("seed", seed if seed else None),
            ("workload_file", str(workload) if workload else None), ("loads", parse_loads(loads)),
            ("simulate_loads", parse_loads(simulate_loads, "--simulate-loads", "64,256", allow_none=True)),
        ):
            if value is not None:
                setattr(plan, attr, value)
        if max_tokens is not None:
            plan.category_max_tokens = {}
        if budget_s is not None:
            plan.budget_s = budget_s or None
        plan.interleave_rounds = not sequential
        run_dir = out or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    plan.validate()
    from specledger.gates import check_target_load

    check_target_load(load_slo(slo), sorted({1, *plan.loads}), plan.simulate_loads)  # before any model loads

    from specledger.engine.device import resolve_device

    resolve_device(device)  # a one-line error before anything is written

    console.print(f"[bold]specledger run[/] -> {run_dir}  (Ctrl-C keeps every finished request; "
                  f"continue with --resume {run_dir})")
    with console.status("loading the target model (first use converts the GGUF once, ~30 s)"):
        engine = build_engine(target, deploy_dtype(target, dtype)) if device == "cpu" else \
            build_engine(target, dtype, device)
    console.print(f"target: {engine.name} ({engine.dtype}), drafters: {', '.join(plan.drafters)}, "
                  f"gammas: {plan.gammas}, temperatures: {plan.temperatures}, loads: {sorted({1, *plan.loads})}"
                  + (f", simulated loads: {plan.simulate_loads}" if plan.simulate_loads else ""))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("requests", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label[:48].ljust(48))

        run_plan(run_dir, plan, engine, resume=resume is not None, progress=progress,
                 on_warning=lambda w: console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False),
                 slo=load_slo(slo), started=started)
        if plan.side_experiments:  # --full: quantization four-way, gamma policies, serving under load
            from specledger.bench.sweep import run_side_experiments

            run_side_experiments(engine, run_dir, plan.seed, progress,
                                 lambda w: console.print(f"[yellow]warning:[/] {w}"))
    with console.status("analysing traces and writing the report"):
        record_bandwidth(run_dir, engine)
        summary, html = build_report(run_dir, slo)
    print_answer(summary, console, verbose=verbose)
    console.print(f"report: {html}\nsummary: {run_dir / SUMMARY_NAME}")


def record_bandwidth(run_dir: Path, engine: Any) -> None:
    """run.json ``bandwidth``: plain decoding's achieved bandwidth over the main job's plain requests against
    this machine's read bandwidth measured now (:func:`specledger.engine.bandwidth.plain_decode_bandwidth`)."""
    from specledger.engine.bandwidth import plain_decode_bandwidth
    from specledger.records import main_records
    from specledger.rundir import RunDir

    rd = RunDir(run_dir)
    plain = [r for r in main_records(rd.records()) if r.drafter == "none"]
    meta = rd.meta()
    figures = plain_decode_bandwidth(engine.model, plain, device=engine.device)
    if figures:
        meta["bandwidth"] = figures
    rd.write_meta(meta)
