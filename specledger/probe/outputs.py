"""What a probe (or an imported ``vllm bench serve`` result) writes into its run directory.

``specledger probe --out DIR`` writes ``probe.json`` (every figure of both endpoints),
``traces.jsonl`` (one record per finished request, :mod:`specledger.probe.records`) and
``run.json`` (``"kind": "probe"``: endpoints, their spec-decode figures and acceptance ledger,
config, workload); the command then builds the report. ``probe --loads`` writes every load's requests
(:mod:`specledger.probe.endpoint_loads`: load 1 as the main records, loads > 1 as load points) and a
``probe.json`` with every load's figures under ``loads``. ``vllm bench serve`` results have no per-request timings
to pair; ``import-vllm-bench --out`` writes ``vllm_bench.json`` (figures + acceptance ledger) and a
``run.json`` (``"kind": "vllm-bench"``), and the report shows them in their own section.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from specledger.errors import SpecLedgerError
from specledger.ledger.server_acceptance import (
    NO_ROUNDS_NOTE,
    VLLM_BENCH_NOTE,
    AcceptanceLedgerDict,
    acceptance_ledger,
)
from specledger.probe.documents import (
    EndpointReport,
    EndpointSummary,
    LoadConfigDoc,
    ProbeDocument,
    SpecCountersWindow,
    SpecDecodeDoc,
)
from specledger.probe.endpoint_loads import LoadPoint, first_spec_decode, probe_document, tag_load_point
from specledger.probe.loadgen import RequestResult, Tokenizer
from specledger.probe.records import BASELINE_DRAFTER, PROBE_KIND, gamma_label, records_from_probe
from specledger.probe.workload import ProbeWorkload
from specledger.records import GammaSpec, RequestRecord
from specledger.rundir import PROBE_JSON, TRACE_NAME, VLLM_BENCH_JSON, RunDir, json_safe

if TYPE_CHECKING:
    from specledger.probe.launch_race import RaceDocument

VLLM_BENCH_KIND = "vllm-bench"
GUIDELLM_KIND = "guidellm"
GUIDELLM_NOTE = "guidellm reports client-side aggregates and per-request totals only: no round-level ledger"


def check_new_run_dir(out: Path) -> None:
    """Refuse a folder that already holds traces (a probe never appends to another run)."""
    trace = Path(out) / TRACE_NAME
    if trace.exists() and trace.stat().st_size:
        raise SpecLedgerError(f"{out} already holds traces ({TRACE_NAME}); pass a new --out folder")


class EndpointMeta(TypedDict):
    """One endpoint in ``run.json``'s ``endpoints``: where it is, how the report labels it, its spec-decode
    figures and the acceptance ledger read from them, its warnings."""

    role: str  # "endpoint" or "baseline"
    url: str | None
    model: str | None
    drafter: str
    gamma: GammaSpec
    spec_decode: SpecDecodeDoc | None
    spec_decode_counters: SpecCountersWindow | None
    acceptance_ledger: AcceptanceLedgerDict
    warnings: list[str]


class ImportDocument(TypedDict):
    """An imported benchmark result as written (``vllm_bench.json``, ``guidellm.json``): the file, the tool's
    version where it states one, the probe's summary keys, the acceptance ledger, a caveat, the raw record."""

    source_file: str
    version: str | None
    summary: EndpointSummary
    acceptance_ledger: AcceptanceLedgerDict
    note: str
    raw: dict[str, Any]  # the record as the tool wrote it (free-form; vLLM adds fields release by release)


def _endpoint_meta(report: EndpointReport, role: str, drafter: str, gamma: GammaSpec) -> EndpointMeta:
    return {
        "role": role,
        "url": report.get("url"),
        "model": report.get("model"),
        "drafter": drafter,
        "gamma": gamma,
        "spec_decode": report.get("spec_decode"),
        "spec_decode_counters": report.get("spec_decode_counters"),
        "acceptance_ledger": acceptance_ledger(report.get("spec_decode")),
        "warnings": list(report.get("warnings") or []),
    }


def probe_run_meta(
    name: str,
    endpoint: EndpointReport,
    baseline: EndpointReport | None,
    *,
    drafter: str,
    gamma: GammaSpec,
    workload: ProbeWorkload,
) -> dict[str, Any]:
    """``run.json`` of a probe: kind, model, endpoints (with spec-decode figures and warnings), config."""
    endpoints = {"endpoint": _endpoint_meta(endpoint, "endpoint", drafter, gamma)}
    if baseline is not None:
        endpoints["baseline"] = _endpoint_meta(baseline, "baseline", BASELINE_DRAFTER, 0)
    return {
        "kind": PROBE_KIND,
        "name": name,
        "model": str(endpoint.get("model") or ""),
        "machine": f"endpoint {endpoint.get('url')}",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "endpoints": endpoints,
        "config": endpoint.get("config"),
        "workload": workload.describe(),
        "note": NO_ROUNDS_NOTE,
        "traffic_counts": workload.counts(),  # the mix's shares (specledger.gates.mix), unless --mix gives them
        "traffic_mix": workload.mix,
    }


def write_probe_run(out: Path, records: Sequence[RequestRecord], meta: Mapping[str, Any]) -> None:
    """``out/traces.jsonl`` (appended, fsync'ed) and ``out/run.json`` (atomic)."""
    run = RunDir(out)
    run.path.mkdir(parents=True, exist_ok=True)
    check_new_run_dir(run.path)
    if records:
        run.append(records)
    run.write_meta(meta)


def vllm_bench_document(
    source_file: str, summary: EndpointSummary, raw: Mapping[str, Any], note: str = VLLM_BENCH_NOTE,
    version: str | None = None,
) -> ImportDocument:
    """The normalised import document (``vllm_bench.json``, ``guidellm.json``): source, summary (probe
    keys), the acceptance ledger, and the raw record."""
    return cast(ImportDocument, json_safe(  # the same keys, as strict JSON
        {
            "source_file": source_file,
            "version": version,
            "summary": dict(summary),
            "acceptance_ledger": acceptance_ledger(summary.get("spec_decode")),
            "note": note,
            "raw": dict(raw),
        }
    ))


def write_import_run(
    out: Path, document: ImportDocument, model: str | None, kind: str = VLLM_BENCH_KIND,
    filename: str = VLLM_BENCH_JSON,
) -> None:
    """``out/<filename>`` and, unless the folder already has one, ``out/run.json`` (``kind``)."""
    run = RunDir(out)
    run.write(filename, document)
    run.write_meta(
        {
            "kind": kind,
            "name": run.name,
            "model": model or "",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "source_file": document.get("source_file"),
            "note": document.get("note"),
        },
        keep_existing=True,
    )


def import_target(out: Path, index: int, count: int) -> Path:
    """The run folder of result ``index`` of ``count`` imported together: OUT itself for one, OUT/record-N."""
    return out if count == 1 else out / f"record-{index}"


def write_vllm_bench_run(out: Path, document: ImportDocument, model: str | None) -> None:
    """``out/vllm_bench.json`` and, unless the folder already has one, ``out/run.json`` (kind vllm-bench)."""
    write_import_run(out, document, model)


class _RecordOptions(TypedDict):
    """The keyword arguments of :func:`~specledger.probe.records.records_from_probe` that every endpoint of one
    probe shares."""

    temperature: float
    category_of: Callable[[str | None], str]
    score_of: Callable[[str | None, str], tuple[float | None, str | None]]
    tokenizer: Tokenizer | None
    top_p: float
    seed: int | None


def _record_options(config: LoadConfigDoc, workload: ProbeWorkload, tokenizer: Tokenizer | None
                    ) -> _RecordOptions:
    """What every endpoint's records of one probe share: sampling, categories, scores, tokenizer."""
    return _RecordOptions(temperature=config["temperature"], category_of=workload.category_of,
                          score_of=workload.score_of, tokenizer=tokenizer, top_p=config["top_p"], seed=config["seed"])


def write_probe_dir(
    out: Path,
    full: ProbeDocument,
    results: list[RequestResult],
    base_results: list[RequestResult],
    workload: ProbeWorkload,
    label: str,
    gamma: str | None,
    tokenizer: Tokenizer | None,
) -> None:
    """probe.json, then traces.jsonl + run.json (both endpoints' records); the report is the caller's to build
    (the library writes, :func:`specledger.report.build.build_report` reads)."""
    report, base_report = full["probe"], full.get("baseline")
    g = gamma_label(report.get("spec_decode"), gamma)
    common = _record_options(report["config"], workload, tokenizer)
    records = records_from_probe(
        results, drafter=label, gamma=g, model=report["model"], endpoint=report["url"], **common
    )
    if base_report is not None:
        records += records_from_probe(
            base_results, drafter=BASELINE_DRAFTER, gamma=0, model=base_report["model"],
            endpoint=base_report["url"], **common,
        )
    RunDir(out).write(PROBE_JSON, full)
    meta = probe_run_meta(out.name, report, base_report, drafter=label, gamma=g, workload=workload)
    write_probe_run(out, records, meta)


def probe_loads_run(
    points: Sequence[LoadPoint], workload: ProbeWorkload, label: str, gamma: str | None,
    tokenizer: Tokenizer | None, name: str,
) -> tuple[list[RequestRecord], dict[str, Any]]:
    """The records (tagged per load, :func:`specledger.probe.endpoint_loads.tag_load_point`) and ``run.json`` of a
    probe at several loads. One gamma label for every load
    (:func:`~specledger.probe.endpoint_loads.first_spec_decode`)."""
    g = gamma_label(first_spec_decode(points), gamma)
    records: list[RequestRecord] = []
    for p in points:
        report, base_report = p.full["probe"], p.full.get("baseline")
        common = _record_options(report["config"], workload, tokenizer)
        spec = records_from_probe(p.results, drafter=label, gamma=g, model=report["model"],
                                  endpoint=report["url"], **common)
        records += tag_load_point(spec, p.load, label, g, report["summary"].get("wall_time_s"))
        if base_report is not None:
            base = records_from_probe(p.base_results, drafter=BASELINE_DRAFTER, gamma=0,
                                      model=base_report["model"], endpoint=base_report["url"], **common)
            records += tag_load_point(base, p.load, BASELINE_DRAFTER, 0, base_report["summary"].get("wall_time_s"))
    first = points[0].full
    meta = probe_run_meta(name, first["probe"], first.get("baseline"), drafter=label, gamma=g, workload=workload)
    meta["loads"] = [p.load for p in points]
    meta["load_order"] = {str(p.load): list(p.order) for p in points}
    return records, meta


def write_probe_loads_dir(
    out: Path, points: Sequence[LoadPoint], workload: ProbeWorkload, label: str, gamma: str | None,
    tokenizer: Tokenizer | None, race: RaceDocument | None = None,
) -> None:
    """probe.json (:func:`~specledger.probe.endpoint_loads.probe_document`), traces.jsonl + run.json of every load; the
    report built from them (by the caller) gives gates and verdicts per load and the schedule. ``race``: the
    log of ``--budget`` (run.json's ``race``, as ``specledger run`` writes it)."""
    records, meta = probe_loads_run(points, workload, label, gamma, tokenizer, Path(out).name)
    if race is not None:
        meta["race"] = dict(race)
    Path(out).mkdir(parents=True, exist_ok=True)
    RunDir(out).write(PROBE_JSON, probe_document(points))
    write_probe_run(out, records, meta)


__all__ = [
    "EndpointMeta",
    "ImportDocument",
    "check_new_run_dir",
    "import_target",
    "probe_loads_run",
    "probe_run_meta",
    "vllm_bench_document",
    "write_probe_dir",
    "write_probe_loads_dir",
    "write_import_run",
    "write_probe_run",
    "write_vllm_bench_run",
]
