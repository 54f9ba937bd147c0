"""``specledger simulate``: parse flags, build the inputs, call the simulator, print / write the points."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from specledger.errors import SpecLedgerError, require
from specledger.rundir import SIMULATE_JSON


def _csv(text: str, cast: Any, flag: str, example: str) -> list:
    try:
        out = [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecLedgerError(f"{flag} must be a comma-separated list, e.g. {example}; got {text!r}") from None
    return out


def _gammas(text: str) -> list[int | str]:
    from specledger.engine.policy import parse_gamma_spec

    out = [parse_gamma_spec(x, "--gamma") for x in (t.strip() for t in text.split(",") if t.strip())]
    require(bool(out), "--gamma is empty; give e.g. 4 or 1,2,4,goodput")
    return out


def resolve_cost(run: Any, profile: Path | None, hardware: str | None, model_config: Path | None,
                 eff_memory: float, eff_compute: float, draft_model_config: Path | None = None,
                 roofline_terms: str = "graphs") -> Any:
    """--profile FILE, or --hardware with --model-config [--draft-model-config] (roofline), or the run's own costs."""
    from specledger.predict.pricers import load_pricer
    from specledger.simulate.profile import fit_serving_cost

    require(not (profile and hardware), "give either --profile or --hardware, not both")
    require(draft_model_config is None or hardware is not None,
            "--draft-model-config prices a draft model on a roofline; give --hardware and --model-config too")
    if profile is not None:
        return load_pricer(profile)
    if hardware is not None:
        from specledger.cost.roofline import hardware as hw_lookup
        from specledger.cost.roofline import load_model_config, roofline

        hw_lookup(hardware)
        require(model_config is not None, "--hardware needs --model-config FILE (params, layers, heads, kv_heads, "
                "head_dim, dtype; a Hugging Face config.json works)")
        draft = load_model_config(draft_model_config) if draft_model_config is not None else None
        return roofline(hardware, load_model_config(model_config), eff_memory, eff_compute,  # type: ignore[arg-type]
                        draft_model=draft, terms=roofline_terms)
    if (run.path / "cost_model.json").is_file():
        return load_pricer(run.path / "cost_model.json")
    serving = run.serving_records()
    if serving:
        return fit_serving_cost(serving, source=f"fitted from the batched steps of {run.path}")
    from specledger.predict.costmodel import fit_cost_model

    return fit_cost_model(run.records, source=f"fitted from the solo rounds of {run.path} (batched steps "
                          "extrapolated; calibrate a profile for better batched costs)")


def simulate(
    from_: Annotated[Path, typer.Option("--from", help="Run directory whose traces give acceptance chains and "
                                                       "request sizes (a serving sweep, `run`, ...).")],
    drafter: Annotated[str, typer.Option(help="Drafter whose measured chains to use.")] = "ngram",
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
    from rich.console import Console
    from rich.table import Table

    from specledger.simulate.arrivals import closed_loop, poisson, replay_file
    from specledger.simulate.cluster import SLO, capacity_plan, crossover_map
    from specledger.simulate.cluster import router as make_router
    from specledger.simulate.measured_run import RunSource, tables_per_gamma
    from specledger.simulate.simulator import break_even_verify_premium
    from specledger.simulate.simulator import simulate as run_sim
    from specledger.simulate.state import ServerConfig

    concs = _csv(concurrency, int, "--concurrency", "1,4,16")
    rates = _csv(rate, float, "--rate", "2,8")
    require(sum(bool(x) for x in (concs, rates, replay)) == 1,
            "give exactly one of --concurrency (e.g. 1,4,16), --rate (e.g. 2,8) or --replay")
    require(all(c >= 1 for c in concs), "--concurrency levels must be integers >= 1, e.g. 1,4,16")
    require(all(r > 0 and math.isfinite(r) for r in rates), "--rate must be positive requests per second, e.g. 2,8")
    require(requests >= 1, "--requests must be >= 1")
    require(replicas >= 1, "--replicas must be >= 1")
    require(block_size >= 1, "--block-size must be >= 1")
    require(acceptance in ("spread", "mean", "deterministic"), "--acceptance must be spread, mean or deterministic")
    require(chains in ("per-gamma", "pooled"), "--chains must be per-gamma or pooled")
    require(context is None or context >= 1, "--context must be >= 1 tokens")
    slo = SLO(slo_ttft_p99_ms, slo_tpot_p50_ms)
    planning = slo.ttft_p99_ms is not None or slo.tpot_p50_ms is not None
    require(not planning or bool(rates), "a capacity plan (--slo-*) needs --rate (the request rates to plan for)")
    gammas = _gammas(gamma)
    make_router(router)
    ctx_list = _csv(contexts, int, "--contexts", "512,2048,8192")
    require(not ctx_list or bool(concs), "a crossover map (--contexts) needs --concurrency levels")
    run = RunSource.open(from_)
    if hardware is not None:
        from specledger.cost.roofline import overheads

        overheads(roofline_terms)
    cost = resolve_cost(run, profile, hardware, model_config, eff_memory, eff_compute, draft_model_config,
                        roofline_terms)
    settings: list[int | str] = [0] + [g for g in gammas if g != 0]
    max_g = max([16, *[g for g in gammas if isinstance(g, int)]])
    tables = {g: t for g, (t, _) in tables_per_gamma(run.records, drafter, settings, max_g, chains).items()}
    table = tables[0]  # plain's table is the pooled one: the capacity plan and crossover map use it
    trees: dict = {}
    if tree_budget is not None:  # each static γ becomes a tree of N nodes at depth <= γ (simulate.tree_setting)
        from specledger.simulate.tree_setting import tree_runs

        require(not planning and not ctx_list, "--tree-budget simulates load points only; drop --slo-* / --contexts")
        trees = tree_runs(run.records, drafter, tree_budget, settings, tables, cost)
        tables.update({g: t for g, (t, _, _) in trees.items()})

    def shape(t: Any) -> Any:
        if acceptance != "spread":
            t = t.mean_only(deterministic=acceptance == "deterministic")
        if context is not None:
            from specledger.simulate.cluster import with_context

            t = with_context(t, context)
        return t

    table, tables = shape(table), {g: shape(t) for g, t in tables.items()}
    if kv_budget is None and hasattr(cost, "kv_budget_tokens"):
        kv_budget = cost.kv_budget_tokens()

    loads: list[tuple[str, Any, Any]] = [("concurrency", c, closed_loop(c)) for c in concs]
    loads += [("rate", r, poisson(r, requests, seed)) for r in rates]
    if replay is not None:
        arr = replay_file(replay)
        loads.append(("replay", arr.label, arr))
    points: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for kind, load, arr in loads:
        n = requests if arr.closed else min(requests, arr.times.shape[0])
        seqs = max_num_seqs or (int(load) if kind == "concurrency" else 256)
        cfg = ServerConfig(seqs, max_batched_tokens, kv_budget, block_size, chunked_prefill, reserve_gamma)
        for g in settings:
            asked, priced = (trees[g][1], trees[g][2]) if g in trees else (g, cost)
            m = run_sim(tables[g], arr, n, priced, asked, drafter, cfg, replicas, make_router(router), seed=seed).metrics()
            label = "plain" if g == 0 else f"{drafter} γ={g}" + (f" tree={tree_budget}" if g in trees else "")
            points.append({kind: load, "setting": label, "gamma": g, "tree_budget": tree_budget if g in trees else 0,
                           **m})
    base = {(p.get("concurrency"), p.get("rate"), p.get("replay")): p for p in points if p["gamma"] == 0}
    for p in points:
        b = base[(p.get("concurrency"), p.get("rate"), p.get("replay"))]
        p["speedup"] = p["throughput_tok_s"] / b["throughput_tok_s"] if b["throughput_tok_s"] else None
        p["break_even_verify_premium"] = break_even_verify_premium(p["speedup"], p)
    elapsed = time.perf_counter() - t0

    doc: dict[str, Any] = {
        "experiment": "simulate", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from": str(run.path),
        "drafter": drafter, "settings": [str(g) for g in settings], "cost_source": cost.source,
        "acceptance": acceptance, "chains": chains, "acceptance_assumption": table.assumption,
        "acceptance_per_setting": {str(g): tables[g].assumption for g in settings if g != 0}, "requests": requests,
        "tree_budget": tree_budget or 0, "cost_per_setting": {str(g): trees[g][2].source for g in trees},
        "replicas": replicas, "router": router,
        "server": {"max_num_seqs": max_num_seqs, "max_batched_tokens": max_batched_tokens, "kv_budget_tokens": kv_budget,
                   "block_size": block_size, "chunked_prefill": chunked_prefill, "reserve_gamma": reserve_gamma},
        "points": points, "simulated_s": elapsed,
    }
    if planning:
        cfg = ServerConfig(max_num_seqs or 256, max_batched_tokens, kv_budget, block_size, chunked_prefill,
                           reserve_gamma)
        doc["capacity_plan"] = capacity_plan(table, rates, slo, cost, settings, cfg, n_requests=requests,
                                             route=router, seed=seed)
    if ctx_list:
        cfg = ServerConfig(max_num_seqs or 1, max_batched_tokens, kv_budget, block_size, chunked_prefill,
                           reserve_gamma)
        doc["crossover_map"] = crossover_map(table, concs, ctx_list, cost, settings, cfg,
                                             n_requests=min(requests, 400), seed=seed)
    if out is not None:
        from specledger.rundir import RunDir

        out.mkdir(parents=True, exist_ok=True)
        RunDir(out).write(SIMULATE_JSON, doc)
    if as_json:
        print(json.dumps(points, indent=1, default=str))
        return
    console = Console()
    console.print(f"[bold]specledger simulate[/] from {run.path} -- cost: {cost.source}")
    for g in trees:  # where a tree setting's acceptance and costs came from
        console.print(f"γ={g} tree={tree_budget}: acceptance {tables[g].assumption}; cost {trees[g][2].note}")
    tab = Table("load", "setting", "tok/s", "speed-up", "verify x", "break-even x", "TPOT P50 ms", "TTFT P50 ms",
                "ITL P99 ms", "stall ms", "preempt")
    for p in points:
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
    console.print(f"simulated in {elapsed:.1f} s" + (f"; wrote {out / SIMULATE_JSON}" if out else ""))


def _f(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"
