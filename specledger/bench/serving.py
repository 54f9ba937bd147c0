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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from specledger.analysis.metrics import latency_stats
from specledger.engine.batch import BatchEngine, BatchRequest
from specledger.engine.trace import RequestRecord
from specledger.probe.loadgen import poisson_arrivals


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
        "preemptions": engine.preemptions,
        "el": _el(records),
        "peak_reserved_tokens": engine.peak_reserved_tokens,
        "peak_candidate_tokens": max((s.candidates for s in steps), default=0),
    }


def _el(records: Sequence[RequestRecord]) -> float:
    full = [rd for r in records for rd in r.rounds if not rd.truncated]
    return sum(rd.committed for rd in full) / len(full) if full else math.nan


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
) -> tuple[list[RequestRecord], dict[str, Any]]:
    """One load point: the same prompts through a fresh BatchEngine (closed loop at ``concurrency``
    or Poisson ``rate`` req/s)."""
    longest = max(len(p) for p in prompts)
    cap = capacity or min(model.config.max_seq_len, longest + max_tokens + 32)
    slots = concurrency or max(1, min(32, len(prompts)))
    engine = BatchEngine(model, eos_token_ids=eos, max_batch=slots, capacity=cap, kv_budget_tokens=kv_budget_tokens)
    arrivals = poisson_arrivals(rate, len(prompts), seed) if rate else [0.0] * len(prompts)
    reqs = [BatchRequest(list(p), max_tokens=max_tokens, request_id=f"p{i}", arrival=a, prompt_id=f"p{i}")
            for i, (p, a) in enumerate(zip(prompts, arrivals))]
    t = time.perf_counter()
    records = engine.run(reqs, drafter_factory, gamma, concurrency=None if rate else concurrency)
    wall = time.perf_counter() - t
    return records, point_metrics(records, wall, engine)


def crossover(points: Sequence[dict[str, Any]], key: str = "load") -> Any:
    """The lowest load whose speed-up (throughput ratio vs plain at that load) is below 1, or None."""
    for p in sorted(points, key=lambda p: p[key]):
        if p.get("speedup") is not None and p["speedup"] < 1.0:
            return p[key]
    return None


def memory_ledger(model: Any, batch: int, gamma: int, engine_peak_candidates: int, slot_capacity: int) -> dict:
    """Predicted candidate KV (B * gamma * m_KV) vs the engine's peak reserved candidates, bytes."""
    from specledger.ledger.memory import KVShape

    cfg = model.config
    elem = next(model.parameters()).element_size()
    shape = KVShape(layers=cfg.n_layers, kv_heads=cfg.n_kv_heads, head_dim=int(cfg.head_dim), bytes_per_element=elem)
    m_kv = shape.bytes_per_token
    predicted = batch * gamma * m_kv
    actual = engine_peak_candidates * m_kv
    return {
        "m_kv_bytes_per_token": m_kv,
        "predicted_candidate_kv_bytes": predicted,
        "engine_peak_candidate_kv_bytes": actual,
        "relative_difference": (actual - predicted) / predicted if predicted else None,
        "static_slot_cache_bytes": batch * slot_capacity * m_kv,
        "note": "the engine reserves candidate KV per step from the drafter's actual proposals; model-free "
        "drafters often propose fewer than gamma, so their reservation sits below B*gamma*m_KV",
    }


def long_context_prompts(loaded: Any, length: int, n: int, seed: int = 0) -> list[list[int]]:
    """Real long inputs: XSum articles concatenated until ``length`` tokens, then a request to
    summarise (the last tokens are the chat template's). Real text, not padding."""
    from specledger.workloads import load_category

    items = load_category("summary", max(4, n * 4), seed=seed)
    docs = [it.messages[-1]["content"] if it.messages else it.prompt for it in items]
    out = []
    for i in range(n):
        text, j = "", i
        while True:
            text += docs[j % len(docs)] + "\n\n"
            j += 1
            ids = loaded.encode_prompt(messages=[{"role": "user", "content": text + "Summarize the first article."}])
            if len(ids) >= length or j - i > len(docs):
                break
        body = loaded.tokenizer.encode(text)[: max(16, length - 48)]
        msg = loaded.tokenizer.decode(body) + "\n\nSummarize the first article in one sentence."
        out.append(loaded.encode_prompt(messages=[{"role": "user", "content": msg}]))
    return out


def run_serving_sweep(
    engine: Any,
    prompts: Sequence[list[int]],
    drafters: Sequence[tuple[str, int]],
    concurrencies: Sequence[int] = (1, 2, 4, 8, 16, 32),
    max_tokens: int = 64,
    rates: Sequence[float] = (),
    context_lengths: Sequence[int] = (),
    context_concurrency: int = 4,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Plain vs each (drafter, gamma) at every concurrency (and Poisson rate), then vs context length.

    ``engine`` is a solo :class:`Engine` built from a LoadedModel (its model and tokenizer are
    used; drafters are built per request with :func:`make_drafter`)."""
    from specledger.engine.drafters.registry import make_drafter

    model = engine.model
    eos = sorted(engine.eos_token_ids)
    settings = [("none", 0)] + list(drafters)
    layers_cache: dict[str, Any] = {}

    def factory(name: str) -> Callable[[], Any]:
        if name == "layerskip" and "layers" not in layers_cache:
            layers_cache["layers"] = ",".join(map(str, make_drafter("layerskip", engine).layers))
        return lambda: make_drafter(name, engine, layers=layers_cache.get("layers"))

    def sweep(loads: Sequence[Any], kind: str, prompt_sets: Callable[[Any], Sequence[list[int]]]) -> list[dict]:
        points = []
        for load in loads:
            ps = prompt_sets(load)
            base_tp = None
            for name, g in settings:
                if progress:
                    progress(f"{kind}={load} {name} γ={g}")
                conc = (context_concurrency if kind == "context" else load) if kind != "rate" else None
                rate = load if kind == "rate" else None
                _, m = run_point(model, ps, factory(name), g, max_tokens, conc, rate=rate, eos=eos)
                m.update({"kind": kind, "load": load, "drafter": name, "gamma": g})
                if name == "none":
                    base_tp = m["throughput_tok_s"]
                m["speedup"] = m["throughput_tok_s"] / base_tp if base_tp else None
                if name != "none" and g:
                    m["memory"] = memory_ledger(model, int(round(m["mean_batch"])) or 1, g,
                                                m["peak_candidate_tokens"], max(len(p) for p in ps) + max_tokens + 32)
                points.append(m)
        return points

    def repeat(n: int) -> Sequence[list[int]]:
        return [prompts[i % len(prompts)] for i in range(n)]

    result: dict[str, Any] = {"concurrency": [], "rate": [], "context": [], "crossover": {}}
    result["concurrency"] = sweep(concurrencies, "concurrency", lambda c: repeat(max(2 * c, 4)))
    if rates:
        result["rate"] = sweep(rates, "rate", lambda r: repeat(16))
    if context_lengths:
        result["context"] = sweep(
            context_lengths, "context",
            lambda length: long_context_prompts(engine.loaded, length, context_concurrency),
        )
    for kind in ("concurrency", "rate", "context"):
        for name, g in drafters:
            pts = [p for p in result[kind] if p["drafter"] == name and p["gamma"] == g]
            if pts:
                result["crossover"].setdefault(kind, {})[f"{name} γ={g}"] = crossover(pts)
    return result
