"""Where speculation starts or stops paying in context: a category's per-bucket decisions read as one schedule.

A category decided per context bucket (:mod:`specledger.mainjob.buckets`) has one verdict per bucket. Its
context schedule lists them in length order and names the first bucket edge where the decision turns from a
deployed setting to off (``stops_at_tokens``) or from off to deployed (``starts_at_tokens``), counting only
resolved decisions. No engine the configs target switches speculation by a request's prompt length (vLLM's
``disable_by_batch_size``, SGLang's and llama.cpp's settings are per server or per batch), so the engine note
says to route by length: prompts past the edge to a replica without speculation (or with it, for a start).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specledger.workloads.context_buckets import bucket_range, decision_order, split_key

ROUTE_NOTE = ("no engine switches speculation by prompt length (vLLM, SGLang, llama.cpp, TensorRT-LLM: per server "
              "or per batch only): route prompts of {edge:,}+ tokens to a replica {where}")


def _deployed(v: dict[str, Any]) -> bool:
    return v.get("decision") == "deploy"


def context_schedules(verdicts: Sequence[dict[str, Any]], load: int = 1) -> list[dict[str, Any]]:
    """Per (category, temperature) decided in two or more context buckets at ``load`` (measured verdicts): the
    buckets in length order with their decision, setting, S and E[L], and the resolved turn, if any."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for v in verdicts:
        category, bucket = split_key(str(v.get("category", "")))
        if bucket is None or int(v.get("load") or 1) != load or v.get("simulated"):
            continue
        groups.setdefault((category, float(v.get("temperature") or 0.0)), []).append(v)
    out = []
    for (category, temperature), vs in groups.items():
        if len(vs) < 2:
            continue
        vs = sorted(vs, key=lambda v: decision_order(v["category"]))
        rows = [{"bucket": split_key(v["category"])[1], "decision": v.get("decision"), "setting": v.get("setting"),
                 "speedup": v.get("speedup"), "mean_committed": v.get("mean_committed"),
                 "resolved": bool(v.get("resolved"))} for v in vs]
        entry: dict[str, Any] = {"category": category, "temperature": temperature, "load": load, "buckets": rows,
                                 "stops_at_tokens": None, "starts_at_tokens": None, "engine_note": None}
        for a, b in zip(vs, vs[1:]):
            if not (a.get("resolved") and b.get("resolved")) or _deployed(a) == _deployed(b):
                continue
            edge = bucket_range(split_key(b["category"])[1])[0]
            key = "stops_at_tokens" if _deployed(a) else "starts_at_tokens"
            if entry[key] is None:
                entry[key] = edge
                entry["engine_note"] = ROUTE_NOTE.format(
                    edge=edge, where="without speculation" if _deployed(a) else f"running {b.get('setting')}")
        out.append(entry)
    return out


def context_line(entry: dict[str, Any]) -> str:
    """"long by context: <1k suffix γ=4 S 1.31 E[L] 2.10 · 1-2k off S 0.97 … → stops paying from 2,048 tokens"."""
    cells = []
    for r in entry["buckets"]:
        what = r.get("setting") if r.get("decision") == "deploy" else "off"
        s = f" S {r['speedup']:.2f}" if isinstance(r.get("speedup"), (int, float)) else ""
        el = f" E[L] {r['mean_committed']:.2f}" if isinstance(r.get("mean_committed"), (int, float)) else ""
        cells.append(f"{r['bucket']} {what}{s}{el}" + ("" if r.get("resolved") else " (open)"))
    turn = (f" → stops paying from {entry['stops_at_tokens']:,} tokens" if entry.get("stops_at_tokens") is not None
            else f" → starts paying from {entry['starts_at_tokens']:,} tokens"
            if entry.get("starts_at_tokens") is not None else "")
    return f"  {entry['category']} by context: " + " · ".join(cells) + turn
