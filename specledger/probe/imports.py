"""Benchmark result files as import documents (``specledger import``, ``import-vllm-bench``): the format sniffed,
one normalised document per result the file holds (:func:`specledger.probe.outputs.vllm_bench_document`), each
with its 1-based index and model."""

from __future__ import annotations

from pathlib import Path

from specledger.errors import SpecLedgerError
from specledger.probe.guidellm import guidellm_version, load_guidellm
from specledger.probe.outputs import GUIDELLM_NOTE, ImportDocument, vllm_bench_document
from specledger.probe.vllm_bench import load_vllm_bench_records, records_of

Imported = tuple[int, str | None, ImportDocument]  # (1-based index, model, import document)


def source_name(file: Path, index: int, count: int) -> str:
    """The file, or ``FILE#N`` for result N of several."""
    return str(file) if count == 1 else f"{file}#{index}"


def vllm_bench_documents(file: Path, record: int | None) -> list[Imported]:
    """`vllm bench serve` results (one JSON, or JSON Lines of several runs): every one, or only ``record``."""
    chosen = records_of(load_vllm_bench_records(file), record)
    return [
        (i, r.model_id, vllm_bench_document(source_name(file, i, len(chosen)), r.summary(), r.model_dump()))
        for i, r in chosen
    ]


def guidellm_documents(file: Path, record: int | None) -> list[Imported]:
    """A guidellm report: one document per benchmark of the report (or only ``record``)."""
    raw, summaries = load_guidellm(file)
    version = guidellm_version(raw)
    chosen = [(i, s) for i, s in enumerate(summaries, start=1) if record is None or i == record]
    if not chosen:
        raise SpecLedgerError(f"--record {record} is out of range: the report holds {len(summaries)} benchmark(s)")
    model = (raw.get("config") or {}).get("model") if isinstance(raw.get("config"), dict) else None
    return [
        (i, model if isinstance(model, str) else None,
         vllm_bench_document(source_name(file, i, len(chosen)), s, {"benchmark_index": i - 1}, GUIDELLM_NOTE,
                             version))
        for i, s in chosen
    ]


def benchmark_kind(file: Path) -> str:
    """``"guidellm"`` or ``"vllm-bench"``, sniffed from the file; any other format is a one-line error."""
    from specledger.probe.inspect_file import read_text, sniff

    kind = sniff(read_text(file))
    if kind not in ("guidellm", "vllm-bench"):
        raise SpecLedgerError(
            f"{file} is a {kind} file, not a benchmark result; `specledger inspect {file}` shows what it holds"
        )
    return kind


__all__ = ["Imported", "benchmark_kind", "guidellm_documents", "source_name", "vllm_bench_documents"]
