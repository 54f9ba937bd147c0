"""The endpoint figures of a run directory, for the report: ``probe.json`` (``specledger probe``)
and ``vllm_bench.json`` (``specledger import-vllm-bench``), per-request results left out."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specledger.probe.acceptance import NO_ROUNDS_NOTE, VLLM_BENCH_NOTE, acceptance_ledger
from specledger.rundir import GUIDELLM_JSON, PROBE_JSON, VLLM_BENCH_JSON, json_safe, read_json

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


def _read_object(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    loaded = read_json(path, "re-run the probe/import or delete it")
    return loaded if isinstance(loaded, dict) else None


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


def endpoint_experiments(run_dir: str | Path) -> dict[str, Any]:
    """The endpoint figures of ``run_dir`` for the report: ``{"probe": ...}`` from ``probe.json`` and
    ``{"vllm_bench": ...}`` from ``vllm_bench.json`` and ``{"guidellm": ...}`` from ``guidellm.json`` (each only
    when present; per-request results dropped)."""
    run_dir = Path(run_dir)
    out: dict[str, Any] = {}
    probe = _read_object(run_dir / PROBE_JSON)
    if probe and isinstance(probe.get("probe"), dict):
        views = [_endpoint_view(probe["probe"], "endpoint")]
        if isinstance(probe.get("baseline"), dict):
            views.append(_endpoint_view(probe["baseline"], "baseline"))
        out["probe"] = json_safe({"endpoints": views, "speedup": probe.get("speedup"), "note": NO_ROUNDS_NOTE,
                                  "loads": _load_views(probe.get("loads"))})
    for name, key in ((VLLM_BENCH_JSON, "vllm_bench"), (GUIDELLM_JSON, "guidellm")):
        bench = _read_object(run_dir / name)
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
