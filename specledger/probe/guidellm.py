"""Read a guidellm report (``guidellm benchmark --output-path report.json``; ``guidellm run`` writes the
same with ``--output kind=json``) into the probe's summary keys.

Field names follow guidellm 0.8.1's pydantic schema, report schema ``metadata.version`` 2
(``guidellm/benchmark/schemas/report.py``: ``GenerativeBenchmarksReport{metadata, config, benchmarks}``;
``benchmark.py``: ``GenerativeBenchmark{config, metrics, requests, duration, ...}``; ``metrics.py``:
``GenerativeMetrics``; ``schemas/base/statistics.py``: ``StatusDistributionSummary`` =
``{successful, incomplete, errored, total}`` of ``DistributionSummary{mean, median, min, max, count,
total_sum, percentiles{p50, p95, p99, ...}}``; ``schemas/base/request_stats.py``: per-request
``GenerativeRequestStats`` with computed fields dumped). Only successful requests' distributions are read.

Definitions differ from the probe's, and are mapped by meaning, not by name:

* guidellm's ``inter_token_latency_ms`` of a request = (last token - first token) / (output tokens - 1):
  that is the probe's per-request **TPOT** (``tpot_ms``);
* guidellm's ``time_per_output_token_ms`` = (last token - request start) / output tokens includes the TTFT;
  kept apart as ``tpot_incl_ttft_ms``;
* ``output_tokens_per_iteration`` = output tokens / streaming iterations (SSE chunks) of a request: the
  chunking that speculation causes. ``mean_tokens_per_chunk`` is pooled over the per-request records
  (Σ output tokens / Σ token iterations) when the report holds them, else guidellm's mean over requests;
* ``request_latency`` is in seconds (shown in ms as ``e2el_ms``); the throughputs are the means of
  guidellm's rate distributions (``output_tokens_per_second``, ``requests_per_second``).

guidellm 0.2 / 0.3 reports (``src/guidellm/benchmark/benchmark.py`` of those releases: no ``metadata``, the
strategy under ``args.strategy``, the request counts in the benchmark's own ``request_totals``, no
``output_tokens_per_iteration``) are read with the same keys: their tokens per chunk are not measured (None).

guidellm measures from the client only: there are no spec-decode counters in its report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specledger.errors import SpecLedgerError
from specledger.probe.documents import EndpointSummary, LatencyFigures

NO_SPEC_NOTE = "not in a guidellm report: it measures from the client (tokens per streaming iteration shown)"


def _number(value: Any) -> float | None:
    """``value`` as a finite float; None for anything else (a bool, NaN, ±inf, an int past the float range)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int such as 10**400
        return None
    return number if math.isfinite(number) else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number.is_integer() else None


def _object(value: Any, where: str) -> dict[str, Any]:  # a part of the report, as decoded
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecLedgerError(f"{where} must be an object, got {type(value).__name__}; pass a guidellm JSON report")
    return value


def distribution(metrics: Mapping[str, Any], key: str, scale: float = 1.0, where: str = "") -> LatencyFigures:
    """``metrics[key].successful`` -> {mean, p50, p95, p99, n}, times ``scale``; every figure None if absent."""
    summary = _object(_object(metrics.get(key), f"{where}metrics.{key}").get("successful"),
                      f"{where}metrics.{key}.successful")
    pct = _object(summary.get("percentiles"), f"{where}metrics.{key}.successful.percentiles")

    def scaled(value: Any) -> float | None:
        number = _number(value)
        return None if number is None else number * scale

    return {"mean": scaled(summary.get("mean")), "p50": scaled(summary.get("median", pct.get("p50"))),
            "p95": scaled(pct.get("p95")), "p99": scaled(pct.get("p99")), "n": _number(summary.get("count"))}


def _pooled_tokens_per_iteration(requests: list[Any]) -> float | None:
    """Σ output tokens / Σ token iterations over per-request records that have both."""
    tokens = iterations = 0.0
    for r in requests:
        if not isinstance(r, dict):
            continue
        out = _number(r.get("output_tokens"))
        info = r.get("info") if isinstance(r.get("info"), dict) else {}
        timings = info.get("timings") if isinstance(info.get("timings"), dict) else {}
        its = _number(timings.get("token_iterations"))
        if out is not None and its:
            tokens, iterations = tokens + out, iterations + its
    return tokens / iterations if iterations > 0 else None


def benchmark_summary(bench: Any, index: int) -> EndpointSummary:
    """One guidellm benchmark -> the probe's summary keys (see the module docstring)."""
    where = f"benchmarks[{index}]."
    bench = _object(bench, f"benchmarks[{index}]")
    metrics = _object(bench.get("metrics"), f"{where}metrics")
    totals = _object(metrics.get("request_totals"), f"{where}metrics.request_totals") \
        or _object(bench.get("request_totals"), f"{where}request_totals")  # guidellm 0.2 / 0.3
    requests = _object(bench.get("requests"), f"{where}requests")
    successful = requests.get("successful") if isinstance(requests.get("successful"), list) else []
    per_iteration = distribution(metrics, "output_tokens_per_iteration", where=where)
    pooled = _pooled_tokens_per_iteration(successful)
    settings = "config" if bench.get("config") is not None else "args"  # guidellm 0.2 / 0.3: args
    strategy = _object(_object(bench.get(settings), f"{where}{settings}").get("strategy"),
                       f"{where}{settings}.strategy")
    output_tokens = _object(_object(metrics.get("output_token_count"), "").get("successful"), "")
    return {
        "source": "guidellm",
        "strategy": strategy.get("type_") if isinstance(strategy.get("type_"), str) else None,
        "requests_ok": _int(totals.get("successful")),
        "requests_failed": _int(totals.get("errored")),
        "requests_incomplete": _int(totals.get("incomplete")),
        "wall_time_s": _number(bench.get("duration")),
        "output_throughput_tok_s": distribution(metrics, "output_tokens_per_second", where=where)["mean"],
        "request_throughput_req_s": distribution(metrics, "requests_per_second", where=where)["mean"],
        "total_output_tokens": _number(output_tokens.get("total_sum")),
        "ttft_ms": distribution(metrics, "time_to_first_token_ms", where=where),
        "tpot_ms": distribution(metrics, "inter_token_latency_ms", where=where),
        "tpot_incl_ttft_ms": distribution(metrics, "time_per_output_token_ms", where=where),
        "e2el_ms": distribution(metrics, "request_latency", 1e3, where=where),
        "mean_tokens_per_chunk": pooled if pooled is not None else per_iteration["mean"],
        "tokens_per_chunk_per_request": per_iteration,
        "per_request_records": len(successful),
        "spec_decode": None,
        "spec_decode_note": NO_SPEC_NOTE,
    }


def parse_guidellm(obj: Any, source: str = "guidellm report") -> list[EndpointSummary]:
    """A decoded report -> one summary per benchmark; SpecLedgerError names the first bad field."""
    if not isinstance(obj, dict) or not isinstance(obj.get("benchmarks"), list):
        raise SpecLedgerError(f"{source}: not a guidellm report (no 'benchmarks' list); pass the JSON guidellm wrote")
    if not obj["benchmarks"]:
        raise SpecLedgerError(f"{source}: the guidellm report holds no benchmark")
    try:
        return [benchmark_summary(b, i) for i, b in enumerate(obj["benchmarks"])]
    except SpecLedgerError as exc:
        raise SpecLedgerError(f"{source}: {exc}") from None


def guidellm_version(obj: Mapping[str, Any]) -> str | None:
    """``metadata.guidellm_version`` (and the schema version) where the report states them."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    version = meta.get("guidellm_version")
    schema = meta.get("version")
    if not isinstance(version, str):
        return None
    return f"guidellm {version}" + (f" (report schema {schema})" if isinstance(schema, int) else "")


def load_guidellm(path: str | Path) -> tuple[dict[str, Any], list[EndpointSummary]]:
    """(decoded report as the file holds it, summaries) of a file; unreadable or malformed -> one-line
    SpecLedgerError."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecLedgerError(f"cannot read guidellm report {path}: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise SpecLedgerError(f"{path} is not JSON ({exc}); pass the report guidellm wrote as JSON") from None
    return obj, parse_guidellm(obj, str(path))


__all__ = ["benchmark_summary", "distribution", "guidellm_version", "load_guidellm", "parse_guidellm"]
