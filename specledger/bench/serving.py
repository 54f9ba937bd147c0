"""Serving conditions: speculation under load and long context (``specledger sweep --experiment serving``).

Curves, not single numbers: for each concurrency level (closed loop) or Poisson rate, and each
context length, plain decoding and each drafter run the same requests through the continuous
batching engine (:class:`specledger.engine.batch.BatchEngine`). Reported per point: throughput
of successful requests (output tokens / wall time), TTFT, TPOT, token- and chunk-level ITL
P50/P95/P99, longest stall, tokens per chunk, mean batch size, preemptions; and per drafter the
crossover: the lowest load at which its speed-up over plain falls below 1
(:mod:`~specledger.bench.serving_metrics`).

Memory ledger: the extra target KV that candidates need, predicted as B · γ · m_KV, against what
the engine actually reserved (:mod:`~specledger.bench.serving_memory`). Long inputs for the context
grid: :mod:`~specledger.bench.long_context`. Deploy table and configs: :mod:`~specledger.bench.deploy`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specledger.bench.deploy import deploy_configs, deploy_table
from specledger.bench.long_context import CONTEXT_SOURCES, long_context_prompts
from specledger.bench.serving_memory import DraftMemory, memory_ledger
from specledger.bench.serving_metrics import (
    context_crossover,
    crossover,
    point_metrics,
    policy_vs_static,
    pool_repeats,
    setting_label,
    speedup_over,
)
from specledger.bench.serving_types import ServingDocDict, ServingPointDict, ServingSweepDict
from specledger.engine.batch import BatchEngine, BatchRequest
from specledger.engine.drafters.catalog import LAYERSKIP, NGRAM, PLAIN, SUFFIX, check_drafter
from specledger.engine.protocol import TargetEngine
from specledger.errors import require
from specledger.load_points import poisson_arrivals
from specledger.records import GammaSpec, RequestRecord
from specledger.rundir import SERVING_JSON, RunDir

if TYPE_CHECKING:
    from specledger.engine.model import Transformer
    from specledger.engine.policy import AcceptanceChain


def run_point(
    model: Transformer,
    prompts: Sequence[list[int]],
    drafter_factory: Callable[[], Any],
    gamma: GammaSpec,
    max_tokens: int | Sequence[int],
    concurrency: int | None,
    rate: float | None = None,
    capacity: int | None = None,
    kv_budget_tokens: int | None = None,
    eos: Sequence[int] = (),
    seed: int = 0,
    policy_state: dict[str, AcceptanceChain] | None = None,
    params: Any = None,
) -> tuple[list[RequestRecord], ServingPointDict]:
    """One load point: the same prompts through a fresh BatchEngine (closed loop at ``concurrency``
    or Poisson ``rate`` req/s). ``policy_state`` (a dict kept by the caller) carries what a
    goodput policy learned -- its acceptance chain -- from one point to the next, as in a
    long-running server; without it every point starts cold. ``max_tokens`` is one budget for
    every request or one per prompt; ``params`` (a SamplingParams) applies to every request
    (default greedy). The point's CPU time (this process, all threads) is ``cpu_s``."""
    from specledger.engine.sampling import SamplingParams

    budgets = [int(max_tokens)] * len(prompts) if isinstance(max_tokens, int) else [int(m) for m in max_tokens]
    require(len(budgets) == len(prompts), "run_point: one max_tokens per prompt")
    longest = max(len(p) + m for p, m in zip(prompts, budgets))
    cap = capacity or min(model.config.max_seq_len, longest + 32)
    slots = concurrency or max(1, min(32, len(prompts)))
    engine = BatchEngine(model, eos_token_ids=eos, max_batch=slots, capacity=cap, kv_budget_tokens=kv_budget_tokens)
    drafter_factory = DraftMemory(drafter_factory, model)
    arrivals = poisson_arrivals(rate, len(prompts), seed) if rate else [0.0] * len(prompts)
    reqs = [BatchRequest(list(p), max_tokens=m, request_id=f"p{i}", arrival=a, prompt_id=f"p{i}",
                         params=params if params is not None else SamplingParams())
            for i, (p, a, m) in enumerate(zip(prompts, arrivals, budgets))]
    if isinstance(gamma, str):  # a policy name: one policy per request, choosing gamma every step
        from specledger.engine.policy import AcceptanceChain, make_policy
        from specledger.engine.step_cost import step_cost_for

        policy_name = gamma
        shared = step_cost_for(model).fresh() if policy_name == "goodput" else None  # the engine's step cost
        state = policy_state if policy_state is not None else {}
        chain = state.setdefault("chain", AcceptanceChain()) if policy_name == "goodput" else None
        gamma = lambda: make_policy(policy_name, step_cost=shared, chain=chain)  # noqa: E731
    t, cpu = time.perf_counter(), time.process_time()
    records = engine.run(reqs, drafter_factory, gamma, concurrency=None if rate else concurrency)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    m = point_metrics(records, wall, engine)
    m["cpu_s"] = cpu
    m["draft_memory"] = {"weight_bytes": drafter_factory.weight_bytes or 0,
                         "kv_bytes_per_request_max": max(drafter_factory.kv_per_request, default=0),
                         "kv_bytes_per_token": drafter_factory.kv_shape.bytes_per_token
                         if drafter_factory.kv_shape is not None else 0,
                         "max_context_tokens": max((r.prompt_tokens + r.output_tokens for r in records), default=0)}
    return records, m


def interleave_categories(prompts: Sequence[Any]) -> list[Any]:
    """Round-robin over categories (first-seen order), so that any prefix of the list -- what a
    low-concurrency point serves -- mixes the categories instead of holding only the first."""
    by: dict[str, list[Any]] = {}
    for p in prompts:
        by.setdefault(p.category, []).append(p)
    out: list[Any] = []
    for i in range(max((len(v) for v in by.values()), default=0)):
        out += [v[i] for v in by.values() if i < len(v)]
    return out


Progress = Callable[[int, int, str], None]
#: one repeat of a point: its figures and its request records
PointRun = tuple[ServingPointDict, list[RequestRecord]]
OnPoint = Callable[[ServingPointDict, list[RequestRecord]], None]


def _warm_up(model: Transformer, prompts: Sequence[list[int]], factories: Sequence[tuple[Callable[[], Any], int]],
             eos: Sequence[int]) -> None:
    """A short discarded run per setting so that the first measured point does not pay one-off costs
    (allocator growth, lazy kernels) that the later ones do not."""
    few = list(prompts[:2])
    for make, g in factories:
        run_point(model, few, make, g, max_tokens=4, concurrency=len(few), eos=eos)


def run_serving_sweep(
    engine: TargetEngine,
    prompts: Sequence[list[int]],
    drafters: Sequence[tuple[str, int]],
    concurrencies: Sequence[int] = (1, 2, 4, 8, 16, 32),
    max_tokens: int = 64,
    rates: Sequence[float] = (),
    context_lengths: Sequence[int] = (),
    context_concurrency: int = 4,
    progress: Progress | None = None,
    on_point: OnPoint | None = None,
    warmup: bool = True,
    seed: int = 0,
    repeats: int = 1,
    context_concurrencies: Sequence[int] | None = None,
    context_sources: Sequence[str] = ("xsum",),
) -> ServingSweepDict:
    """Plain vs each (drafter, gamma) at every concurrency (and Poisson rate), then vs context length.

    ``engine`` is a solo :class:`Engine` built from a LoadedModel (its model and tokenizer are
    used; drafters are built per request with :func:`make_drafter`). Closed-loop points serve
    max(2c, 4) requests (the prompts cycled), rate points 16; context points form a grid: every
    source (:func:`long_context_prompts`) x concurrency in ``context_concurrencies`` (default
    ``[context_concurrency]``) x length, max(c, 2) long prompts each, so the concurrency crossover
    can be read at every context length (``context_crossover``); the order of the settings rotates from one
    load (and repeat) to the next. With ``repeats`` > 1 every setting serves the same requests ``repeats``
    times, interleaved with the others; a point pools its repeats (:func:`pool_repeats`) and its speed-up
    is pooled throughput over plain's at the same load, with a t-interval over the per-repeat paired ratios
    (:func:`speedup_over`). A dynamic policy keeps what it learned about acceptance from point to point (one
    policy state per setting, as one long-running server would). ``on_point(point, records)`` receives every
    point with its request records (``prompt_id`` = index into ``prompts``, or ``context<length>#<i>``)."""
    from specledger.engine.drafters.registry import make_drafter

    model = engine.model
    eos = sorted(engine.eos_token_ids)
    settings = [(PLAIN.name, 0)] + list(drafters)
    layers_cache: dict[str, str] = {}

    def factory(name: str) -> Callable[[], Any]:
        if name == LAYERSKIP.name and "layers" not in layers_cache:
            layers_cache["layers"] = ",".join(map(str, make_drafter(LAYERSKIP.name, engine).layers))
        return lambda: make_drafter(name, engine, layers=layers_cache.get("layers"))

    require(repeats >= 1, "--repeats must be >= 1")
    policy_states: dict[tuple[str, GammaSpec], dict[str, AcceptanceChain]] = {}  # what each setting's policy learned
    ctx_concs = list(context_concurrencies or [context_concurrency])
    grid = [(src, c, n) for src in context_sources for c in ctx_concs for n in context_lengths]
    total = (len(concurrencies) + len(rates) + len(grid)) * len(settings) * repeats
    done = 0

    def sweep(loads: Sequence[Any], kind: str, prompt_sets: Callable[[Any], tuple[list[list[int]], list[str]]]
              ) -> list[ServingPointDict]:
        nonlocal done
        points: list[ServingPointDict] = []
        for k, spec in enumerate(loads):
            source, conc_at, load = spec if kind == "context" else (None, None, spec)
            ps, ids = prompt_sets(spec)
            runs: dict[tuple[str, GammaSpec], list[PointRun]] = {s: [] for s in settings}
            for rep in range(repeats):
                # rotate the order per load and repeat so that a slow phase of the machine does not
                # always hit one setting; every setting of a repeat serves the same requests
                shift = (k + rep) % len(settings)
                for name, g in settings[shift:] + settings[:shift]:
                    if progress:
                        where = f"{source} c={conc_at} " if kind == "context" else ""
                        progress(done, total, f"serving {kind}={load} {where}{setting_label(name, g)}"
                                 + (f" #{rep + 1}" if repeats > 1 else ""))
                    conc = (conc_at if kind == "context" else load) if kind != "rate" else None
                    rate = load if kind == "rate" else None
                    records, m = run_point(model, ps, factory(name), g, max_tokens, conc, rate=rate, eos=eos,
                                           seed=seed + rep, policy_state=policy_states.setdefault((name, g), {}))
                    for r in records:
                        r.prompt_id = ids[int(r.prompt_id[1:])]
                        r.extra["repeat"] = rep
                    runs[(name, g)].append((m, records))
                    done += 1
            base = runs[(PLAIN.name, 0)]
            for name, g in settings:
                m, records = pool_repeats(runs[(name, g)])
                m.update({"kind": kind, "load": load, "drafter": name, "gamma": g, "setting": setting_label(name, g)})
                if kind == "context":
                    m.update({"source": source, "concurrency": conc_at})
                m.update(speedup_over(runs[(name, g)], base))
                if name != PLAIN.name and isinstance(g, int) and g:
                    m["memory"] = memory_ledger(model, m["peak_batch"] or 1, g, m["peak_candidate_tokens"],
                                                m["slot_capacity"], slots=m["slots"], draft=m.get("draft_memory"))
                points.append(m)
                if on_point:
                    on_point(m, records)
        return points

    def repeat(n: int) -> tuple[list[list[int]], list[str]]:
        idx = [i % len(prompts) for i in range(n)]
        return [list(prompts[i]) for i in idx], [str(i) for i in idx]

    def long(spec: tuple[str, int, int]) -> tuple[list[list[int]], list[str]]:
        source, c, length = spec
        ps = long_context_prompts(engine.loaded, length, max(c, 2), seed=seed, source=source)
        return ps, [f"context{length}-{source}#{i}" for i in range(len(ps))]

    if warmup:
        _warm_up(model, prompts, [(factory(name), g) for name, g in settings], eos)
    result: ServingSweepDict = {"concurrency": [], "rate": [], "context": [], "crossover": {}}
    result["concurrency"] = sweep(concurrencies, "concurrency", lambda c: repeat(max(2 * c, 4)))
    if rates:
        result["rate"] = sweep(rates, "rate", lambda r: repeat(16))
    if grid:
        result["context"] = sweep(grid, "context", long)
    for kind in ("concurrency", "rate", "context"):
        for name, g in drafters:
            pts = [p for p in result[kind] if p["drafter"] == name and p["gamma"] == g]
            if kind == "context":  # the length crossover of the first source and concurrency
                pts = [p for p in pts if (p["source"], p["concurrency"]) == (context_sources[0], ctx_concs[0])]
            if pts:
                result["crossover"].setdefault(kind, {})[setting_label(name, g)] = crossover(pts)
    result["context_crossover"] = context_crossover(result["context"], drafters)
    result["policy_vs_static"] = policy_vs_static([*result["concurrency"], *result["rate"], *result["context"]])
    if progress:
        progress(done, total, "serving done")
    return result


# ----------------------------------------------------------------------------- deploy tables


# ----------------------------------------------------------------------------- the experiment
SERVING_EXPERIMENT = "serving"


def check_serving_settings(drafters: Sequence[tuple[str, int | str]], concurrencies: Sequence[int],
                           rates: Sequence[float], max_tokens: int, context_concurrencies: Sequence[int],
                           context_sources: Sequence[str]) -> None:
    """The serving experiment's settings, checked before any model is loaded; a bad one is a
    SpecLedgerError naming its flag (context lengths are checked against the model in :func:`run_serving`)."""
    from specledger.engine.policy import POLICIES

    require(bool(concurrencies) and all(isinstance(c, int) and c >= 1 for c in concurrencies),
            "--concurrencies must be integers >= 1, e.g. 1,2,4,8,16")
    require(all(r > 0 for r in rates), "--rates must be positive request rates (req/s), e.g. 2,8")
    require(max_tokens >= 2, "--serving-max-tokens must be >= 2")
    require(bool(drafters), "give at least one drafter, e.g. --serving-drafters ngram:4")
    require(len(set(drafters)) == len(drafters), "--serving-drafters lists a setting twice; give each "
                                                 "drafter:gamma once")
    for name, g in drafters:
        check_drafter(name, " in --serving-drafters")
        require((isinstance(g, int) and g >= 1) or (g in POLICIES and g != "static"),
                f"gamma of {name} must be an integer >= 1 or a policy name, e.g. {name}:4 or {name}:goodput")
    require(all(isinstance(c, int) and c >= 1 for c in context_concurrencies),
            "--context-concurrencies must be integers >= 1, e.g. 1,4,16")
    for src in context_sources:
        require(src in CONTEXT_SOURCES, f"unknown context source {src!r}; use {', '.join(CONTEXT_SOURCES)}")


def run_serving(
    engine: TargetEngine,
    items: Sequence[Any],
    drafters: Sequence[tuple[str, int]] = ((NGRAM.name, 4), (SUFFIX.name, 4)),
    concurrencies: Sequence[int] = (1, 2, 4, 8, 16),
    rates: Sequence[float] = (),
    context_lengths: Sequence[int] = (),
    context_concurrency: int = 4,
    max_tokens: int = 48,
    out_dir: str | Path = ".",
    seed: int = 0,
    progress: Progress | None = None,
    warmup: bool = True,
    repeats: int = 1,
    context_concurrencies: Sequence[int] | None = None,
    context_sources: Sequence[str] = ("xsum",),
) -> ServingDocDict:
    """The serving experiment into a run directory: every request's record (tagged
    ``extra.experiment = "serving"``) appended to ``traces.jsonl`` as its point finishes, the
    curves, crossovers, memory ledger and deploy table to ``serving.json`` (atomic)."""
    from specledger.bench.experiment import (
        check_fresh,
        encode_prompts,
        experiment_header,
        greedy_prompt_fields,
    )

    check_serving_settings(drafters, concurrencies, rates, max_tokens, context_concurrencies or [context_concurrency],
                           context_sources)
    limit = min(engine.max_context, engine.model.config.max_seq_len) - max_tokens - 64
    for length in context_lengths:
        require(16 <= length <= limit, f"context length {length} does not fit the model's context with "
                f"{max_tokens} new tokens; use --contexts between 16 and {limit}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_fresh(out, SERVING_EXPERIMENT)
    prompts, skipped = encode_prompts(engine, items, max_tokens)
    prompts = interleave_categories(prompts)  # a closed-loop point serves the first max(2c, 4): mix them

    def keep(point: ServingPointDict, records: list[RequestRecord]) -> None:
        for i, rec in enumerate(records):
            p = prompts[int(rec.prompt_id)] if rec.prompt_id.isdigit() else None
            rec.prompt_id = p.id if p else rec.prompt_id
            rec.category = p.category if p else "long-context"
            rec.request_id = (f"serving|{point['kind']}={point['load']}|{point['setting']}"
                              f"|r{rec.extra.get('repeat', 0)}|{i}")
            rec.extra.update({"experiment": SERVING_EXPERIMENT, "setting": point["setting"],
                              "kind": point["kind"], "load": point["load"], "slots": point.get("slots")})
        RunDir(out).append(records)

    result = run_serving_sweep(engine, [list(p.ids) for p in prompts], drafters, concurrencies, max_tokens,
                               rates, context_lengths, context_concurrency, progress=progress, on_point=keep,
                               warmup=warmup, seed=seed, repeats=repeats,
                               context_concurrencies=context_concurrencies, context_sources=context_sources)
    doc: ServingDocDict = {
        **experiment_header(SERVING_EXPERIMENT, engine),
        "drafters": [setting_label(n, g) for n, g in drafters],
        "concurrencies": list(concurrencies),
        "rates": list(rates),
        "context_lengths": list(context_lengths),
        "context_concurrency": context_concurrency,
        "context_concurrencies": list(context_concurrencies or [context_concurrency]),
        "context_sources": list(context_sources),
        "max_tokens": max_tokens,
        "repeats": repeats,
        **greedy_prompt_fields(prompts, skipped),
        **result,
        "deploy_table": deploy_table(result),
        "deploy": deploy_configs(result),
    }
    return RunDir(out).write_experiment(SERVING_JSON, doc)
