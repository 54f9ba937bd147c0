"""``specledger sweep`` on the terminal: the options checked (:func:`check_sweep_options`), the target loaded,
the chosen experiments (:mod:`~specledger.bench.quantization`, :mod:`~specledger.bench.policies`,
:mod:`~specledger.bench.serving`) run under a progress bar into the run directory, its report written and
its tables printed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specledger.bench.sweep import (
    SweepConfigDict,
    load_sweep_items,
    parse_csv,
    parse_drafter_gammas,
    parse_quant_candidates,
    write_meta,
)
from specledger.command_options import TargetOptions
from specledger.engine.drafters.catalog import NGRAM, check_drafter
from specledger.errors import require

EXPERIMENTS = ("quant4", "policies", "serving", "all")


@dataclass
class SweepOptions(TargetOptions):
    """The options of ``specledger sweep`` as typed; see the verb's help for each."""

    experiment: str = "all"
    categories: str = "code-edit,dialogue"
    n: int = 2
    max_tokens: int = 96
    drafter: str = NGRAM.name
    gamma: int = 4
    quant_drafters: str = "ngram:2,ngram:4,suffix:2,suffix:4"
    gammas: str = "1,2,4,6,8"
    tree_budgets: str = "0"
    policies: str = "heuristic,ema,goodput"
    concurrencies: str = "1,2,4,8,16"
    rates: str = ""
    contexts: str = ""
    context_concurrencies: str = "4"
    context_sources: str = "xsum"
    serving_drafters: str = "ngram:4,suffix:4"
    serving_max_tokens: int = 48
    repeats: int = 3
    resamples: int = 1000

    @property
    def serving(self) -> bool:
        return self.experiment in ("serving", "all")


@dataclass
class _Parsed:
    """The list options parsed."""

    static: list[int]
    names: list[str]
    budgets: list[int]
    conc_levels: list[int]
    rate_levels: list[float]
    context_levels: list[int]
    spec_settings: list[tuple[str, Any]]
    quant_candidates: list[tuple[str, int]]


def check_sweep_options(opts: SweepOptions) -> _Parsed:
    """Every option parsed and checked before a model loads (one-line errors)."""
    from specledger.bench.policies import DYNAMIC
    from specledger.bench.serving import check_serving_settings

    require(opts.experiment in EXPERIMENTS,
            f"unknown --experiment {opts.experiment!r}; use one of {', '.join(EXPERIMENTS)}")
    check_drafter(opts.drafter)
    require(opts.max_tokens >= 1, "--max-tokens must be >= 1")
    static = parse_csv(opts.gammas, int)
    names = parse_csv(opts.policies)
    budgets = parse_csv(opts.tree_budgets, int)
    require(all(b >= 0 for b in budgets), "--tree-budgets must be integers >= 1 (0 = chain), e.g. 0,8,16")
    require(bool(static) and all(g >= 1 for g in static), "--gammas must be integers >= 1, e.g. 1,2,4,6,8")
    for p in names:
        require(p in DYNAMIC, f"unknown policy {p!r}; choose from {', '.join(DYNAMIC)}")
    parsed = _Parsed(static, names, budgets, parse_csv(opts.concurrencies, int), parse_csv(opts.rates, float),
                     parse_csv(opts.contexts, int), parse_drafter_gammas(opts.serving_drafters),
                     parse_quant_candidates(opts.quant_drafters) if opts.experiment in ("quant4", "all") else [])
    if opts.serving:
        check_serving_settings(parsed.spec_settings, parsed.conc_levels, parsed.rate_levels, opts.serving_max_tokens,
                               parse_csv(opts.context_concurrencies, int), parse_csv(opts.context_sources))
    return parsed


def sweep_config(opts: SweepOptions, parsed: _Parsed) -> SweepConfigDict:
    """run.json ``sweep``: what was asked."""
    config: SweepConfigDict = {
        "experiment": opts.experiment, "categories": parse_csv(opts.categories), "n": opts.n,
        "max_tokens": opts.max_tokens, "drafter": opts.drafter, "gamma": opts.gamma,
        "quant_drafters": [f"{d}:{g}" for d, g in parsed.quant_candidates], "gammas": parsed.static,
        "tree_budgets": parsed.budgets, "policies": parsed.names, "seed": opts.seed,
        "workload_file": str(opts.workload) if opts.workload else None}
    if opts.serving:
        config["serving"] = {"concurrencies": parsed.conc_levels, "rates": parsed.rate_levels,
                             "contexts": parsed.context_levels,
                             "drafters": [f"{d}:{g}" for d, g in parsed.spec_settings],
                             "max_tokens": opts.serving_max_tokens, "repeats": opts.repeats,
                             "context_concurrencies": parse_csv(opts.context_concurrencies, int),
                             "context_sources": parse_csv(opts.context_sources)}
    return config


def run_sweep(opts: SweepOptions, console: Any) -> Path:
    """The verb's measurements: checks, the target, the items, the experiments into the run directory (returned;
    the command builds the report from it)."""
    from specledger.bench.policies import run_policies
    from specledger.bench.progress import live_progress
    from specledger.bench.quantization import float_engine, prompts_per_category, run_quantization
    from specledger.bench.serving import run_serving
    from specledger.engine.build import build_engine, weights_line
    parsed = check_sweep_options(opts)
    run_dir = opts.out or Path("runs") / time.strftime("sweep-%Y%m%d-%H%M%S")
    console.print(f"[bold]specledger sweep[/] ({opts.experiment}) -> {run_dir}")
    with console.status("loading the target model"):
        engine = build_engine(opts.target, opts.dtype)
    console.print(weights_line(engine), highlight=False)
    per_category = prompts_per_category(opts.n, parsed.quant_candidates)
    items, warnings = load_sweep_items(parse_csv(opts.categories), per_category, opts.seed, opts.workload,
                                       engine.model.config.vocab_size)
    for w in warnings:
        console.print(f"[yellow]warning:[/] {w}")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_meta(run_dir, engine, sweep_config(opts, parsed), warnings)
    common = dict(max_tokens=opts.max_tokens, out_dir=run_dir, seed=opts.seed, n_resamples=opts.resamples,
                  layers=opts.layers, draft_path=opts.draft)
    with live_progress(console, 40) as progress:
        if opts.experiment in ("quant4", "all"):
            run_quantization(float_engine(engine), items, candidates=parsed.quant_candidates, progress=progress,
                             **common)
        if opts.experiment in ("policies", "all"):
            run_policies(engine, items, drafter=opts.drafter, static_gammas=parsed.static, policies=parsed.names,
                         progress=progress, tree_budgets=parsed.budgets, **common)
        if opts.serving:
            run_serving(engine, items, drafters=parsed.spec_settings, concurrencies=parsed.conc_levels,
                        rates=parsed.rate_levels, context_lengths=parsed.context_levels,
                        max_tokens=opts.serving_max_tokens, out_dir=run_dir, seed=opts.seed, progress=progress,
                        repeats=opts.repeats, context_concurrencies=parse_csv(opts.context_concurrencies, int),
                        context_sources=parse_csv(opts.context_sources))
    return run_dir
