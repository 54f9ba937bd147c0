"""What ``specledger simulate`` does (:mod:`specledger.cli.simulate` parses and prints): check the options,
build the inputs (the run's chains, the cost), simulate every load point and setting, plan capacity and map
the crossover when asked, and write ``simulate.json``."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specledger.command_options import CommandOptions
from specledger.engine.drafters.catalog import NGRAM
from specledger.errors import SpecLedgerError, require
from specledger.records import GammaSpec, setting_label
from specledger.rundir import SIMULATE_JSON, RunDir
from specledger.simulate.arrivals import closed_loop, poisson, replay_file
from specledger.simulate.cluster import SLO, capacity_plan, crossover_map, with_context
from specledger.simulate.cluster import router as make_router
from specledger.simulate.measured_run import RunSource, tables_per_gamma
from specledger.simulate.results import SimPointDict, SimulateDocDict
from specledger.simulate.simulator import break_even_verify_premium, simulate
from specledger.simulate.state import ServerConfig


@dataclass
class SimulateOptions(CommandOptions):
    """The options of ``specledger simulate`` (their help is the command's)."""

    from_: Path
    drafter: str = NGRAM.name
    gamma: str = "4"
    concurrency: str = ""
    rate: str = ""
    replay: Path | None = None
    profile: Path | None = None
    hardware: str | None = None
    model_config: Path | None = None
    draft_model_config: Path | None = None
    eff_memory: float = 0.7
    eff_compute: float = 0.5
    roofline_terms: str = "graphs"
    requests: int = 1000
    replicas: int = 1
    router: str = "least_outstanding"
    max_num_seqs: int | None = None
    max_batched_tokens: int | None = None
    kv_budget: int | None = None
    block_size: int = 1
    chunked_prefill: bool = False
    reserve_gamma: bool = False
    context: int | None = None
    contexts: str = ""
    acceptance: str = "spread"
    chains: str = "per-gamma"
    slo_ttft_p99_ms: float | None = None
    slo_tpot_p50_ms: float | None = None
    tree_budget: int | None = None


@dataclass
class SimulateResult:
    """``simulate.json``'s document, one note per tree setting (where its acceptance and cost came from), and
    the file written (None without ``out``)."""

    doc: SimulateDocDict
    tree_notes: list[str] = field(default_factory=list)
    written: Path | None = None


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
    from specledger.cost.loader import load_pricer
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
    from specledger.cost.costmodel import fit_cost_model

    return fit_cost_model(run.records, source=f"fitted from the solo rounds of {run.path} (batched steps "
                          "extrapolated; calibrate a profile for better batched costs)")


@dataclass
class _Parsed:
    concs: list[int]
    rates: list[float]
    gammas: list[GammaSpec]
    ctx_list: list[int]
    slo: SLO

    @property
    def planning(self) -> bool:
        return self.slo.ttft_p99_ms is not None or self.slo.tpot_p50_ms is not None


def _parse(o: SimulateOptions) -> _Parsed:
    """The options checked, lists parsed; a one-line error naming the fix otherwise."""
    concs = _csv(o.concurrency, int, "--concurrency", "1,4,16")
    rates = _csv(o.rate, float, "--rate", "2,8")
    require(sum(bool(x) for x in (concs, rates, o.replay)) == 1,
            "give exactly one of --concurrency (e.g. 1,4,16), --rate (e.g. 2,8) or --replay")
    require(all(c >= 1 for c in concs), "--concurrency levels must be integers >= 1, e.g. 1,4,16")
    require(all(r > 0 and math.isfinite(r) for r in rates), "--rate must be positive requests per second, e.g. 2,8")
    require(o.requests >= 1, "--requests must be >= 1")
    require(o.replicas >= 1, "--replicas must be >= 1")
    require(o.block_size >= 1, "--block-size must be >= 1")
    require(o.acceptance in ("spread", "mean", "deterministic"), "--acceptance must be spread, mean or deterministic")
    require(o.chains in ("per-gamma", "pooled"), "--chains must be per-gamma or pooled")
    require(o.context is None or o.context >= 1, "--context must be >= 1 tokens")
    p = _Parsed(concs, rates, [], [], SLO(o.slo_ttft_p99_ms, o.slo_tpot_p50_ms))
    require(not p.planning or bool(rates), "a capacity plan (--slo-*) needs --rate (the request rates to plan for)")
    p.gammas = _gammas(o.gamma)
    make_router(o.router)
    p.ctx_list = _csv(o.contexts, int, "--contexts", "512,2048,8192")
    require(not p.ctx_list or bool(concs), "a crossover map (--contexts) needs --concurrency levels")
    return p


@dataclass
class _Inputs:
    run: Any
    cost: Any
    settings: list[int | str]
    table: Any  # plain's (pooled) table: the capacity plan and crossover map use it
    tables: dict[int | str, Any]
    trees: dict[int | str, tuple]  # static γ -> (table, asked, priced) of its tree setting


def _inputs(o: SimulateOptions, p: _Parsed) -> _Inputs:
    """The run's chains per setting (shaped by --acceptance / --context), tree settings, and the cost."""
    run = RunSource.open(o.from_)
    if o.hardware is not None:
        from specledger.cost.roofline import overheads

        overheads(o.roofline_terms)
    cost = resolve_cost(run, o.profile, o.hardware, o.model_config, o.eff_memory, o.eff_compute,
                        o.draft_model_config, o.roofline_terms)
    settings: list[int | str] = [0] + [g for g in p.gammas if g != 0]
    max_g = max([16, *[g for g in p.gammas if isinstance(g, int)]])
    tables = {g: t for g, (t, _) in tables_per_gamma(run.records, o.drafter, settings, max_g, o.chains).items()}
    trees: dict = {}
    if o.tree_budget is not None:  # each static γ becomes a tree of N nodes at depth <= γ (simulate.tree_setting)
        from specledger.simulate.tree_setting import tree_runs

        require(not p.planning and not p.ctx_list,
                "--tree-budget simulates load points only; drop --slo-* / --contexts")
        trees = tree_runs(run.records, o.drafter, o.tree_budget, settings, tables, cost)
        tables.update({g: t for g, (t, _, _) in trees.items()})

    def shape(t: Any) -> Any:
        if o.acceptance != "spread":
            t = t.mean_only(deterministic=o.acceptance == "deterministic")
        return with_context(t, o.context) if o.context is not None else t

    tables = {g: shape(t) for g, t in tables.items()}
    return _Inputs(run, cost, settings, tables[0], tables, trees)


def _server(o: SimulateOptions, seqs: int, kv_budget: int | None) -> ServerConfig:
    return ServerConfig(seqs, o.max_batched_tokens, kv_budget, o.block_size, o.chunked_prefill, o.reserve_gamma)


def _points(o: SimulateOptions, p: _Parsed, x: _Inputs, kv_budget: int | None) -> list[SimPointDict]:
    """Every setting at every load, with its speed-up over plain's at that load and its break-even premium."""
    loads: list[tuple[str, Any, Any]] = [("concurrency", c, closed_loop(c)) for c in p.concs]
    loads += [("rate", r, poisson(r, o.requests, o.seed)) for r in p.rates]
    if o.replay is not None:
        arr = replay_file(o.replay)
        loads.append(("replay", arr.label, arr))
    points: list[SimPointDict] = []
    for kind, load, arr in loads:
        n = o.requests if arr.closed else min(o.requests, arr.times.shape[0])
        cfg = _server(o, o.max_num_seqs or (int(load) if kind == "concurrency" else 256), kv_budget)
        for g in x.settings:
            asked, priced = (x.trees[g][1], x.trees[g][2]) if g in x.trees else (g, x.cost)
            m = simulate(x.tables[g], arr, n, priced, asked, o.drafter, cfg, o.replicas, make_router(o.router),
                         seed=o.seed).metrics()
            tree = o.tree_budget if g in x.trees else 0
            points.append({kind: load, "setting": setting_label(o.drafter, g, tree or 0), "gamma": g,
                           "tree_budget": tree, **m})
    base = {(q.get("concurrency"), q.get("rate"), q.get("replay")): q for q in points if q["gamma"] == 0}
    for q in points:
        b = base[(q.get("concurrency"), q.get("rate"), q.get("replay"))]
        q["speedup"] = q["throughput_tok_s"] / b["throughput_tok_s"] if b["throughput_tok_s"] else None
        q["break_even_verify_premium"] = break_even_verify_premium(q["speedup"], q)
    return points


def run_simulate(o: SimulateOptions) -> SimulateResult:
    """Simulate what ``o`` asks (see :mod:`specledger.cli.simulate`); writes ``simulate.json`` under ``o.out``."""
    p = _parse(o)
    x = _inputs(o, p)
    kv_budget = o.kv_budget
    if kv_budget is None and hasattr(x.cost, "kv_budget_tokens"):
        kv_budget = x.cost.kv_budget_tokens()
    t0 = time.perf_counter()
    points = _points(o, p, x, kv_budget)
    elapsed = time.perf_counter() - t0
    settings, tables, trees = x.settings, x.tables, x.trees
    doc: SimulateDocDict = {
        "experiment": "simulate", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from": str(x.run.path),
        "drafter": o.drafter, "settings": [str(g) for g in settings], "cost_source": x.cost.source,
        "acceptance": o.acceptance, "chains": o.chains, "acceptance_assumption": x.table.assumption,
        "acceptance_per_setting": {str(g): tables[g].assumption for g in settings if g != 0},
        "requests": o.requests, "tree_budget": o.tree_budget or 0,
        "cost_per_setting": {str(g): trees[g][2].source for g in trees}, "replicas": o.replicas, "router": o.router,
        "server": {"max_num_seqs": o.max_num_seqs, "max_batched_tokens": o.max_batched_tokens,
                   "kv_budget_tokens": kv_budget, "block_size": o.block_size, "chunked_prefill": o.chunked_prefill,
                   "reserve_gamma": o.reserve_gamma},
        "points": points, "simulated_s": elapsed,
    }
    if p.planning:
        doc["capacity_plan"] = capacity_plan(x.table, p.rates, p.slo, x.cost, settings,
                                             _server(o, o.max_num_seqs or 256, kv_budget), n_requests=o.requests,
                                             route=o.router, seed=o.seed)
    if p.ctx_list:
        doc["crossover_map"] = crossover_map(x.table, p.concs, p.ctx_list, x.cost, settings,
                                             _server(o, o.max_num_seqs or 1, kv_budget),
                                             n_requests=min(o.requests, 400), seed=o.seed)
    written = None
    if o.out is not None:
        o.out.mkdir(parents=True, exist_ok=True)
        RunDir(o.out).write(SIMULATE_JSON, doc)
        written = o.out / SIMULATE_JSON
    notes = [f"γ={g} tree={o.tree_budget}: acceptance {tables[g].assumption}; cost {trees[g][2].note}" for g in trees]
    return SimulateResult(doc, notes, written)


__all__ = ["SimulateOptions", "SimulateResult", "resolve_cost", "run_simulate"]
