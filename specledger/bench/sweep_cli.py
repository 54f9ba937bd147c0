"""``specledger sweep``: the side experiments -- quantization four-way and speculation-length
policies at concurrency 1, and serving (continuous batching under load and long context) --
written into a run directory (traces + JSON) with its report. Flags here; the experiments in
:mod:`specledger.bench.sweep`, :mod:`~specledger.bench.quantization`, :mod:`~specledger.bench.policies`
and :mod:`~specledger.bench.serving`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from specledger.bench.sweep import (
    load_sweep_items,
    parse_csv,
    parse_drafter_gammas,
    parse_quant_candidates,
    write_meta,
)
from specledger.engine.choices import DTYPE_HELP
from specledger.errors import require

EXPERIMENTS = ("quant4", "policies", "serving", "all")


def sweep(
    experiment: Annotated[str, typer.Option(help="quant4 | policies | serving | all")] = "all",
    categories: Annotated[str, typer.Option(help="Comma-separated categories.")] = "code-edit,dialogue",
    n: Annotated[int, typer.Option("--n", help="Prompts per category.")] = 2,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 96,
    drafter: Annotated[str, typer.Option(help="Drafter for both experiments (ngram, suffix, layerskip, ...); "
                                              "quant-self is degenerate on an int8 target.")] = "ngram",
    gamma: Annotated[int, typer.Option(help="Static gamma of the policies' reference setting.")] = 4,
    quant_drafters: Annotated[str, typer.Option(
        help="quant4: drafter:gamma candidates; each target speculates with its best, picked on prompts held apart "
             "from the table's (one candidate: used as is).")] = "ngram:2,ngram:4,suffix:2,suffix:4",
    gammas: Annotated[str, typer.Option(help="Static gammas to compare the policies with.")] = "1,2,4,6,8",
    tree_budgets: Annotated[str, typer.Option(help="policies: token-tree node budgets per round beside each "
                                                   "static gamma (0 = chain only), e.g. 0,8,16.")] = "0",
    policies: Annotated[str, typer.Option(help="Dynamic policies: heuristic, ema, batch, goodput.")]
    = "heuristic,ema,goodput",
    out: Annotated[Path | None, typer.Option(help="Run directory (default: runs/sweep-<timestamp>).")] = None,
    workload: Annotated[Path | None, typer.Option(help="Your own JSONL workload instead of the categories.")] = None,
    target: Annotated[str | None, typer.Option(help="GGUF file or HF model dir (default: bundled SmolLM2-135M).")]
    = None,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "auto",
    layers: Annotated[str | None, typer.Option(help="layerskip layers (default: calibrate).")] = None,
    draft: Annotated[str | None, typer.Option(help="Draft model path for the 'model' drafter; a .safetensors head file for 'head'.")] = None,
    concurrencies: Annotated[str, typer.Option(help="serving: closed-loop concurrency levels.")] = "1,2,4,8,16",
    rates: Annotated[str, typer.Option(help="serving: Poisson arrival rates in req/s (default: none).")] = "",
    contexts: Annotated[str, typer.Option(help="serving: context lengths in tokens, e.g. 256,1024,4096 "
                                               "(default: skip).")] = "",
    context_concurrencies: Annotated[str, typer.Option(help="serving: concurrencies of the context grid, e.g. "
                                                            "1,4,16 (the crossover at each length).")] = "4",
    context_sources: Annotated[str, typer.Option(help="serving: long inputs: xsum, agent (ToolTalk sessions), "
                                                      "padding (a labelled control).")] = "xsum",
    serving_drafters: Annotated[str, typer.Option(help="serving: drafter:gamma settings.")] = "ngram:4,suffix:4",
    serving_max_tokens: Annotated[int, typer.Option(help="serving: tokens generated per request.")] = 48,
    repeats: Annotated[int, typer.Option(min=1, help="serving: times each load point is served (same requests, "
                                                     "settings interleaved); >= 2 gives speed-up intervals.")] = 3,
    seed: Annotated[int, typer.Option(help="Workload sampling and bootstrap seed.")] = 0,
    resamples: Annotated[int, typer.Option(min=1, help="Bootstrap resamples for the speed-up CIs.")] = 1000,
) -> None:
    """Quantization four-way, speculation-length policies and serving under load; writes traces, JSON and
    report.html."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specledger.bench.policies import DYNAMIC, run_policies
    from specledger.bench.quantization import run_quantization
    from specledger.bench.serving import check_serving_settings, run_serving
    from specledger.engine.build import build_engine
    from specledger.engine.drafters.registry import DRAFTERS
    from specledger.report.build import build_report
    from specledger.report.cli import print_experiments

    require(experiment in EXPERIMENTS, f"unknown --experiment {experiment!r}; use one of {', '.join(EXPERIMENTS)}")
    require(drafter in DRAFTERS and drafter != "none",
            f"unknown drafter {drafter!r}; choose from {', '.join(DRAFTERS[1:])}")
    require(max_tokens >= 1, "--max-tokens must be >= 1")
    static = parse_csv(gammas, int)
    names = parse_csv(policies)
    budgets = parse_csv(tree_budgets, int)
    require(all(b >= 0 for b in budgets), "--tree-budgets must be integers >= 1 (0 = chain), e.g. 0,8,16")
    require(bool(static) and all(g >= 1 for g in static), "--gammas must be integers >= 1, e.g. 1,2,4,6,8")
    for p in names:
        require(p in DYNAMIC, f"unknown policy {p!r}; choose from {', '.join(DYNAMIC)}")
    serving = experiment in ("serving", "all")
    conc_levels, rate_levels, context_levels = parse_csv(concurrencies, int), parse_csv(rates, float), parse_csv(contexts, int)
    spec_settings = parse_drafter_gammas(serving_drafters)
    quant_candidates = parse_quant_candidates(quant_drafters) if experiment in ("quant4", "all") else []
    if serving:
        check_serving_settings(spec_settings, conc_levels, rate_levels, serving_max_tokens,
                               parse_csv(context_concurrencies, int), parse_csv(context_sources))
    console = Console()
    run_dir = out or Path("runs") / time.strftime("sweep-%Y%m%d-%H%M%S")
    console.print(f"[bold]specledger sweep[/] ({experiment}) -> {run_dir}")
    with console.status("loading the target model"):
        engine = build_engine(target, dtype)
    # the four-way picks its drafters on prompts of their own: twice the prompts per category, half for the table
    per_category = 2 * n if len(quant_candidates) > 1 else n
    items, warnings = load_sweep_items(parse_csv(categories), per_category, seed, workload,
                                       engine.model.config.vocab_size)
    for w in warnings:
        console.print(f"[yellow]warning:[/] {w}")
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {"experiment": experiment, "categories": parse_csv(categories), "n": n, "max_tokens": max_tokens,
              "drafter": drafter, "gamma": gamma, "quant_drafters": [f"{d}:{g}" for d, g in quant_candidates], "gammas": static, "tree_budgets": budgets, "policies": names, "seed": seed,
              "workload_file": str(workload) if workload else None}
    if serving:
        config["serving"] = {"concurrencies": conc_levels, "rates": rate_levels, "contexts": context_levels,
                             "drafters": [f"{d}:{g}" for d, g in spec_settings], "max_tokens": serving_max_tokens,
                             "repeats": repeats, "context_concurrencies": parse_csv(context_concurrencies, int),
                             "context_sources": parse_csv(context_sources)}
    write_meta(run_dir, engine, config, warnings)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    common = dict(max_tokens=max_tokens, out_dir=run_dir, seed=seed, n_resamples=resamples, layers=layers,
                  draft_path=draft)
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("requests", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label[:40].ljust(40))

        if experiment in ("quant4", "all"):
            run_quantization(engine, items, candidates=quant_candidates, progress=progress, **common)
        if experiment in ("policies", "all"):
            run_policies(engine, items, drafter=drafter, static_gammas=static, policies=names, progress=progress,
                         tree_budgets=budgets, **common)
        if serving:
            run_serving(engine, items, drafters=spec_settings, concurrencies=conc_levels, rates=rate_levels,
                        context_lengths=context_levels, max_tokens=serving_max_tokens, out_dir=run_dir, seed=seed,
                        progress=progress, repeats=repeats, context_concurrencies=parse_csv(context_concurrencies, int),
                        context_sources=parse_csv(context_sources))
    with console.status("writing the report"):
        summary, html = build_report(run_dir, n_resamples=resamples, seed=seed)
    print_experiments(summary, console)
    console.print(f"report: {html}")
