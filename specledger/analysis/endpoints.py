"""The endpoint figures of a run directory, for the report: ``probe.json`` (``specledger probe``),
``vllm_bench.json`` (``specledger import-vllm-bench``) and ``guidellm.json``, per-request results left
out. Pure: the documents as :meth:`specledger.rundir.RunDir.experiments` read them in, views out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specledger.ledger.server_acceptance import NO_ROUNDS_NOTE, VLLM_BENCH_NOTE, acceptance_ledger
from specledger.rundir import json_safe

_SUMMARY_KEYS = (
    "requests_ok",
    "requests_failed",
    "wall_time_s",
    "output_throughput_tok_s",
    "request_throughput_req_s",
    "total_output_tokens",
    "ttft_ms",
    "tpot_ms",
    "pooled_tpot_ms",
    "token_itl_ms",
    "chunk_itl_ms",
    "e2el_ms",
    "tpot_incl_ttft_ms",
    "longest_stall_ms",
    "mean_tokens_per_chunk",
)


def _endpoint_view(report: Mapping[str, Any], role: str) -> dict[str, Any]:
    summary = report.get("summary") or {}
    spec = report.get("spec_decode")
    warnings = list(report.get("warnings") or []) + list((spec or {}).get("warnings") or [])
    return {
        "role": role,
        "url": report.get("url"),
        "model": report.get("model"),
        "summary": {k: summary.get(k) for k in _SUMMARY_KEYS},
        "spec_decode": spec,
        "acceptance_ledger": acceptance_ledger(spec),
        "server_histograms": report.get("server_histograms") or {},
        "warnings": list(dict.fromkeys(warnings)),
    }


def _load_views(loads: Any) -> list[dict[str, Any]]:
    """``probe --loads``: each load's endpoint views and whole-load ratios ([] for a probe at one concurrency)."""
    out = []
    for point in loads if isinstance(loads, list) else []:
        if not isinstance(point, dict) or not isinstance(point.get("probe"), dict):
            continue
        views = [_endpoint_view(point["probe"], "endpoint")]
        if isinstance(point.get("baseline"), dict):
            views.append(_endpoint_view(point["baseline"], "baseline"))
        out.append({"load": point.get("load"), "order": point.get("order"), "endpoints": views,
                    "speedup": point.get("speedup")})
    return out


def endpoint_experiments(documents: Mapping[str, Any]) -> dict[str, Any]:
    """The endpoint figures for the report: ``{"probe": ...}`` from the ``probe.json`` document,
    ``{"vllm_bench": ...}`` from ``vllm_bench.json``'s and ``{"guidellm": ...}`` from ``guidellm.json``'s
    (each only when present; per-request results dropped). ``documents``: the run directory's files by
    :data:`specledger.rundir.ENDPOINT_KEYS` key (other keys are ignored)."""
    out: dict[str, Any] = {}
    probe = documents.get("probe")
    if probe and isinstance(probe.get("probe"), dict):
        views = [_endpoint_view(probe["probe"], "endpoint")]
        if isinstance(probe.get("baseline"), dict):
            views.append(_endpoint_view(probe["baseline"], "baseline"))
        out["probe"] = json_safe({"endpoints": views, "speedup": probe.get("speedup"), "note": NO_ROUNDS_NOTE,
                                  "loads": _load_views(probe.get("loads"))})
    for key in ("vllm_bench", "guidellm"):
        bench = documents.get(key)
        if not bench or not isinstance(bench.get("summary"), dict):
            continue
        summary = bench["summary"]
        out[key] = json_safe(
            {
                "source_file": bench.get("source_file"),
                "summary": {k: summary.get(k) for k in _SUMMARY_KEYS},
                "spec_decode": summary.get("spec_decode"),
                "acceptance_ledger": bench.get("acceptance_ledger") or acceptance_ledger(summary.get("spec_decode")),
                "note": bench.get("note") or VLLM_BENCH_NOTE,
                "version": bench.get("version"),
            }
        )
    return out


__all__ = ["endpoint_experiments"]
