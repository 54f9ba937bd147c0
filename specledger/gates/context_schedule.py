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
from typing import TypedDict

from specledger.gates.decision import Verdict, VerdictDict, as_verdict
from specledger.workloads.context_buckets import bucket_range, decision_order, split_key

ROUTE_NOTE = ("no engine switches speculation by prompt length (vLLM, SGLang, llama.cpp, TensorRT-LLM: per server "
              "or per batch only): route prompts of {edge:,}+ tokens to a replica {where}")


class BucketDecision(TypedDict):
    """One context bucket's decision in a context schedule."""

    bucket: str | None  # "1-2k"
    decision: str  # the verdict's
    setting: str | None  # the setting it reports
    speedup: float | None  # its S against plain
    mean_committed: float | None  # E[L]
    resolved: bool


class ContextSchedule(TypedDict):
    """A category decided per context bucket, read along the prompt length (:func:`context_schedules`)."""

    category: str
    temperature: float
    load: int
    buckets: list[BucketDecision]  # in length order
    stops_at_tokens: int | None  # the first bucket edge where a resolved deploy turns resolved off
    starts_at_tokens: int | None  # ... where resolved off turns a resolved deploy
    engine_note: str | None  # how to deploy the turn (route by length)


def context_schedules(verdicts: Sequence[Verdict | VerdictDict], load: int = 1) -> list[ContextSchedule]:
    """Per (category, temperature) decided in two or more context buckets at ``load`` (measured verdicts): the
    buckets in length order with their decision, setting, S and E[L], and the resolved turn, if any."""
    groups: dict[tuple[str, float], list[Verdict]] = {}
    for v in map(as_verdict, verdicts):
        category, bucket = split_key(v.category)
        if bucket is None or v.load_or_solo != load or v.simulated:
            continue
        groups.setdefault((category, float(v.temperature or 0.0)), []).append(v)
    out = []
    for (category, temperature), vs in groups.items():
        if len(vs) < 2:
            continue
        vs = sorted(vs, key=lambda v: decision_order(v.category))
        rows: list[BucketDecision] = [
            {"bucket": split_key(v.category)[1], "decision": v.decision, "setting": v.setting, "speedup": v.speedup,
             "mean_committed": v.mean_committed, "resolved": bool(v.resolved)} for v in vs]
        entry: ContextSchedule = {"category": category, "temperature": temperature, "load": load, "buckets": rows,
                                  "stops_at_tokens": None, "starts_at_tokens": None, "engine_note": None}
        for a, b in zip(vs, vs[1:]):
            if not (a.resolved and b.resolved) or a.deploys == b.deploys:
                continue
            edge = bucket_range(split_key(b.category)[1])[0]
            key = "stops_at_tokens" if a.deploys else "starts_at_tokens"
            if entry[key] is None:
                entry[key] = edge
                entry["engine_note"] = ROUTE_NOTE.format(
                    edge=edge, where="without speculation" if a.deploys else f"running {b.setting}")
        out.append(entry)
    return out


def context_line(entry: ContextSchedule) -> str:
    """"long by context: <1k suffix γ=4 S 1.31 E[L] 2.10 · 1-2k off S 0.97 … → stops paying from 2,048 tokens"."""
    cells = []
    for r in entry["buckets"]:
        v = as_verdict(r)  # a bucket's row: its verdict's own keys, and the bucket
        what = v.setting if v.deploys else "off"
        s = f" S {v.speedup:.2f}" if isinstance(v.speedup, (int, float)) else ""
        el = f" E[L] {v.mean_committed:.2f}" if isinstance(v.mean_committed, (int, float)) else ""
        cells.append(f"{r['bucket']} {what}{s}{el}" + ("" if v.resolved else " (open)"))
    turn = (f" → stops paying from {entry['stops_at_tokens']:,} tokens" if entry.get("stops_at_tokens") is not None
            else f" → starts paying from {entry['starts_at_tokens']:,} tokens"
            if entry.get("starts_at_tokens") is not None else "")
    return f"  {entry['category']} by context: " + " · ".join(cells) + turn
