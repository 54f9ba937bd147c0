"""``specledger sweep``: the side experiments -- quantization four-way and speculation-length
policies at concurrency 1, and serving (continuous batching under load and long context) --
written into a run directory (traces + JSON) with its report. Flags here; the verb in
:mod:`specledger.bench.sweep_run`, the experiments in :mod:`specledger.bench.sweep`,
:mod:`~specledger.bench.quantization`, :mod:`~specledger.bench.policies` and :mod:`~specledger.bench.serving`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specledger.bench.sweep_run import SweepOptions, run_sweep
from specledger.engine.choices import DTYPE_HELP
from specledger.engine.drafters.catalog import HEAD, MODEL, NGRAM, QUANT_SELF, drafter_names


def sweep(
    experiment: Annotated[str, typer.Option(help="quant4 | policies | serving | all")] = "all",
    categories: Annotated[str, typer.Option(help="Comma-separated categories.")] = "code-edit,dialogue",
    n: Annotated[int, typer.Option("--n", help="Prompts per category.")] = 2,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 96,
    drafter: Annotated[str, typer.Option(help=f"Drafter for both experiments ({', '.join(drafter_names()[:3])}, "
                                              f"...); {QUANT_SELF.name} is degenerate on an int8 target.")]
    = NGRAM.name,
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
    draft: Annotated[str | None, typer.Option(help=f"Draft model path for the {MODEL.name!r} drafter; a "
                                                   f".safetensors head file for {HEAD.name!r}.")] = None,
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

    from specledger.report.build import build_report
    from specledger.report.console_experiments import print_experiments

    console = Console()
    run_dir = run_sweep(SweepOptions(
        experiment=experiment, categories=categories, n=n, max_tokens=max_tokens, drafter=drafter, gamma=gamma,
        quant_drafters=quant_drafters, gammas=gammas, tree_budgets=tree_budgets, policies=policies, out=out,
        workload=workload, target=target, dtype=dtype, layers=layers, draft=draft, concurrencies=concurrencies,
        rates=rates, contexts=contexts, context_concurrencies=context_concurrencies,
        context_sources=context_sources, serving_drafters=serving_drafters,
        serving_max_tokens=serving_max_tokens, repeats=repeats, seed=seed, resamples=resamples), console)
    with console.status("writing the report"):
        summary, html = build_report(run_dir, n_resamples=resamples, seed=seed)
    print_experiments(summary, console)
    console.print(f"report: {html}")
