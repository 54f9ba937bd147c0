"""The capacity gate. At load 1: peak memory within ``max_memory_mb`` if both are known (the paired tokens/s is
the speed-up's own test). At a load > 1: goodput (requests/s meeting every SLO, DistServe)
at least plain's at the same load, KV capacity (candidate reservation B·γ·m_KV included, a tree's by its
nodes: B·N·m_KV) at least the load, CPU-seconds per 1k committed tokens within ``max_cpu_s_per_1k_tokens`` when set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specledger.gates.result import FAIL, NOT_ASSESSED, PASS, GateResult
from specledger.gates.slo import SLO
from specledger.ledger.memory import candidate_tokens
from specledger.records import RequestRecord


def capacity_gate(
    tokens_per_s: float | None,
    baseline_tokens_per_s: float | None,
    memory_bytes: float | None,
    slo: SLO = SLO(),
) -> GateResult:
    """At load 1: peak memory within ``max_memory_mb`` when both are known; the paired throughput is shown as
    evidence but judged by the decision's paired speed-up test (:mod:`specledger.analysis.paired`), not here --
    a throughput check without an interval would call a noisy S of 0.98 a decided failure."""
    if tokens_per_s is None or baseline_tokens_per_s is None:
        return GateResult("capacity", NOT_ASSESSED, "no paired baseline throughput")
    ok = True
    evidence = f"{tokens_per_s:.1f} tok/s vs plain {baseline_tokens_per_s:.1f} tok/s"
    if memory_bytes is not None:
        mb = memory_bytes / 2**20
        if slo.max_memory_mb is not None:
            ok = ok and mb <= slo.max_memory_mb
            evidence += (f"; peak memory {mb:.0f} MiB {'≤' if mb <= slo.max_memory_mb else '>'} "
                         f"{slo.max_memory_mb:g} MiB")
        else:
            evidence += f"; peak memory {mb:.0f} MiB (no limit set)"
    return GateResult("capacity", PASS if ok else FAIL, evidence)


def meets_slo(r: RequestRecord, slo: SLO = SLO()) -> bool:
    """One request meets every per-request SLO (DistServe's goodput unit): TTFT, TPOT (against the
    P99 target) and its longest stall."""
    from specledger.analysis.metrics import chunk_gaps, tpot

    if r.ttft * 1e3 > slo.ttft_p99_ms:
        return False
    per_token = tpot(r.ttft, r.total_time, r.output_tokens)
    if per_token is not None and per_token * 1e3 > slo.tpot_p99_ms:
        return False
    gaps = chunk_gaps(r.token_times, r.chunks) if r.token_times else []
    return not gaps or max(gaps) * 1e3 <= slo.stall_ms


def _point(records: Sequence[RequestRecord], key: str) -> float | None:
    values = {float(r.extra[key]) for r in records if isinstance(r.extra.get(key), (int, float))}
    return sum(values) if values else None  # one point per setting and load: one value


def goodput(records: Sequence[RequestRecord], slo: SLO = SLO()) -> tuple[float | None, int, int]:
    """(requests meeting every SLO per second of their point's wall time, met, of)."""
    wall = _point(records, "point_wall_s")
    met = sum(meets_slo(r, slo) for r in records)
    return (met / wall if wall else None), met, len(records)


def cpu_per_1k_tokens(records: Sequence[RequestRecord]) -> float | None:
    """CPU-seconds per 1k committed tokens of the point(s) the records come from."""
    cpu, tokens = _point(records, "point_cpu_s"), _point(records, "point_tokens")
    return 1e3 * cpu / tokens if cpu is not None and tokens else None


def kv_capacity(records: Sequence[RequestRecord], gamma: int, meta: dict[str, Any], slo: SLO = SLO()
                ) -> tuple[int | None, str]:
    """The largest concurrency whose KV fits the memory budget (``slo.max_memory_mb``, else the machine's
    memory) after the weights: per request context · (m_KV + draft m_KV) + n · m_KV, context = the longest
    prompt + output of the records, n the candidates' KV slots per round (:func:`candidate_tokens`: γ for a
    chain, the tree's nodes -- the records' ``tree_budget`` -- for a tree, every node written whatever the
    depth). (None, why) when m_KV is unknown."""
    m_kv = meta.get("kv_bytes_per_token")
    budget = slo.max_memory_mb * 2**20 if slo.max_memory_mb is not None else meta.get("memory_total_bytes")
    if not isinstance(m_kv, (int, float)) or not m_kv or not isinstance(budget, (int, float)) or not records:
        return None, "KV capacity not assessed (no m_KV or memory budget in run.json)"
    draft_kv = max((float(r.extra.get("draft_kv_bytes_per_token") or 0) for r in records), default=0.0)
    draft_w = max((float(r.extra.get("draft_weight_bytes") or 0) for r in records), default=0.0)
    weights = float(meta.get("weight_bytes") or 0) + draft_w
    context = max(r.prompt_tokens + r.output_tokens for r in records)
    nodes = max(int(r.tree_budget or 0) for r in records)
    slots = candidate_tokens(gamma, nodes)
    per_request = context * (m_kv + draft_kv) + slots * m_kv
    fits = max(int((budget - weights) // per_request), 0)
    where = f"{slo.max_memory_mb:g} MiB SLO" if slo.max_memory_mb is not None else "machine memory"
    term = f"{nodes} tree nodes·m_KV" if nodes else "γ·m_KV"
    return fits, (f"KV fits {fits:,} concurrent ({context} tokens × {(m_kv + draft_kv) / 1024:.1f} KiB"
                  + (f" + {term} {slots * m_kv / 1024:.1f} KiB" if slots else "")
                  + f" per request, {budget / 2**30:.1f} GiB {where} less {weights / 2**20:.0f} MiB weights)")


def load_capacity_gate(spec: Sequence[RequestRecord], base: Sequence[RequestRecord], gamma: int, load: int,
                       meta: dict[str, Any], slo: SLO = SLO()) -> GateResult:
    """At a load > 1: goodput (requests/s meeting every SLO, DistServe) at least plain's at the same
    load; KV capacity (candidate reservation B·γ·m_KV included, B·nodes·m_KV for a tree) at least the load;
    CPU-seconds per 1k committed tokens, within ``slo.max_cpu_s_per_1k_tokens`` when set."""
    g, met, of = goodput(spec, slo)
    bg, bmet, bof = goodput(base, slo)
    if g is None or bg is None:
        return GateResult("capacity", NOT_ASSESSED, "no paired plain point at this load")
    fails, parts = [], [f"goodput {g:.2f} req/s ({met}/{of} met the SLO) {'≥' if g >= bg else '<'} "
                        f"plain {bg:.2f} ({bmet}/{bof})"]
    empty = met == 0 and bmet == 0  # no request met the SLO on either side: goodput compares nothing
    if empty:
        parts[0] = f"goodput not assessed: 0/{of} requests met the SLO, plain 0/{bof}"
    elif g < bg:
        fails.append("goodput")
    fits, text = kv_capacity(spec, gamma, meta, slo)
    parts.append(text + (f" {'≥' if fits >= load else '<'} load {load}" if fits is not None else ""))
    if fits is not None and fits < load:
        fails.append("KV")
    cpu, bcpu = cpu_per_1k_tokens(spec), cpu_per_1k_tokens(base)
    if cpu is not None:
        lim = slo.max_cpu_s_per_1k_tokens
        parts.append(f"{cpu:.1f} CPU-s per 1k tokens (plain {bcpu:.1f})" if bcpu is not None
                     else f"{cpu:.1f} CPU-s per 1k tokens")
        if lim is not None:
            parts[-1] += f" {'≤' if cpu <= lim else '>'} {lim:g}"
            if cpu > lim:
                fails.append("CPU cost")
    return GateResult("capacity", FAIL if fails else NOT_ASSESSED if empty else PASS, "; ".join(parts))
