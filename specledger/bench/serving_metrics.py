"""The serving experiment's figures per point and across points: throughput of successful requests
(output tokens / wall time), TTFT, TPOT, token- and chunk-level ITL, longest stall, tokens per
chunk, mean batch, preemptions, E[L] (committed tokens per full round); crossovers (the lowest load
at which a setting's speed-up over plain falls below 1); repeats pooled, paired-repeat ratios with
t-intervals, and dynamic policies against the best static γ in hindsight."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from specledger.analysis.metrics import latency_stats
from specledger.bench.serving_types import (
    ContextCrossoverDict,
    ContextPositionDict,
    PolicyVsStaticDict,
    RepeatDict,
    ServingPointDict,
    SpeedupDict,
)
from specledger.engine.batch import BatchEngine
from specledger.engine.drafters.catalog import PLAIN
from specledger.records import RequestRecord, setting_label


def point_metrics(records: Sequence[RequestRecord], wall_s: float, engine: BatchEngine) -> ServingPointDict:
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


def crossover(points: Sequence[ServingPointDict], key: str = "load") -> float | None:
    """The lowest load whose speed-up (throughput ratio vs plain at that load) is below 1, or None."""
    for p in sorted(points, key=lambda p: p[key]):
        if p.get("speedup") is not None and p["speedup"] < 1.0:
            return p[key]
    return None


def load_group(p: ServingPointDict) -> tuple:
    """What a point is compared within: its kind and load, and for a context point also its source
    and concurrency (a context grid has several points per length)."""
    if p.get("kind") == "context":
        return (p["kind"], p["load"], p.get("source"), p.get("concurrency"))
    return (p["kind"], p["load"])


def context_position(p: ServingPointDict) -> ContextPositionDict:
    """A context point's source and concurrency (empty for other kinds)."""
    return {"source": p.get("source"), "concurrency": p.get("concurrency")} if p.get("kind") == "context" else {}


def context_crossover(points: Sequence[ServingPointDict], drafters: Sequence[tuple[str, Any]]
                      ) -> list[ContextCrossoverDict]:
    """How the crossover moves with context length: for every source and length of a context grid,
    each drafter's concurrency crossover (the lowest concurrency with speed-up < 1; None = never
    below 1 over the concurrencies measured) and its speed-up at each concurrency."""
    rows: list[ContextCrossoverDict] = []
    keys = sorted({(p.get("source"), p["load"]) for p in points}, key=lambda k: (str(k[0]), k[1]))
    for source, length in keys:
        for name, g in drafters:
            pts: list[ServingPointDict] = [{**p, "load": p["concurrency"]} for p in points if p.get("source") == source
                   and p["load"] == length and p["drafter"] == name and p["gamma"] == g]
            if pts:
                rows.append({"source": source, "length": length, "setting": setting_label(name, g),
                             "crossover_concurrency": crossover(pts),
                             "speedup_by_concurrency": {str(p["load"]): p.get("speedup")
                                                        for p in sorted(pts, key=lambda p: p["load"])}})
    return rows


def pool_repeats(runs: Sequence[tuple[ServingPointDict, list[RequestRecord]]]
                 ) -> tuple[ServingPointDict, list[RequestRecord]]:
    """One point from its repeats: totals summed (throughput = Σ tokens / Σ wall), latency
    percentiles over every request of every repeat, step means averaged, peaks maxed, preemptions
    summed; ``repeats`` keeps each repeat's tokens, wall and throughput."""
    ms = [m for m, _ in runs]
    records = [r for _, recs in runs for r in recs]
    m: ServingPointDict
    if len(ms) == 1:
        m = ms[0].copy()
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


def paired_repeat_ratios(a: Sequence[RepeatDict] | Sequence[ServingPointDict],
                         b: Sequence[RepeatDict] | Sequence[ServingPointDict]
                         ) -> tuple[list[float], list[float] | None]:
    """Per-repeat throughput ratios a_r / b_r (repeat r of both served the same requests) and their
    95% t-interval (None with fewer than two)."""
    from specledger.analysis.stats import log_ratio_t_interval

    ratios = [x["throughput_tok_s"] / y["throughput_tok_s"] for x, y in zip(a, b) if y["throughput_tok_s"]]
    low, high = log_ratio_t_interval(ratios)
    return ratios, ([low, high] if math.isfinite(low) else None)


def speedup_over(runs: Sequence[tuple[ServingPointDict, Any]], base: Sequence[tuple[ServingPointDict, Any]]
                 ) -> SpeedupDict:
    """Speed-up of a setting over plain at the same load: pooled throughput ratio, the per-repeat
    paired ratios (repeat r of both served the same requests) and their 95% t-interval."""
    tok = sum(m["tokens"] for m, _ in runs)
    wall = sum(m["wall_s"] for m, _ in runs)
    btok = sum(m["tokens"] for m, _ in base)
    bwall = sum(m["wall_s"] for m, _ in base)
    point = (tok / wall) / (btok / bwall) if wall > 0 and bwall > 0 and btok > 0 else None
    ratios, ci = paired_repeat_ratios([m for m, _ in runs], [b for b, _ in base])
    return {"speedup": point, "speedup_repeats": ratios, "speedup_ci": ci}


def policy_vs_static(points: Sequence[ServingPointDict]) -> list[PolicyVsStaticDict]:
    """Each dynamic policy against the best static choice in hindsight at the same load.

    Candidates: plain decoding (γ = 0) and every static γ of the policy's drafter; "best" = the
    highest pooled throughput at that load. ratio = pooled throughput of the policy / the best's,
    with the 95% t-interval over the per-repeat paired ratios. ``at_least_as_good`` holds when the
    interval reaches 1 (within noise) or the point ratio is >= 1; with one repeat only the point
    ratio decides and ``ci`` is None. Picking the best of several noisy statics flatters it, so
    this is a conservative test of the policy."""
    rows: list[PolicyVsStaticDict] = []
    by_load: dict[tuple, list[ServingPointDict]] = {}
    for p in points:
        by_load.setdefault(load_group(p), []).append(p)
    for group, pts in by_load.items():
        kind, load = group[0], group[1]
        for pol in (p for p in pts if isinstance(p["gamma"], str)):
            statics = [p for p in pts if p["drafter"] == PLAIN.name or (p["drafter"] == pol["drafter"]
                                                                        and isinstance(p["gamma"], int))]
            if not statics:
                continue
            best = max(statics, key=lambda p: p["throughput_tok_s"])
            ratio = pol["throughput_tok_s"] / best["throughput_tok_s"] if best["throughput_tok_s"] else None
            per, ci = paired_repeat_ratios(pol.get("repeats", []), best.get("repeats", []))
            ok = ratio is not None and (ratio >= 1.0 or (ci is not None and ci[1] >= 1.0))
            rows.append({"kind": kind, "load": load, **context_position(pol), "policy": pol["setting"],
                         "best_static": best["setting"],
                         "ratio": ratio, "ci": ci, "repeats": len(per), "ratios": per, "at_least_as_good": ok,
                         "policy_speedup": pol.get("speedup"), "best_static_speedup": best.get("speedup")})
    return rows
