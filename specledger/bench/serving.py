"""Serving conditions (SPEC §4, seed §5, §7): speculation under load and long context.

Curves, not single numbers: for each concurrency level (closed loop) or Poisson rate, and each
context length, plain decoding and each drafter run the same requests through the continuous
batching engine (:class:`specledger.engine.batch.BatchEngine`). Reported per point: throughput
of successful requests (output tokens / wall time), TTFT, TPOT, token- and chunk-level ITL
P50/P95/P99, longest stall, tokens per chunk, mean batch size, preemptions; and per drafter the
crossover: the lowest load at which its speed-up over plain falls below 1.

Memory ledger: the extra target KV that candidates need, predicted as B * gamma * m_KV
(seed §5.2, m_KV from the model config), against the peak the engine actually reserved for
candidates in its KV accounting, and the static allocation of the slot cache.

Deploy table: per load level, the fastest setting if its speed-up over plain at that load is
> 1, else "off"; for the best drafter overall a {concurrency: gamma or 0} schedule, rendered as
vLLM's ``num_speculative_tokens_per_batch_size`` ranges, plus a note for SGLang.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specledger.analysis.metrics import latency_stats
from specledger.engine.batch import BatchEngine, BatchRequest
from specledger.engine.trace import RequestRecord
from specledger.errors import require
from specledger.probe.loadgen import poisson_arrivals
from specledger.rundir import SERVING_JSON, TRACE_NAME, append_records, read_json, write_json_atomic


def point_metrics(records: Sequence[RequestRecord], wall_s: float, engine: BatchEngine) -> dict[str, Any]:
    tokens = sum(r.output_tokens for r in records)
    lat = latency_stats(records)
    steps = engine.steps
    return {
        "requests": len(records),
        "tokens": tokens,
        "wall_s": wall_s,
        "throughput_tok_s": tokens / wall_s if wall_s > 0 else math.nan,
        "ttft_ms": lat["ttft_ms"],
        "tpot_ms": lat["tpot_ms"],
        "itl_token_ms": lat["itl_token_ms"],
        "itl_chunk_ms": lat["itl_chunk_ms"],
        "tokens_per_chunk": lat["tokens_per_chunk"],
        "longest_stall_ms": lat["longest_stall_ms"],
        "mean_batch": sum(s.batch_size for s in steps) / len(steps) if steps else math.nan,
        "mean_rows_per_step": sum(s.rows for s in steps) / len(steps) if steps else math.nan,
        "t_forward_ms_per_step": 1e3 * sum(s.t_forward for s in steps) / len(steps) if steps else math.nan,
        "peak_batch": max((s.batch_size for s in steps), default=0),
        "slots": engine.max_batch,
        "slot_capacity": engine.capacity,
        "preemptions": engine.preemptions,
        "el": _el(records),
        "peak_reserved_tokens": engine.peak_reserved_tokens,
        "peak_candidate_tokens": max((s.candidates for s in steps), default=0),
    }


def _el(records: Sequence[RequestRecord]) -> float:
    full = [rd for r in records for rd in r.rounds if not rd.truncated]
    return sum(rd.committed for rd in full) / len(full) if full else math.nan


class DraftMemory:
    """Wraps a drafter factory to record what each request's drafter held: its KV cache bytes at
    the end of the request (a neural drafter's cache only grows during a request, so this is its
    peak) and, once, the bytes of draft weights not shared with the target."""

    def __init__(self, factory: Callable[[], Any], target: Any) -> None:
        self.factory, self.target = factory, target
        self.kv_per_request: list[int] = []
        self.weight_bytes: int | None = None
        self.kv_shape: Any = None

    def __call__(self) -> Any:
        d = self.factory()
        if self.weight_bytes is None:
            self.weight_bytes = own_weight_bytes(getattr(d, "model", None), self.target)
            self.kv_shape = draft_kv_shape(d)
        end = d.end

        def record_then_end(prompt: list[int], output: list[int]) -> None:
            self.kv_per_request.append(d.kv_bytes())
            end(prompt, output)

        d.end = record_then_end
        return d


def own_weight_bytes(model: Any, target: Any) -> int:
    """Bytes of ``model``'s parameters and buffers that do not share storage with ``target``'s."""
    if model is None:
        return 0
    shared = {t.untyped_storage().data_ptr() for t in [*target.parameters(), *target.buffers()]}
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in shared and ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
    return total


def model_kv_shape(model: Any, layers: Sequence[int] | None = None) -> Any:
    """The KV shape of ``model``'s forward over ``layers`` (default all), at its weights' element size."""
    from specledger.ledger.memory import KVShape

    cfg = model.config
    return KVShape(layers=len(layers) if layers else cfg.n_layers, kv_heads=cfg.n_kv_heads,
                   head_dim=int(cfg.head_dim), bytes_per_element=next(model.parameters()).element_size())


def draft_kv_shape(drafter: Any) -> Any:
    """The KV bytes per token the drafter's forward needs (its layers only), or None without a model."""
    model = getattr(drafter, "model", None)
    if model is None or not getattr(drafter, "uses_model", False):
        return None
    return model_kv_shape(model, getattr(drafter, "layers", None))


def run_point(
    model: Any,
    prompts: Sequence[list[int]],
    drafter_factory: Callable[[], Any],
    gamma: Any,
    max_tokens: int,
    concurrency: int | None,
    rate: float | None = None,
    capacity: int | None = None,
    kv_budget_tokens: int | None = None,
    eos: Sequence[int] = (),
    seed: int = 0,
    policy_state: dict[str, Any] | None = None,
) -> tuple[list[RequestRecord], dict[str, Any]]:
    """One load point: the same prompts through a fresh BatchEngine (closed loop at ``concurrency``
    or Poisson ``rate`` req/s). ``policy_state`` (a dict kept by the caller) carries what a
    goodput policy learned -- its acceptance chain -- from one point to the next, as in a
    long-running server; without it every point starts cold."""
    longest = max(len(p) for p in prompts)
    cap = capacity or min(model.config.max_seq_len, longest + max_tokens + 32)
    slots = concurrency or max(1, min(32, len(prompts)))
    engine = BatchEngine(model, eos_token_ids=eos, max_batch=slots, capacity=cap, kv_budget_tokens=kv_budget_tokens)
    drafter_factory = DraftMemory(drafter_factory, model)
    arrivals = poisson_arrivals(rate, len(prompts), seed) if rate else [0.0] * len(prompts)
    reqs = [BatchRequest(list(p), max_tokens=max_tokens, request_id=f"p{i}", arrival=a, prompt_id=f"p{i}")
            for i, (p, a) in enumerate(zip(prompts, arrivals))]
    if isinstance(gamma, str):  # a policy name: one policy per request, choosing gamma every step
        from specledger.engine.policy import AcceptanceChain, make_policy
        from specledger.engine.step_cost import step_cost_for

        policy_name = gamma
        shared = step_cost_for(model).fresh() if policy_name == "goodput" else None  # the engine's step cost
        state = policy_state if policy_state is not None else {}
        chain = state.setdefault("chain", AcceptanceChain()) if policy_name == "goodput" else None
        gamma = lambda: make_policy(policy_name, step_cost=shared, chain=chain)  # noqa: E731
    t = time.perf_counter()
    records = engine.run(reqs, drafter_factory, gamma, concurrency=None if rate else concurrency)
    wall = time.perf_counter() - t
    m = point_metrics(records, wall, engine)
    m["draft_memory"] = {"weight_bytes": drafter_factory.weight_bytes or 0,
                         "kv_bytes_per_request_max": max(drafter_factory.kv_per_request, default=0),
                         "kv_bytes_per_token": drafter_factory.kv_shape.bytes_per_token
                         if drafter_factory.kv_shape is not None else 0,
                         "max_context_tokens": max((r.prompt_tokens + r.output_tokens for r in records), default=0)}
    return records, m


def crossover(points: Sequence[dict[str, Any]], key: str = "load") -> Any:
    """The lowest load whose speed-up (throughput ratio vs plain at that load) is below 1, or None."""
    for p in sorted(points, key=lambda p: p[key]):
        if p.get("speedup") is not None and p["speedup"] < 1.0:
            return p[key]
    return None


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


def load_group(p: dict[str, Any]) -> tuple:
    """What a point is compared within: its kind and load, and for a context point also its source
    and concurrency (a context grid has several points per length)."""
    if p.get("kind") == "context":
        return (p["kind"], p["load"], p.get("source"), p.get("concurrency"))
    return (p["kind"], p["load"])


def _where(p: dict[str, Any]) -> dict[str, Any]:
    """A context point's source and concurrency (empty for other kinds)."""
    return {"source": p.get("source"), "concurrency": p.get("concurrency")} if p.get("kind") == "context" else {}


def context_crossover(points: Sequence[dict[str, Any]], drafters: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    """How the crossover moves with context length: for every source and length of a context grid,
    each drafter's concurrency crossover (the lowest concurrency with speed-up < 1; None = never
    below 1 over the concurrencies measured) and its speed-up at each concurrency."""
    rows = []
    keys = sorted({(p.get("source"), p["load"]) for p in points}, key=lambda k: (str(k[0]), k[1]))
    for source, length in keys:
        for name, g in drafters:
            pts = [{**p, "load": p["concurrency"]} for p in points if p.get("source") == source
                   and p["load"] == length and p["drafter"] == name and p["gamma"] == g]
            if pts:
                rows.append({"source": source, "length": length, "setting": setting_label(name, g),
                             "crossover_concurrency": crossover(pts),
                             "speedup_by_concurrency": {str(p["load"]): p.get("speedup")
                                                        for p in sorted(pts, key=lambda p: p["load"])}})
    return rows


def pool_repeats(runs: Sequence[tuple[dict[str, Any], list[RequestRecord]]]) -> tuple[dict[str, Any], list]:
    """One point from its repeats: totals summed (throughput = Σ tokens / Σ wall), latency
    percentiles over every request of every repeat, step means averaged, peaks maxed, preemptions
    summed; ``repeats`` keeps each repeat's tokens, wall and throughput."""
    ms = [m for m, _ in runs]
    records = [r for _, recs in runs for r in recs]
    if len(ms) == 1:
        m = dict(ms[0])
    else:
        tokens, wall = sum(m["tokens"] for m in ms), sum(m["wall_s"] for m in ms)
        lat = latency_stats(records)
        m = {**ms[0], "requests": sum(m["requests"] for m in ms), "tokens": tokens, "wall_s": wall,
             "throughput_tok_s": tokens / wall if wall > 0 else math.nan,
             "ttft_ms": lat["ttft_ms"], "tpot_ms": lat["tpot_ms"], "itl_token_ms": lat["itl_token_ms"],
             "itl_chunk_ms": lat["itl_chunk_ms"], "tokens_per_chunk": lat["tokens_per_chunk"],
             "longest_stall_ms": lat["longest_stall_ms"], "el": _el(records),
             "preemptions": sum(m["preemptions"] for m in ms)}
        for key in ("mean_batch", "mean_rows_per_step", "t_forward_ms_per_step"):
            m[key] = math.fsum(x[key] for x in ms) / len(ms)
        for key in ("peak_batch", "peak_reserved_tokens", "peak_candidate_tokens"):
            m[key] = max(x[key] for x in ms)
    m["repeats"] = [{"tokens": x["tokens"], "wall_s": x["wall_s"], "throughput_tok_s": x["throughput_tok_s"]}
                    for x in ms]
    return m, records


def paired_repeat_ratios(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]
                         ) -> tuple[list[float], list[float] | None]:
    """Per-repeat throughput ratios a_r / b_r (repeat r of both served the same requests) and their
    95% t-interval (None with fewer than two)."""
    from specledger.analysis.stats import log_ratio_t_interval

    ratios = [x["throughput_tok_s"] / y["throughput_tok_s"] for x, y in zip(a, b) if y["throughput_tok_s"]]
    low, high = log_ratio_t_interval(ratios)
    return ratios, ([low, high] if math.isfinite(low) else None)


def speedup_over(runs: Sequence[tuple[dict[str, Any], Any]], base: Sequence[tuple[dict[str, Any], Any]]
                 ) -> dict[str, Any]:
    """Speed-up of a setting over plain at the same load: pooled throughput ratio, the per-repeat
    paired ratios (repeat r of both served the same requests) and their 95% t-interval."""
    tok = sum(m["tokens"] for m, _ in runs)
    wall = sum(m["wall_s"] for m, _ in runs)
    btok = sum(m["tokens"] for m, _ in base)
    bwall = sum(m["wall_s"] for m, _ in base)
    point = (tok / wall) / (btok / bwall) if wall > 0 and bwall > 0 and btok > 0 else None
    ratios, ci = paired_repeat_ratios([m for m, _ in runs], [b for b, _ in base])
    return {"speedup": point, "speedup_repeats": ratios, "speedup_ci": ci}


def policy_vs_static(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each dynamic policy against the best static choice in hindsight at the same load.

    Candidates: plain decoding (γ = 0) and every static γ of the policy's drafter; "best" = the
    highest pooled throughput at that load. ratio = pooled throughput of the policy / the best's,
    with the 95% t-interval over the per-repeat paired ratios. ``at_least_as_good`` holds when the
    interval reaches 1 (within noise) or the point ratio is >= 1; with one repeat only the point
    ratio decides and ``ci`` is None. Picking the best of several noisy statics flatters it, so
    this is a conservative test of the policy."""
    rows = []
    by_load: dict[tuple, list[dict]] = {}
    for p in points:
        by_load.setdefault(load_group(p), []).append(p)
    for group, pts in by_load.items():
        kind, load = group[0], group[1]
        for pol in (p for p in pts if isinstance(p["gamma"], str)):
            statics = [p for p in pts if p["drafter"] == "none" or (p["drafter"] == pol["drafter"]
                                                                    and isinstance(p["gamma"], int))]
            if not statics:
                continue
            best = max(statics, key=lambda p: p["throughput_tok_s"])
            ratio = pol["throughput_tok_s"] / best["throughput_tok_s"] if best["throughput_tok_s"] else None
            per, ci = paired_repeat_ratios(pol.get("repeats", []), best.get("repeats", []))
            ok = ratio is not None and (ratio >= 1.0 or (ci is not None and ci[1] >= 1.0))
            rows.append({"kind": kind, "load": load, **_where(pol), "policy": pol["setting"],
                         "best_static": best["setting"],
                         "ratio": ratio, "ci": ci, "repeats": len(per), "ratios": per, "at_least_as_good": ok,
                         "policy_speedup": pol.get("speedup"), "best_static_speedup": best.get("speedup")})
    return rows


def memory_ledger(model: Any, batch: int, gamma: int, engine_peak_candidates: int, slot_capacity: int,
                  slots: int | None = None, draft: dict[str, Any] | None = None) -> dict:
    """Predicted candidate KV (B * gamma * m_KV) vs the engine's peak reserved candidates, bytes.

    ``batch`` is the batch size at the peak (B), ``slots`` the engine's sequence slots (default B):
    the static slot cache is slots * slot_capacity * m_KV, allocated whether speculation runs or not.

    ``draft`` (a point's ``draft_memory``) adds what a model drafter costs on top: its own weights
    (0 when it shares the target's, as layer-skip does) and its KV, predicted as
    B * (longest context + gamma + 1) * m_KV,draft (its layers only) against B times the largest
    draft cache one request actually allocated."""
    m_kv = model_kv_shape(model).bytes_per_token
    predicted = batch * gamma * m_kv
    actual = engine_peak_candidates * m_kv
    return {
        "m_kv_bytes_per_token": m_kv,
        "predicted_candidate_kv_bytes": predicted,
        "engine_peak_candidate_kv_bytes": actual,
        "relative_difference": (actual - predicted) / predicted if predicted else None,
        "batch": batch,
        "gamma": gamma,
        "static_slot_cache_bytes": (slots or batch) * slot_capacity * m_kv,
        "note": "the engine reserves candidate KV per step from the drafter's actual proposals; model-free "
        "drafters often propose fewer than gamma, so their reservation sits below B*gamma*m_KV",
    } | _draft_ledger(batch, gamma, predicted, actual, draft)


def _draft_ledger(batch: int, gamma: int, cand_predicted: int, cand_actual: int, draft: dict[str, Any] | None
                  ) -> dict[str, Any]:
    if not draft:
        return {}
    weights = int(draft.get("weight_bytes") or 0)
    per_token = int(draft.get("kv_bytes_per_token") or 0)
    kv_pred = batch * (int(draft.get("max_context_tokens") or 0) + gamma + 1) * per_token
    kv_actual = batch * int(draft.get("kv_bytes_per_request_max") or 0)
    return {
        "draft_weight_bytes": weights,
        "predicted_draft_kv_bytes": kv_pred,
        "engine_draft_kv_bytes": kv_actual,
        "draft_kv_relative_difference": (kv_actual - kv_pred) / kv_pred if kv_pred else None,
        "predicted_total_extra_bytes": cand_predicted + weights + kv_pred,
        "engine_total_extra_bytes": cand_actual + weights + kv_actual,
        "draft_note": "" if not kv_pred else "the draft cache is a static cache allocated for every layer of the "
        "draft model with its capacity rounded up (512 positions, doubling), so it exceeds what the draft "
        "layers fill; the difference is allocation granularity, not leaked memory",
    }


CONTEXT_SOURCES = ("xsum", "agent", "padding")


def _xsum_documents(n: int, seed: int) -> list[str]:
    from specledger.workloads import load_category

    items = load_category("summary", max(4, n * 4), seed=seed)
    return [it.messages[-1]["content"] if it.messages else it.prompt for it in items]


def _agent_transcripts(n: int, seed: int) -> list[str]:
    """Whole ToolTalk sessions as text (system prompt with the API docs, user turns, tool calls and
    tool responses): the longest replay step of each conversation."""
    from specledger.workloads import load_category

    items = load_category("agent", max(40, n * 40), seed=seed)
    longest: dict[str, Any] = {}
    for it in items:
        conv = it.meta.get("conversation", it.id)
        if conv not in longest or len(it.messages or []) > len(longest[conv].messages or []):
            longest[conv] = it
    return ["\n".join(f"[{m['role']}] {m['content']}" for m in it.messages or []) for it in longest.values()]


PADDING_SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def long_context_prompts(loaded: Any, length: int, n: int, seed: int = 0, source: str = "xsum") -> list[list[int]]:
    """``n`` prompts of about ``length`` tokens (chat template included), whose last words ask for an
    answer about the start of the input.

    Sources: ``xsum`` (real XSum articles concatenated; "summarise the first article"), ``agent``
    (real ToolTalk sessions concatenated; "write the next tool call of the first session") and
    ``padding`` -- a labelled control, not a workload: one XSum article (at most a quarter of the
    length) after a filler sentence repeated up to the length (the haystack filler of long-context tests), so the context is long
    but trivially repetitive."""
    require(source in CONTEXT_SOURCES, f"unknown context source {source!r}; use {', '.join(CONTEXT_SOURCES)}")
    if source == "padding":
        docs = _xsum_documents(n, seed)
        ask = "\n\nSummarize the article above in one sentence."
        out = []
        for i in range(n):
            doc_ids = loaded.tokenizer.encode(docs[i % len(docs)])[: max(8, length // 4)]  # a quarter at most
            doc = loaded.tokenizer.decode(doc_ids)
            filler_tokens = max(16, length - len(doc_ids) - 64)
            per = max(1, len(loaded.tokenizer.encode(PADDING_SENTENCE)))
            filler = PADDING_SENTENCE * (filler_tokens // per + 1)
            body = loaded.tokenizer.decode(loaded.tokenizer.encode(filler)[:filler_tokens])
            out.append(loaded.encode_prompt(messages=[{"role": "user", "content": body + "\n\n" + doc + ask}]))
        return out
    want = max(n, length // 300 + 2)  # enough documents to reach the length (XSum articles run ~300-600 tokens)
    docs = _agent_transcripts(want, seed) if source == "agent" else _xsum_documents(want, seed)
    ask = ("\n\nWrite the next tool call of the first session." if source == "agent"
           else "\n\nSummarize the first article in one sentence.")
    out = []
    for i in range(n):
        text, j = "", i
        while True:
            text += docs[j % len(docs)] + "\n\n"
            j += 1
            ids = loaded.encode_prompt(messages=[{"role": "user", "content": text + ask}])
            if len(ids) >= length or j - i > len(docs):
                break
        body = loaded.tokenizer.encode(text)[: max(16, length - 48)]
        out.append(loaded.encode_prompt(messages=[{"role": "user", "content": loaded.tokenizer.decode(body) + ask}]))
    return out


Progress = Callable[[int, int, str], None]
OnPoint = Callable[[dict[str, Any], list[RequestRecord]], None]


def setting_label(drafter: str, gamma: Any) -> str:
    """``"plain"`` for plain decoding, else ``"<drafter> γ=<gamma>"`` (the crossover/deploy key)."""
    return "plain" if drafter == "none" or not gamma else f"{drafter} γ={gamma}"


def _warm_up(model: Any, prompts: Sequence[list[int]], factories: Sequence[tuple[Callable[[], Any], int]],
             eos: Sequence[int]) -> None:
    """A short discarded run per setting so that the first measured point does not pay one-off costs
    (allocator growth, lazy kernels) that the later ones do not."""
    few = list(prompts[:2])
    for make, g in factories:
        run_point(model, few, make, g, max_tokens=4, concurrency=len(few), eos=eos)


def run_serving_sweep(
    engine: Any,
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
) -> dict[str, Any]:
    """Plain vs each (drafter, gamma) at every concurrency (and Poisson rate), then vs context length.

    ``engine`` is a solo :class:`Engine` built from a LoadedModel (its model and tokenizer are
    used; drafters are built per request with :func:`make_drafter`). Closed-loop points serve
    max(2c, 4) requests (the prompts cycled), rate points 16; context points form a grid: every
    source (:func:`long_context_prompts`) x concurrency in ``context_concurrencies`` (default
    ``[context_concurrency]``) x length, max(c, 2) long prompts each, so the concurrency crossover
    can be read at every context length (``context_crossover``); the order of the settings rotates from one load (and repeat) to
    the next. With ``repeats`` > 1 every setting serves the same requests ``repeats`` times,
    interleaved with the others; a point pools its repeats (:func:`pool_repeats`) and its speed-up
    is pooled throughput over plain's at the same load, with a t-interval over the per-repeat
    paired ratios (:func:`speedup_over`). A dynamic policy keeps what it learned about acceptance
    from point to point (one policy state per setting, as one long-running server would). ``on_point(point, records)`` receives every point with its request records
    (``prompt_id`` = index into ``prompts``, or ``context<length>#<i>``)."""
    from specledger.engine.drafters.registry import make_drafter

    model = engine.model
    eos = sorted(engine.eos_token_ids)
    settings = [("none", 0)] + list(drafters)
    layers_cache: dict[str, Any] = {}

    def factory(name: str) -> Callable[[], Any]:
        if name == "layerskip" and "layers" not in layers_cache:
            layers_cache["layers"] = ",".join(map(str, make_drafter("layerskip", engine).layers))
        return lambda: make_drafter(name, engine, layers=layers_cache.get("layers"))

    require(repeats >= 1, "--repeats must be >= 1")
    policy_states: dict[tuple[str, Any], dict[str, Any]] = {}  # per setting: what its policy learned so far
    ctx_concs = list(context_concurrencies or [context_concurrency])
    grid = [(src, c, n) for src in context_sources for c in ctx_concs for n in context_lengths]
    total = (len(concurrencies) + len(rates) + len(grid)) * len(settings) * repeats
    done = 0

    def sweep(loads: Sequence[Any], kind: str, prompt_sets: Callable[[Any], tuple[list[list[int]], list[str]]]
              ) -> list[dict]:
        nonlocal done
        points = []
        for k, spec in enumerate(loads):
            source, conc_at, load = spec if kind == "context" else (None, None, spec)
            ps, ids = prompt_sets(spec)
            runs: dict[tuple[str, Any], list[tuple[dict, list[RequestRecord]]]] = {s: [] for s in settings}
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
            base = runs[("none", 0)]
            for name, g in settings:
                m, records = pool_repeats(runs[(name, g)])
                m.update({"kind": kind, "load": load, "drafter": name, "gamma": g, "setting": setting_label(name, g)})
                if kind == "context":
                    m.update({"source": source, "concurrency": conc_at})
                m.update(speedup_over(runs[(name, g)], base))
                if name != "none" and isinstance(g, int) and g:
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
    result: dict[str, Any] = {"concurrency": [], "rate": [], "context": [], "crossover": {}}
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
VLLM_METHODS = {"ngram": "ngram", "suffix": "suffix", "model": "draft_model"}


def deploy_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per load level (every concurrency, rate and context point): the setting with the highest
    throughput if its speed-up over plain at that load is > 1 -- and, with repeats, the lower end
    of its 95% interval too -- else "off" (plain decoding)."""
    rows = []
    for kind in ("concurrency", "rate", "context"):
        loads: dict[Any, list[dict]] = {}
        for p in result.get(kind, []):
            loads.setdefault(load_group(p), []).append(p)
        for group, pts in loads.items():
            load = group[1]
            spec = [p for p in pts if p["drafter"] != "none" and p.get("speedup") is not None]
            best = max(spec, key=lambda p: p["throughput_tok_s"], default=None)
            ci = best.get("speedup_ci") if best is not None else None
            on = best is not None and best["speedup"] > 1.0 and (ci is None or ci[0] > 1.0)
            rows.append({
                "kind": kind,
                "load": load,
                **_where(pts[0]),
                "decision": "deploy" if on else "off",
                "drafter": best["drafter"] if on else None,
                "gamma": best["gamma"] if on else 0,
                "setting": best["setting"] if on else "off",
                "speedup": best["speedup"] if best else None,
                "speedup_ci": ci,
                "best_candidate": best["setting"] if best else None,
                "throughput_tok_s": best["throughput_tok_s"] if on else
                next((p["throughput_tok_s"] for p in pts if p["drafter"] == "none"), None),
            })
    return rows


def best_overall(points: Sequence[dict[str, Any]]) -> tuple[str, int] | None:
    """The (drafter, gamma) with the highest geometric-mean speed-up over the given points."""
    by: dict[tuple[str, int], list[float]] = {}
    for p in points:
        if p["drafter"] != "none" and isinstance(p["gamma"], int) and p.get("speedup"):  # static gammas only:
            by.setdefault((p["drafter"], p["gamma"]), []).append(p["speedup"])  # a config needs a number
    if not by:
        return None
    return max(by, key=lambda k: math.fsum(math.log(s) for s in by[k]) / len(by[k]))


def gamma_by_concurrency(points: Sequence[dict[str, Any]], drafter: str, gamma: int) -> dict[int, int]:
    """{concurrency: gamma if this drafter's speed-up there is > 1 else 0} (a batch-size schedule)."""
    return {int(p["load"]): (gamma if p.get("speedup") is not None and p["speedup"] > 1.0 else 0)
            for p in sorted(points, key=lambda p: p["load"]) if p["drafter"] == drafter and p["gamma"] == gamma}


def batch_size_ranges(schedule: dict[int, int]) -> list[list[int]]:
    """{c_i: K_i} -> [[start, end, K], ...]: each measured c_i covers (c_(i-1), c_i] -- the range is
    decided by the measurement at its largest batch, the conservative end when speed-up falls with
    load -- and batches above the largest measured one get K = 0 (untested: plain)."""
    rows, start = [], 1
    for c in sorted(schedule):
        rows.append([start, c, schedule[c]])
        start = c + 1
    if rows:
        rows.append([start, max(start, 1024), 0])
    return rows


def deploy_configs(result: dict[str, Any]) -> dict[str, Any]:
    """Paste-ready settings for the best drafter overall (:func:`best_overall` over the concurrency
    points): its {concurrency: gamma or 0} schedule, the vLLM dynamic-SD config and an SGLang note.
    JSON turns the schedule's integer keys into strings."""
    conc = result.get("concurrency", [])
    best = best_overall(conc)
    out: dict[str, Any] = {"best_drafter": None, "gamma": None,
                           "gamma_by_concurrency": {}, "vllm": None, "sglang_note": ""}
    if best is None:
        return out
    drafter, gamma = best
    schedule = gamma_by_concurrency(conc, drafter, gamma)
    crossover_at = result.get("crossover", {}).get("concurrency", {}).get(setting_label(drafter, gamma))
    out.update({"best_drafter": drafter, "gamma": gamma, "gamma_by_concurrency": schedule})
    method = VLLM_METHODS.get(drafter)
    on = [c for c, k in schedule.items() if k]
    if method and on:
        out["vllm"] = {
            "speculative_config": {
                "method": method,
                "num_speculative_tokens": gamma,
                "num_speculative_tokens_per_batch_size": batch_size_ranges(schedule),
            },
            "note": "vLLM dynamic speculative decoding: [start_bs, end_bs, K] ranges from the measured "
                    "concurrencies; K = 0 turns speculation off. Measured on this machine and model: "
                    "re-measure on the deployment hardware.",
        }
    elif not on:
        out["vllm"] = {"speculative_config": None, "note": f"{setting_label(drafter, gamma)} never beat plain "
                       "decoding here: leave speculation off."}
    else:
        out["vllm"] = {"speculative_config": None,
                       "note": f"drafter {drafter!r} has no vLLM equivalent; the schedule above still holds."}
    launch = ("SGLang fixes the draft length per server at launch (--speculative-num-steps / "
              "--speculative-num-draft-tokens). ")
    if not on:
        out["sglang_note"] = launch + "No measured load favoured speculation: launch without it."
    else:
        stop = (f"from a concurrency of {crossover_at}" if crossover_at is not None
                else f"above {max(schedule)} (the largest load measured)")
        out["sglang_note"] = launch + (
            f"To follow this table, speculate (γ={gamma}) only on instances whose running requests stay below "
            f"the crossover (cap --max-running-requests), and decode plainly {stop}.")
    return out


# ----------------------------------------------------------------------------- the experiment
SERVING_EXPERIMENT = "serving"


def run_serving(
    engine: Any,
    items: Sequence[Any],
    drafters: Sequence[tuple[str, int]] = (("ngram", 4), ("suffix", 4)),
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
) -> dict[str, Any]:
    """The serving experiment into a run directory: every request's record (tagged
    ``extra.experiment = "serving"``) appended to ``traces.jsonl`` as its point finishes, the
    curves, crossovers, memory ledger and deploy table to ``serving.json`` (atomic)."""
    from specledger.bench.quant4 import check_fresh, encode_prompts
    from specledger.engine.drafters.registry import DRAFTERS

    require(bool(concurrencies) and all(isinstance(c, int) and c >= 1 for c in concurrencies),
            "--concurrencies must be integers >= 1, e.g. 1,2,4,8,16")
    require(all(r > 0 for r in rates), "--rates must be positive request rates (req/s), e.g. 2,8")
    require(max_tokens >= 2, "--serving-max-tokens must be >= 2")
    require(bool(drafters), "give at least one drafter, e.g. --serving-drafters ngram:4")
    require(len(set(drafters)) == len(drafters), "--serving-drafters lists a setting twice; give each drafter:gamma once")
    for name, g in drafters:
        require(name in DRAFTERS and name != "none",
                f"unknown drafter {name!r} in --serving-drafters; choose from {', '.join(DRAFTERS[1:])}")
        require((isinstance(g, int) and g >= 1) or g in ("heuristic", "ema", "batch", "goodput"),
                f"gamma of {name} must be an integer >= 1 or a policy name, e.g. {name}:4 or {name}:goodput")
    limit = min(engine.max_context, engine.model.config.max_seq_len) - max_tokens - 64
    require(all(isinstance(c, int) and c >= 1 for c in context_concurrencies or [context_concurrency]),
            "--context-concurrencies must be integers >= 1, e.g. 1,4,16")
    for src in context_sources:
        require(src in CONTEXT_SOURCES, f"unknown context source {src!r}; use {', '.join(CONTEXT_SOURCES)}")
    for length in context_lengths:
        require(16 <= length <= limit, f"context length {length} does not fit the model's context with "
                f"{max_tokens} new tokens; use --contexts between 16 and {limit}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_fresh(out, SERVING_EXPERIMENT)
    prompts, skipped = encode_prompts(engine, items, max_tokens)
    prompts = interleave_categories(prompts)  # a closed-loop point serves the first max(2c, 4): mix them

    def keep(point: dict[str, Any], records: list[RequestRecord]) -> None:
        for i, rec in enumerate(records):
            p = prompts[int(rec.prompt_id)] if rec.prompt_id.isdigit() else None
            rec.prompt_id = p.id if p else rec.prompt_id
            rec.category = p.category if p else "long-context"
            rec.request_id = (f"serving|{point['kind']}={point['load']}|{point['setting']}"
                              f"|r{rec.extra.get('repeat', 0)}|{i}")
            rec.extra.update({"experiment": SERVING_EXPERIMENT, "setting": point["setting"],
                              "kind": point["kind"], "load": point["load"]})
        append_records(out / TRACE_NAME, records)

    result = run_serving_sweep(engine, [list(p.ids) for p in prompts], drafters, concurrencies, max_tokens,
                               rates, context_lengths, context_concurrency, progress=progress, on_point=keep,
                               warmup=warmup, seed=seed, repeats=repeats,
                               context_concurrencies=context_concurrencies, context_sources=context_sources)
    doc = {
        "experiment": SERVING_EXPERIMENT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": engine.name,
        "dtype": engine.dtype,
        "drafters": [setting_label(n, g) for n, g in drafters],
        "concurrencies": list(concurrencies),
        "rates": list(rates),
        "context_lengths": list(context_lengths),
        "context_concurrency": context_concurrency,
        "context_concurrencies": list(context_concurrencies or [context_concurrency]),
        "context_sources": list(context_sources),
        "max_tokens": max_tokens,
        "repeats": repeats,
        "temperature": 0.0,
        "prompts": [p.id for p in prompts],
        "categories": sorted({p.category for p in prompts}),
        "skipped_prompts": skipped,
        **result,
        "deploy_table": deploy_table(result),
        "deploy": deploy_configs(result),
    }
    write_json_atomic(out / SERVING_JSON, doc)
    return read_json(out / SERVING_JSON)
