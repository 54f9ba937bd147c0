"""``specledger simulate``: parse the options, call :func:`specledger.simulate.run_command.run_simulate`, print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from specledger.engine.drafters.catalog import NGRAM


def simulate(
    from_: Annotated[Path, typer.Option("--from", help="Run directory whose traces give acceptance chains and "
                                                       "request sizes (a serving sweep, `run`, ...).")],
    drafter: Annotated[str, typer.Option(help="Drafter whose measured chains to use.")] = NGRAM.name,
    gamma: Annotated[str, typer.Option(help="Static gamma(s) and/or policies: 4 | 1,2,4,goodput "
                                            "(plain decoding is always simulated beside them).")] = "4",
    concurrency: Annotated[str, typer.Option(help="Closed-loop concurrency levels, e.g. 1,4,16: clients in "
                                                  "total, shared by the replicas (vllm bench serve's "
                                                  "--max-concurrency).")] = "",
    rate: Annotated[str, typer.Option(help="Poisson request rates in req/s, e.g. 2,8 (instead of --concurrency).")]
    = "",
    replay: Annotated[Path | None, typer.Option(help="Replay send times: a probe run directory or a JSON list of "
                                                     "offsets (s).")] = None,
    profile: Annotated[Path | None, typer.Option(help="Cost profile JSON (`specledger calibrate --out`).")] = None,
    hardware: Annotated[str | None, typer.Option(help="Roofline on a100 | h100 | h200 | l4 | cpu (needs "
                                                      "--model-config).")] = None,
    model_config: Annotated[Path | None, typer.Option(help="Model config JSON for the roofline.")] = None,
    draft_model_config: Annotated[Path | None, typer.Option(help="Roofline: the draft model's config JSON (prices "
                                                                 "--drafter model; its weights and KV share the "
                                                                 "memory).")] = None,
    eff_memory: Annotated[float, typer.Option(help="Roofline: assumed fraction of peak bandwidth.")] = 0.7,
    eff_compute: Annotated[float, typer.Option(help="Roofline: assumed fraction of peak FLOP/s.")] = 0.5,
    roofline_terms: Annotated[str, typer.Option(help="Roofline: bound (the pure roofline) | graphs (+ a CUDA-graph "
                                                     "engine's overheads) | eager (+ PyTorch eager's).")] = "graphs",
    requests: Annotated[int, typer.Option(help="Requests per point.")] = 1000,
    replicas: Annotated[int, typer.Option(help="Replicas behind the router.")] = 1,
    router: Annotated[str, typer.Option(help="round_robin | least_outstanding")] = "least_outstanding",
    max_num_seqs: Annotated[int | None, typer.Option(help="Sequences per replica (default: the concurrency, "
                                                          "256 for rates).")] = None,
    max_batched_tokens: Annotated[int | None, typer.Option(help="Rows per step (gamma + 1 per request).")] = None,
    kv_budget: Annotated[int | None, typer.Option(help="KV tokens per replica (default: unlimited; roofline: "
                                                       "what fits in memory).")] = None,
    block_size: Annotated[int, typer.Option(help="KV block size in tokens.")] = 1,
    chunked_prefill: Annotated[bool, typer.Option(help="vLLM v1 chunked prefill.")] = False,
    reserve_gamma: Annotated[bool, typer.Option(help="Reserve KV for every gamma asked (vLLM lookahead slots), "
                                                     "not only for the candidates proposed.")] = False,
    context: Annotated[int | None, typer.Option(help="Override every prompt's length (tokens).")] = None,
    contexts: Annotated[str, typer.Option(help="Crossover map over these context lengths x the concurrencies.")]
    = "",
    acceptance: Annotated[str, typer.Option(help="spread (per-request chains) | mean (pooled chain) | "
                                                 "deterministic (E[K] every round, no variance)")] = "spread",
    chains: Annotated[str, typer.Option(help="per-gamma (a gamma the run measured uses the rounds measured at "
                                             "it) | pooled (every static gamma's rounds for every setting)")]
    = "per-gamma",
    slo_ttft_p99_ms: Annotated[float | None, typer.Option(help="Capacity plan SLO: P99 TTFT (ms).")] = None,
    slo_tpot_p50_ms: Annotated[float | None, typer.Option(help="Capacity plan SLO: P50 TPOT (ms).")] = None,
    tree_budget: Annotated[int | None, typer.Option(help="Token trees of N nodes per round for every static gamma "
                                                         "(rows N + 1, depth <= gamma; acceptance measured or from "
                                                         "the DP, see specledger.simulate.tree_setting).")] = None,
    seed: Annotated[int, typer.Option(help="Sampling and arrival seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the points as JSON.")] = False,
    out: Annotated[Path | None, typer.Option(help="Write simulate.json (and the report section) here.")] = None,
) -> None:
    """Simulate serving with speculation at loads, contexts and scales this machine cannot reach."""
    from specledger.simulate.run_command import SimulateOptions, run_simulate

    result = run_simulate(SimulateOptions(
        from_=from_, drafter=drafter, gamma=gamma, concurrency=concurrency, rate=rate, replay=replay,
        profile=profile, hardware=hardware, model_config=model_config,
        draft_model_config=draft_model_config, eff_memory=eff_memory, eff_compute=eff_compute,
        roofline_terms=roofline_terms, requests=requests, replicas=replicas, router=router,
        max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens, kv_budget=kv_budget,
        block_size=block_size, chunked_prefill=chunked_prefill, reserve_gamma=reserve_gamma,
        context=context, contexts=contexts, acceptance=acceptance, chains=chains,
        slo_ttft_p99_ms=slo_ttft_p99_ms, slo_tpot_p50_ms=slo_tpot_p50_ms, tree_budget=tree_budget,
        seed=seed, out=out))
    if as_json:
        print(json.dumps(result.doc["points"], indent=1, default=str))
        return
    _print(result.doc, result.tree_notes, result.written)


def _print(doc: dict[str, Any], tree_notes: list[str], written: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]specledger simulate[/] from {doc['from']} -- cost: {doc['cost_source']}")
    for line in tree_notes:  # where a tree setting's acceptance and costs came from
        console.print(line)
    tab = Table("load", "setting", "tok/s", "speed-up", "verify x", "break-even x", "TPOT P50 ms", "TTFT P50 ms",
                "ITL P99 ms", "stall ms", "preempt")
    for p in doc["points"]:
        load = next(f"{k}={p[k]}" for k in ("concurrency", "rate", "replay") if k in p)
        tab.add_row(load, p["setting"], f"{p['throughput_tok_s']:.1f}", f"{p['speedup']:.3f}",
                    _f(p["verify_ratio"], 2), _f(p["break_even_verify_premium"], 2), _f(p["tpot_p50_ms"]),
                    _f(p["ttft_p50_ms"]), _f(p["itl_p99_ms"]), _f(p["longest_stall_ms"]), str(p["preemptions"]))
    console.print(tab)
    console.print("verify x: the verify step's cost over the same step without candidates, as priced here; "
                  "break-even x: the value at which the speed-up would be 1.0 (hold it against your engine's "
                  "measured T(γ+1 rows) / T(1 row)).")
    for row in doc.get("capacity_plan", []):
        console.print(f"rate {row['rate']:g}/s {row['setting']}: {row['replicas'] or '> 256'} replicas "
                      f"({row['slo']})")
    for cell in doc.get("crossover_map", []):
        console.print(f"context {cell['context']} c={cell['concurrency']}: best {cell['best']}")
    console.print(f"simulated in {doc['simulated_s']:.1f} s" + (f"; wrote {written}" if written else ""))


def _f(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


__all__ = ["simulate"]
