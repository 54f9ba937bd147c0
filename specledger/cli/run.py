"""``specledger run``: the main job -- sweep, trace, analyse, report, verdict. Options here; the job in
:mod:`specledger.mainjob` (the plan from the options: :mod:`~specledger.mainjob.options`, the terminal:
:mod:`~specledger.cli.run_flow`, the job: :mod:`~specledger.mainjob.job`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specledger.cli.run_flow import run_main_job
from specledger.engine.drafters.catalog import HEAD, MODEL, choices_help
from specledger.mainjob.options import RunOptions


def run(
    quick: Annotated[bool, typer.Option("--quick", help="About 2 minutes: 3 categories, 2 prompts each, gamma "
                                        "4, loads 1 and 16 (64 simulated).")] = False,
    full: Annotated[bool, typer.Option("--full", help="Hours: 8 prompts per category, gamma 1-8, T 0 and 0.8, "
                                                       "then the sweep's quant4, policies and serving "
                                                       "experiments.")] = False,
    out: Annotated[Path | None, typer.Option(help="Run directory (default: runs/<timestamp>).")] = None,
    resume: Annotated[Path | None, typer.Option(help="Continue an interrupted run in this directory.")] = None,
    categories: Annotated[str | None, typer.Option(
        help="Comma-separated categories: code, code-edit, extraction, agent, dialogue, summary, math, random, and "
             "long (long documents, decided per context bucket; not in the default).")] = None,
    drafters: Annotated[str | None, typer.Option(help="Comma-separated drafters "
                                                      f"({choices_help(',', plain=False)}).")] = None,
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
    workload: Annotated[Path | None, typer.Option(help="Your own JSONL workload instead of the built-in "
                                                       "categories.")] = None,
    target: Annotated[str | None, typer.Option(help="GGUF file or HF model dir (default: bundled "
                                                    "SmolLM2-135M).")] = None,
    dtype: Annotated[str, typer.Option(help="auto (CPU: a GGUF target's own quantized blocks, as gguf: what a CPU user "
                                            "deploys; GPU: bfloat16) | float32 | bfloat16 | gguf | q8_0 | q4_0 | "
                                            "q4_1 (every linear quantized so) | int8")] = "auto",
    device: Annotated[str, typer.Option(help="cpu, or cuda[:N] on a machine with an NVIDIA GPU (dtype auto = "
                                             "bfloat16 there).")] = "cpu",
    layers: Annotated[str | None, typer.Option(help="layerskip layers (default: calibrate).")] = None,
    draft: Annotated[str | None, typer.Option(help=f"Draft model path for the {MODEL.name!r} drafter; a "
                                                   f".safetensors head file for {HEAD.name!r}.")] = None,
    loads: Annotated[str | None, typer.Option(help="Concurrencies, e.g. 1,4,16: every setting also runs under "
                                                   "continuous batching at each load > 1; a range 1..16 measures "
                                                   "both ends, then bisects in powers of two where the decision "
                                                   "changes until it is bracketed within 2x, within the budget "
                                                   "(default: 1..16; each extra load ~2-3 min).")] = None,
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
    mix: Annotated[str | None, typer.Option(help="The traffic's mix for the one recommendation over all "
                                                 "categories, e.g. code=0.5,agent=0.5 (default: each category's "
                                                 "share of the workload's requests), as `probe --mix`.")] = None,
) -> None:
    """Run plain decoding and every drafter over real workloads; write traces, report.html, summary.json and
    the verdict."""
    run_main_job(RunOptions(
        quick=quick, full=full, out=out, resume=resume, categories=categories, drafters=drafters, gammas=gammas,
        tree_budgets=tree_budgets, tree_shape=tree_shape, temperatures=temperatures, n=n, max_tokens=max_tokens,
        workload=workload, target=target, dtype=dtype, device=device, layers=layers, draft=draft, loads=loads,
        simulate_loads=simulate_loads, slo=slo, seed=seed, budget=budget, verbose=verbose, sequential=sequential,
        mix=mix))
