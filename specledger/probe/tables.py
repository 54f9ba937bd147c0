"""The rows of the tables ``probe``, ``import`` and ``inspect`` print, as plain text: figures formatted, one
column per endpoint or result, warnings apart. The command prints them (escaped with
:func:`specledger.probe.safe_text.safe`: every value may come from a server or a file); nothing here draws."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specledger.probe.counters import engine_counters_over
from specledger.probe.documents import EndpointReport, EndpointSummary, LatencyFigures, SpecDecodeDoc, Speedup
from specledger.probe.endpoint_loads import LoadPoint
from specledger.probe.engine_command import BASELINE_SPEC
from specledger.probe.imports import Imported
from specledger.probe.inspect_file import InspectResult
from specledger.probe.launch_runs import SpecRun, point_windows, pooled_ledger
from specledger.probe.outputs import GUIDELLM_KIND, VLLM_BENCH_KIND
from specledger.records import GammaSpec

#: a figure longer than this is cut in a table cell (a 10**400 count is a number, not a screenful)
MAX_CELL = 80
NO_METRICS_REASON = "not measured (--no-metrics or no /metrics)"
#: what ``import`` and ``inspect`` say they found
FORMAT_NAMES = {VLLM_BENCH_KIND: "vllm bench serve result", GUIDELLM_KIND: "guidellm report",
                "prometheus": "Prometheus /metrics dump", "sse": "SSE stream capture",
                "completion": "non-streamed reply",
                "vllm-bench": "vllm bench serve result"}
Rows = list[tuple[str, str]]


def fmt(value: Any, digits: int = 2) -> str:
    """A figure as plain text (escaped for the terminal by the command that prints it)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return _big_int(value)
    return str(value)


def _big_int(value: int) -> str:
    """An int as digits, or ``~1.0e400`` past :data:`MAX_CELL` digits (no 4300-digit str() limit applies)."""
    if value.bit_length() < 200:
        return str(value)
    digits = int(value.bit_length() * 0.30103)  # log10(2): the exponent within one
    return f"{'-' if value < 0 else ''}~1e{digits} (an integer of about {digits + 1} digits)"


def _pcts(block: LatencyFigures | None) -> str:
    block = block or {}
    return " / ".join(fmt(block.get(k)) for k in ("p50", "p95", "p99"))


def summary_rows(summary: EndpointSummary) -> Rows:
    """(label, value) rows shared by probe and vllm-bench tables."""
    return [
        (
            "requests ok / failed",
            f"{fmt(summary.get('requests_ok'))} / {fmt(summary.get('requests_failed'))}",
        ),
        ("errors", ", ".join(f"{k}: {v}" for k, v in (summary.get("errors") or {}).items()) or "-"),
        ("wall time (s)", fmt(summary.get("wall_time_s"))),
        ("output throughput (tok/s)", fmt(summary.get("output_throughput_tok_s"))),
        ("request throughput (req/s)", fmt(summary.get("request_throughput_req_s"), 3)),
        ("TTFT p50/p95/p99 (ms)", _pcts(summary.get("ttft_ms"))),
        ("TPOT p50/p95/p99 (ms)", _pcts(summary.get("tpot_ms"))),
        ("pooled TPOT (ms)", fmt(summary.get("pooled_tpot_ms"))),
        ("token ITL p50/p95/p99 (ms)", _pcts(summary.get("token_itl_ms"))),
        ("chunk ITL p50/p95/p99 (ms)", _pcts(summary.get("chunk_itl_ms"))),
        ("longest stall (ms)", fmt(summary.get("longest_stall_ms"))),
        ("tokens per chunk", fmt(summary.get("mean_tokens_per_chunk"))),
    ] + optional_rows(summary)


def optional_rows(summary: EndpointSummary) -> Rows:
    """Rows only some sources have: goodput (vllm bench), llama.cpp's per-response draft counts."""
    rows = []
    if (goodput := summary.get("request_goodput_req_s")) is not None:
        rows.append(("request goodput (req/s)", fmt(goodput, 3)))
    timings = summary.get("response_timings")
    if timings:
        rows.append((
            "llama.cpp timings: accepted / drafted",
            f"{fmt(timings.get('num_accepted_tokens'), 0)} / {fmt(timings.get('num_draft_tokens'), 0)}"
            f" = {fmt(timings.get('draft_acceptance_rate'), 3)} over {timings.get('responses')} responses",
        ))
    return rows


def spec_rows(spec: SpecDecodeDoc | None, missing: str = NO_METRICS_REASON) -> Rows:
    """Spec-decode rows; ``missing`` says why there are none (it depends on where the figures come from)."""
    if not spec:
        return [("spec decode", missing)]
    rows = [("spec-decode source", fmt(spec.get("source")))]
    if spec.get("off"):
        rows.append(("spec decode", "off (the server's gauges say so)"))
    for key, label in (
        ("num_drafts", "draft rounds"),
        ("mean_acceptance_length", "pooled acceptance length (1 + Σacc/Σdrafts)"),
        ("draft_acceptance_rate", "draft acceptance rate (acc/draft tokens)"),
        ("sglang_accept_length", "SGLang accept length (gauge, bonus inside)"),
        ("sglang_accept_rate", "SGLang accept rate (gauge)"),
    ):
        if (value := spec.get(key)) is not None:
            rows.append((label, fmt(value, 3)))
    if rates := spec.get("per_position_rates"):
        rows.append(("Pr(K>=i), i=1..", " ".join(fmt(r, 3) for r in rates)))
        rows.append(("conditional a_i", " ".join(fmt(r, 3) for r in spec["conditional_rates"])))
    rows.extend(("warning", w) for w in spec.get("warnings") or [])
    return rows


def report_table(columns: Mapping[str, EndpointReport]
                 ) -> tuple[list[str], dict[str, dict[str, str]], list[tuple[str, str]]]:
    """(row labels, {column: {label: value}}, (column, warning) pairs) of one table with a column per endpoint
    or result (``columns``: name -> report with ``summary``, ``spec_decode``, ``spec_decode_note``,
    ``warnings``); warnings deduplicated, in order."""
    per_column: dict[str, dict[str, str]] = {}
    warnings: list[tuple[str, str]] = []
    for name, report in columns.items():
        missing = report.get("spec_decode_note") or NO_METRICS_REASON
        rows = summary_rows(report["summary"]) + spec_rows(report.get("spec_decode"), missing)
        per_column[name] = {label: value for label, value in rows if label != "warning"}
        warnings += [(name, value) for label, value in rows if label == "warning"]
        warnings += [(name, w) for w in report.get("warnings") or []]
    labels = list(dict.fromkeys(label for rows in per_column.values() for label in rows))
    return labels, per_column, list(dict.fromkeys((str(n), str(w)) for n, w in warnings))


def ratio_rows(ratios: Speedup) -> Rows:
    """The speed-up rows under a table with a baseline."""
    return [("speed-up: throughput ratio", fmt(ratios.get("throughput_ratio"), 3)),
            ("speed-up: TPOT ratio (base/cand)", fmt(ratios.get("tpot_ratio"), 3))]


def result_column(summary: EndpointSummary) -> EndpointReport:
    """An imported or inspected result as a table column (its figures, no endpoint warnings)."""
    return {"summary": summary, "spec_decode": summary.get("spec_decode"),
            "spec_decode_note": summary.get("spec_decode_note"), "warnings": []}


def import_columns(documents: Sequence[Imported], kind: str) -> dict[str, EndpointReport]:
    """One column per imported document: ``result N`` with several, the format's name with one."""
    return {(f"result {index}" if len(documents) > 1 else kind): result_column(document["summary"])
            for index, _, document in documents}


def import_el_lines(documents: Sequence[Imported]) -> list[str]:
    """``E[L]`` from the per-position rates of every document whose acceptance ledger has it."""
    lines = []
    for index, _, document in documents:
        el = document["acceptance_ledger"].get("el_from_per_position")
        if isinstance(el, (int, float)):
            lines.append(f"result {index}: E[L] = 1 + Σ Pr(K ≥ i) from the per-position rates: {el:.3f}")
    return lines


def inspect_columns(found: InspectResult) -> dict[str, EndpointReport]:
    """The benchmark results ``inspect`` found, one column each (none for a dump or a stream capture)."""
    records = found["records"] if found["format"] == "vllm-bench" or found["format"] == "guidellm" else []
    return {f"result {i}": result_column(r) for i, r in enumerate(records, start=1)}


def inspect_rows(found: InspectResult) -> Rows:
    """Rows of a dump or a stream capture (benchmark results are shown as a result table instead)."""
    rows: Rows = []
    if found["format"] == "prometheus":
        rows += spec_rows(found.get("spec_decode"), "none in this dump")
        for key, h in (found.get("latency") or {}).items():
            rows.append((f"{key} ({h['metric']})",
                         f"mean {fmt(h['mean_s'], 4)} s, p50/p95/p99 {fmt(h['p50_s'], 4)} / {fmt(h['p95_s'], 4)}"
                         f" / {fmt(h['p99_s'], 4)} s over {fmt(h['count'], 0)}: {h['definition']}"))
        for label, rate in (found.get("rates") or {}).items():
            rows.append((label, fmt(rate["value"])))
    elif found["format"] == "sse":
        for key, value in found["stream"].items():
            rows.append((key.replace("_", " "), fmt(value) if not isinstance(value, list)
                         else ", ".join(map(str, value))))
        rows += optional_rows({"response_timings": found.get("spec_decode")})
    return [(label, value) for label, value in rows if label != "warning"] + [
        ("warning", value) for label, value in rows if label == "warning"]


# ------------------------------------------------------------------------------- probe --loads / --launch
def _load_cells(report: EndpointReport) -> list[str]:
    """Throughput, TTFT P99, TPOT P50, ok / failed of one endpoint at one load."""
    s = report["summary"]
    return [fmt(s.get("output_throughput_tok_s"), 1), fmt((s.get("ttft_ms") or {}).get("p99"), 1),
            fmt((s.get("tpot_ms") or {}).get("p50"), 1), f"{s.get('requests_ok')} / {s.get('requests_failed')}"]


def loads_table(points: Sequence[LoadPoint]) -> tuple[list[str], list[list[str]]]:
    """(columns, rows) of ``probe --loads``: one row per load, each endpoint's throughput, TTFT P99 and TPOT
    P50, the throughput ratio and which endpoint went first."""
    base = any("baseline" in p.full for p in points)
    columns = ["load", "tok/s", "TTFT P99 ms", "TPOT P50 ms", "ok / failed"] + (
        ["plain tok/s", "plain TTFT P99 ms", "plain TPOT P50 ms", "plain ok / failed", "tok/s ratio", "first"]
        if base else [])
    rows = []
    for p in points:
        row = [str(p.load), *_load_cells(p.full["probe"])]
        if base and "baseline" in p.full:
            ratios = p.full.get("speedup")
            row += [*_load_cells(p.full["baseline"]), fmt(ratios.get("throughput_ratio") if ratios else None, 3),
                    "endpoint" if p.order[0] == "probe" else "baseline"]
        rows.append(row)
    return columns, rows


def loads_warnings(points: Sequence[LoadPoint]) -> list[tuple[int, str, str]]:
    """(load, role, warning) of every endpoint at every load, in the order they ran."""
    return [(p.load, role, w) for p in points for role in p.order for w in p.full[role].get("warnings", [])]


LAUNCH_COLUMNS = ("spec", "γ", "load", "tok/s", "vs off", "TTFT P99 ms", "TPOT P50 ms", "ok / failed",
                  "E[L] (server)", "accepted / drafted: per request | server", "agree")


def launch_rows(runs: Mapping[str, SpecRun], gammas: Mapping[str, GammaSpec | None]) -> list[tuple[str, ...]]:
    """``probe --launch``: one row per (configuration, load) under :data:`LAUNCH_COLUMNS`: throughput and its
    ratio to off at that load, latency, the pooled acceptance length of the server's counters, and drafted /
    accepted tokens summed per request against the server's counter deltas
    (:func:`specledger.probe.counters.engine_counters_over`, every repeat's window of that load)."""
    base = {p.load: p.full["probe"]["summary"] for p in runs[BASELINE_SPEC].points} if BASELINE_SPEC in runs else {}
    rows: list[tuple[str, ...]] = []
    for name, run in runs.items():
        for p in sorted(run.points, key=lambda q: q.load):
            s = p.full["probe"]["summary"]
            off: EndpointSummary = base.get(p.load) or {}
            tps, off_tps = s.get("output_throughput_tok_s"), off.get("output_throughput_tok_s")
            ratio = tps / off_tps if tps and off_tps else None
            rec = engine_counters_over(p.results, point_windows(p))
            el = pooled_ledger([p], None).get("el_reported")
            per, srv = rec["per_request_sum"], rec["server"]
            pair = (f"{fmt(per['accepted'])} / {fmt(per['draft_tokens'])} | "
                    f"{fmt(srv['accepted'])} / {fmt(srv['draft_tokens'])}")
            agree = {True: "yes", False: "NO", None: "-"}[rec["agree"]]
            rows.append((
                name, str(gammas.get(name, "")), str(p.load), fmt(s.get("output_throughput_tok_s"), 1),
                "1 (ref)" if name == BASELINE_SPEC else fmt(ratio, 3), fmt((s.get("ttft_ms") or {}).get("p99"), 1),
                fmt((s.get("tpot_ms") or {}).get("p50"), 1), f"{s.get('requests_ok')} / {s.get('requests_failed')}",
                fmt(el, 3), pair, agree))
    return rows


__all__ = ["FORMAT_NAMES", "LAUNCH_COLUMNS", "MAX_CELL", "NO_METRICS_REASON", "fmt", "import_columns",
           "import_el_lines", "inspect_columns", "inspect_rows", "launch_rows", "loads_table", "loads_warnings",
           "optional_rows", "ratio_rows", "report_table", "result_column", "spec_rows", "summary_rows"]
