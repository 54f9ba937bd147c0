"""``specledger sweep``: the side experiments -- quantization four-way and speculation-length
policies at concurrency 1, and serving (continuous batching under load and long context) --
written into a run directory (traces + JSON) with its report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from specledger.errors import SpecLedgerError, require

EXPERIMENTS = ("quant4", "policies", "serving", "all")


def _csv(text: str, cast: Any = str) -> list:
    try:
        return [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecLedgerError(f"cannot parse list {text!r}; give comma-separated values like 1,2,4") from None


def parse_drafter_gammas(text: str) -> list[tuple[str, int | str]]:
    """``"ngram:4,suffix:4,ngram:goodput"`` -> [("ngram", 4), ("suffix", 4), ("ngram", "goodput")]; a
    missing ``:γ`` means γ = 4; a policy name (heuristic, ema, batch, goodput) picks γ per request and step."""
    from specledger.engine.policy import POLICIES

    out: list[tuple[str, int | str]] = []
    for part in _csv(text):
        name, _, g = part.partition(":")
        g = g.strip()
        if g in POLICIES and g != "static":
            out.append((name.strip(), g))
            continue
        try:
            gamma = int(g) if g else 4
        except ValueError:
            raise SpecLedgerError(
                f"cannot parse {part!r}; write drafter:gamma or drafter:policy, e.g. ngram:4 or ngram:goodput"
            ) from None
        out.append((name.strip(), gamma))
    require(bool(out), "--serving-drafters is empty; give e.g. ngram:4,suffix:4")
    return out


def load_sweep_items(categories: list[str], n: int, seed: int, workload: Path | None, vocab_size: int
                     ) -> tuple[list, list[str]]:
    """Built-in categories (seeded sample of ``n`` each) or the user's JSONL: (items, warnings)."""
    from specledger.bench.runner import RunPlan, load_items

    plan = RunPlan(categories=categories, n_per_category=n, seed=seed,
                   workload_file=str(workload) if workload else None)
    require(n >= 1, "--n must be >= 1")
    return load_items(plan, vocab_size)


def write_meta(run_dir: Path, engine: Any, config: dict[str, Any], warnings: list[str]) -> None:
    """``run.json`` for a fresh sweep directory; an existing one (a main run's) is left untouched."""
    from specledger.bench.runner import machine_info
    from specledger.rundir import META_NAME, write_json_atomic

    path = run_dir / META_NAME
    if path.exists():
        return
    meta = {
        "name": run_dir.name,
        "kind": "sweep",
        "model": engine.name,
        "dtype": engine.dtype,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "weight_bytes": engine.model.weight_bytes() if hasattr(engine.model, "weight_bytes") else None,
        "sweep": config,
        "workload_warnings": warnings,
    }
    write_json_atomic(path, meta)


# ``specledger run --full`` runs the side experiments too, with these settings, into the same directory.
FULL_SIDE_EXPERIMENTS: dict[str, Any] = {
    "categories": ["code-edit", "dialogue"], "n": 4, "max_tokens": 96, "drafter": "ngram", "gamma": 4,
    "static_gammas": [1, 2, 4, 6, 8], "policies": ["heuristic", "ema", "batch", "goodput"],
    "concurrencies": [1, 2, 4, 8, 16, 32], "serving_drafters": "ngram:4,suffix:4,ngram:goodput",
    "serving_max_tokens": 48, "repeats": 3, "contexts": [1024, 4096], "context_to_limit": True,
    "context_concurrencies": [1, 4, 16], "context_sources": ["xsum", "agent", "padding"],
}


def run_side_experiments(engine: Any, run_dir: Path, seed: int, progress: Any, warn: Any,
                         settings: dict[str, Any] | None = None) -> list[str]:
    """Quantization four-way, γ policies and serving (concurrency, context up to the model's limit)
    into ``run_dir``; an experiment whose JSON is already there is skipped (``--resume``), one that
    an interrupted run left half-written is skipped with a warning. Returns the experiments run."""
    from specledger.bench.policies import POLICY_EXPERIMENT, run_policies
    from specledger.bench.quant4 import QUANT_EXPERIMENT, check_fresh, run_quantization
    from specledger.bench.serving import SERVING_EXPERIMENT, run_serving
    from specledger.rundir import POLICIES_JSON, QUANT_JSON, SERVING_JSON

    cfg = {**FULL_SIDE_EXPERIMENTS, **(settings or {})}
    items, warnings = load_sweep_items(cfg["categories"], cfg["n"], seed, None, engine.model.config.vocab_size)
    for w in warnings:
        warn(w)
    contexts = list(cfg["contexts"])
    if cfg.get("context_to_limit"):
        contexts.append(min(engine.max_context, engine.model.config.max_seq_len) - cfg["serving_max_tokens"] - 64)
    common = dict(max_tokens=cfg["max_tokens"], out_dir=run_dir, seed=seed, progress=progress)
    jobs = [
        (QUANT_EXPERIMENT, QUANT_JSON,
         lambda: run_quantization(engine, items, drafter=cfg["drafter"], gamma=cfg["gamma"], **common)),
        (POLICY_EXPERIMENT, POLICIES_JSON,
         lambda: run_policies(engine, items, drafter=cfg["drafter"], static_gammas=cfg["static_gammas"],
                              policies=cfg["policies"], **common)),
        (SERVING_EXPERIMENT, SERVING_JSON,
         lambda: run_serving(engine, items, drafters=parse_drafter_gammas(cfg["serving_drafters"]),
                             concurrencies=cfg["concurrencies"], context_lengths=sorted(set(contexts)),
                             max_tokens=cfg["serving_max_tokens"], out_dir=run_dir, seed=seed, progress=progress,
                             repeats=cfg["repeats"], context_concurrencies=cfg["context_concurrencies"],
                             context_sources=cfg["context_sources"])),
    ]
    ran = []
    for name, json_name, job in jobs:
        if (run_dir / json_name).exists():
            continue
        try:
            check_fresh(run_dir, name)
        except SpecLedgerError:
            warn(f"{run_dir} holds part of an interrupted {name!r} experiment; skipped it -- run "
                 f"`specledger sweep --experiment {name} --out NEW_DIR` to measure it again")
            continue
        job()
        ran.append(name)
    return ran


def sweep(
    experiment: Annotated[str, typer.Option(help="quant4 | policies | serving | all")] = "all",
    categories: Annotated[str, typer.Option(help="Comma-separated categories.")] = "code-edit,dialogue",
    n: Annotated[int, typer.Option("--n", help="Prompts per category.")] = 2,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 96,
    drafter: Annotated[str, typer.Option(help="Drafter for both experiments (ngram, suffix, layerskip, ...); "
                                              "quant-self is degenerate on an int8 target.")] = "ngram",
    gamma: Annotated[int, typer.Option(help="Static gamma of the four-way's speculative settings.")] = 4,
    gammas: Annotated[str, typer.Option(help="Static gammas to compare the policies with.")] = "1,2,4,6,8",
    policies: Annotated[str, typer.Option(help="Dynamic policies: heuristic, ema, batch, goodput.")]
    = "heuristic,ema,goodput",
    out: Annotated[Path | None, typer.Option(help="Run directory (default: runs/sweep-<timestamp>).")] = None,
    workload: Annotated[Path | None, typer.Option(help="Your own JSONL workload instead of the categories.")] = None,
    target: Annotated[str | None, typer.Option(help="GGUF file or HF model dir (default: bundled SmolLM2-135M).")]
    = None,
    dtype: Annotated[str, typer.Option(help="auto (= float32) | float32 | bfloat16")] = "auto",
    layers: Annotated[str | None, typer.Option(help="layerskip layers (default: calibrate).")] = None,
    draft: Annotated[str | None, typer.Option(help="Draft model path for the 'model' drafter.")] = None,
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
    from specledger.bench.quant4 import run_quantization
    from specledger.bench.serving import run_serving
    from specledger.engine.cli import build_engine
    from specledger.engine.drafters.registry import DRAFTERS
    from specledger.report.build import build_report
    from specledger.report.cli import print_experiments

    require(experiment in EXPERIMENTS, f"unknown --experiment {experiment!r}; use one of {', '.join(EXPERIMENTS)}")
    require(drafter in DRAFTERS and drafter != "none",
            f"unknown drafter {drafter!r}; choose from {', '.join(DRAFTERS[1:])}")
    require(max_tokens >= 1, "--max-tokens must be >= 1")
    static = _csv(gammas, int)
    names = _csv(policies)
    require(bool(static) and all(g >= 1 for g in static), "--gammas must be integers >= 1, e.g. 1,2,4,6,8")
    for p in names:
        require(p in DYNAMIC, f"unknown policy {p!r}; choose from {', '.join(DYNAMIC)}")
    serving = experiment in ("serving", "all")
    conc_levels, rate_levels, context_levels = _csv(concurrencies, int), _csv(rates, float), _csv(contexts, int)
    spec_settings = parse_drafter_gammas(serving_drafters)
    if serving:
        require(bool(conc_levels) and all(c >= 1 for c in conc_levels),
                "--concurrencies must be integers >= 1, e.g. 1,2,4,8,16")
        require(all(r > 0 for r in rate_levels), "--rates must be positive req/s, e.g. 2,8")
        for name, g in spec_settings:
            require(name in DRAFTERS and name != "none",
                    f"unknown drafter {name!r} in --serving-drafters; choose from {', '.join(DRAFTERS[1:])}")
            require(isinstance(g, str) or g >= 1, f"gamma of {name} must be >= 1 or a policy name, e.g. {name}:4")
    console = Console()
    run_dir = out or Path("runs") / time.strftime("sweep-%Y%m%d-%H%M%S")
    console.print(f"[bold]specledger sweep[/] ({experiment}) -> {run_dir}")
    with console.status("loading the target model"):
        engine = build_engine(target, dtype)
    items, warnings = load_sweep_items(_csv(categories), n, seed, workload, engine.model.config.vocab_size)
    for w in warnings:
        console.print(f"[yellow]warning:[/] {w}")
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {"experiment": experiment, "categories": _csv(categories), "n": n, "max_tokens": max_tokens,
              "drafter": drafter, "gamma": gamma, "gammas": static, "policies": names, "seed": seed,
              "workload_file": str(workload) if workload else None}
    if serving:
        config["serving"] = {"concurrencies": conc_levels, "rates": rate_levels, "contexts": context_levels,
                             "drafters": [f"{d}:{g}" for d, g in spec_settings], "max_tokens": serving_max_tokens,
                             "repeats": repeats, "context_concurrencies": _csv(context_concurrencies, int),
                             "context_sources": _csv(context_sources)}
    write_meta(run_dir, engine, config, warnings)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    common = dict(max_tokens=max_tokens, out_dir=run_dir, seed=seed, n_resamples=resamples, layers=layers,
                  draft_path=draft)
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("requests", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label[:40].ljust(40))

        if experiment in ("quant4", "all"):
            run_quantization(engine, items, drafter=drafter, gamma=gamma, progress=progress, **common)
        if experiment in ("policies", "all"):
            run_policies(engine, items, drafter=drafter, static_gammas=static, policies=names, progress=progress,
                         **common)
        if serving:
            run_serving(engine, items, drafters=spec_settings, concurrencies=conc_levels, rates=rate_levels,
                        context_lengths=context_levels, max_tokens=serving_max_tokens, out_dir=run_dir, seed=seed,
                        progress=progress, repeats=repeats, context_concurrencies=_csv(context_concurrencies, int),
                        context_sources=_csv(context_sources))
    with console.status("writing the report"):
        summary, html = build_report(run_dir, n_resamples=resamples, seed=seed)
    print_experiments(summary, console)
    console.print(f"report: {html}")
