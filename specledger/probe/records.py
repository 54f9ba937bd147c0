"""Probe results as run-directory records, so ``specledger report`` reads a probe like a run.

A probe of an endpoint (and of a ``--baseline`` endpoint) becomes one
:class:`~specledger.engine.trace.RequestRecord` per successful request in ``traces.jsonl``, with a
``run.json`` next to it (``"kind": "probe"``). The report then groups them like any run:

* the baseline endpoint's records have drafter ``"none"`` (plain decoding, gamma 0), the probed
  endpoint's records the user's label (default ``"endpoint"``) and a gamma label (the number of
  speculative positions the server's /metrics shows, else ``"server"``);
* ``prompt_id`` is the workload item's id, so both endpoints pair prompt by prompt;
* ``token_times`` repeat each chunk's arrival time (seconds since the request was sent) once per
  token in the chunk, ``chunks`` are the tokens per chunk, ``ttft`` is the first chunk's time and
  ``total_time`` the last chunk's;
* ``rounds`` is empty: outside the engine there is no round ledger (E[L] per request, round times
  and the reconciliation show n/a; the server-wide spec-decode counters live in ``run.json``);
* ``token_ids`` are the tokenizer's ids of the streamed text when a tokenizer is given; otherwise
  they are empty, ``extra["text_only"]`` is true and the greedy correctness gate compares texts.

``vllm bench serve`` results have no per-request timings to pair; ``import-vllm-bench --out``
writes ``vllm_bench.json`` (figures + acceptance ledger) and a ``run.json`` (``"kind":
"vllm-bench"``), and the report shows them in their own section.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specledger.engine.trace import RequestRecord
from specledger.errors import SpecLedgerError
from specledger.probe.acceptance import NO_ROUNDS_NOTE, VLLM_BENCH_NOTE, acceptance_ledger
from specledger.probe.loadgen import PromptItem, RequestResult, Tokenizer, read_jsonl_objects, to_prompt_item
from specledger.rundir import (
    META_NAME,
    TRACE_NAME,
    VLLM_BENCH_JSON,
    append_records,
    json_safe,
    write_json_atomic,
)
from specledger.workloads import WorkloadItem

PROBE_KIND = "probe"
VLLM_BENCH_KIND = "vllm-bench"
BASELINE_DRAFTER = "none"
ENDPOINT_DRAFTER = "endpoint"
SERVER_GAMMA = "server"
BUILTIN_CATEGORY = "builtin"
USER_CATEGORY = "custom"  # the category a JSONL item without one gets (as specledger.workloads.load_jsonl)


# ----------------------------------------------------------------------------- workload


@dataclass
class ProbeWorkload:
    """What the probe sends (``items``, each with its id) and what each id is (``entries``)."""

    items: list[PromptItem]
    entries: dict[str, WorkloadItem]
    source: str
    warnings: list[str] = field(default_factory=list)

    def category_of(self, prompt_id: str | None) -> str:
        entry = self.entries.get(prompt_id or "")
        return entry.category if entry is not None else USER_CATEGORY

    def score_of(self, prompt_id: str | None, text: str) -> tuple[float | None, str | None]:
        """(task score, None) or (None, why it could not be scored) -- see :func:`specledger.quality.score`."""
        from specledger.quality import score

        entry = self.entries.get(prompt_id or "")
        if entry is None:
            return None, None
        try:
            return score(entry, text), None
        except SpecLedgerError as exc:
            return None, str(exc)

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "prompts": {pid: {"category": e.category} for pid, e in self.entries.items()},
            "warnings": list(self.warnings),
        }


def _check_unique(ids: Sequence[str], where: str) -> None:
    seen: set[str] = set()
    for pid in ids:
        if pid in seen:
            raise SpecLedgerError(f"{where}: id {pid!r} appears twice; give every workload item its own id")
        seen.add(pid)


def workload_from_prompts(prompts: Sequence[str], category: str = BUILTIN_CATEGORY) -> ProbeWorkload:
    """Plain prompt strings; ids ``<category>/<i>``, no reference (quality not scored)."""
    if not prompts:
        raise SpecLedgerError("the workload has no prompts; give at least one")
    entries = {
        f"{category}/{i}": WorkloadItem(id=f"{category}/{i}", category=category, messages=None, prompt=p)
        for i, p in enumerate(prompts)
    }
    items = [PromptItem(prompt=e.prompt, id=pid) for pid, e in entries.items()]
    return ProbeWorkload(items=items, entries=entries, source="built-in prompts")


def workload_from_jsonl(path: str | Path) -> ProbeWorkload:
    """A JSONL of ``{prompt}`` or ``{messages}`` (+ optional ``id``, ``category``, ``reference``,
    ``max_tokens``); ``id`` defaults to ``<file stem>/<line>`` and ``category`` to ``custom``, as in
    :func:`specledger.workloads.load_jsonl`. Items with a built-in category and a reference are scored."""
    path = Path(path)
    items: list[PromptItem] = []
    entries: dict[str, WorkloadItem] = {}
    for number, obj in read_jsonl_objects(path):
        where = f"{path}:{number}"
        item = to_prompt_item(obj, where=where)
        pid = item.id or f"{path.stem}/{number}"
        category = obj.get("category", USER_CATEGORY) if isinstance(obj, dict) else USER_CATEGORY
        if not isinstance(category, str) or not category.strip():
            raise SpecLedgerError(f"{where}: 'category' must be a non-empty string")
        if pid in entries:
            raise SpecLedgerError(f"{where}: id {pid!r} appears twice; give every workload item its own id")
        entries[pid] = WorkloadItem(
            id=pid,
            category=category.strip(),
            messages=item.messages,
            prompt=item.prompt,
            reference=obj.get("reference") if isinstance(obj, dict) else None,
            meta={"source": "jsonl", "line": number},
        )
        items.append(PromptItem(prompt=item.prompt, messages=item.messages, max_tokens=item.max_tokens, id=pid))
    if not items:
        raise SpecLedgerError(f"{path} has no prompts; give at least one JSON line with 'prompt' or 'messages'")
    return ProbeWorkload(items=items, entries=entries, source=str(path))


def workload_from_categories(categories: Sequence[str], n: int, seed: int = 0) -> ProbeWorkload:
    """``n`` items per built-in category (seeded, as ``specledger run``), scored by the quality metrics."""
    from specledger.workloads import CATEGORIES, load_category

    if n < 1:
        raise SpecLedgerError("--n must be at least 1")
    loaded: list[WorkloadItem] = []
    for category in categories:
        if category == "random":
            raise SpecLedgerError("category 'random' is token ids, not text; an endpoint needs text prompts")
        if category not in CATEGORIES:
            raise SpecLedgerError(f"unknown category {category!r}; choose from {', '.join(CATEGORIES[:-1])}")
        loaded += load_category(category, n, seed=seed)
    _check_unique([it.id for it in loaded], "built-in workload")
    entries = {it.id: it for it in loaded}
    items = [PromptItem(prompt=it.prompt, messages=it.messages, id=it.id) for it in loaded]
    return ProbeWorkload(items=items, entries=entries, source=f"categories {','.join(categories)} (n={n}, seed={seed})")


# ----------------------------------------------------------------------------- records


def emission_times(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> tuple[list[float], list[int]]:
    """(token_times, chunks): chunk i's time repeated ``chunk_tokens[i]`` times; empty chunks dropped.

    Invariant: ``sum(chunks) == len(token_times) == sum(chunk_tokens)`` (over positive counts).
    """
    times: list[float] = []
    chunks: list[int] = []
    for t, n in zip(chunk_times, chunk_tokens):
        if n > 0:
            times.extend([float(t)] * int(n))
            chunks.append(int(n))
    return times, chunks


def _token_ids(tokenizer: Tokenizer | None, text: str) -> list[int] | None:
    if tokenizer is None:
        return None
    encoded = tokenizer(text)
    if isinstance(encoded, int):
        return None
    return [int(t) for t in encoded]


def _stop_reason(finish_reason: str | None) -> str:
    return {"length": "length", "stop": "stop", "eos": "eos"}.get(finish_reason or "", finish_reason or "unknown")


def record_from_result(
    result: RequestResult,
    *,
    drafter: str,
    gamma: int | str,
    temperature: float,
    model: str,
    endpoint: str,
    category: str,
    top_p: float = 1.0,
    seed: int | None = None,
    tokenizer: Tokenizer | None = None,
    quality: tuple[float | None, str | None] = (None, None),
) -> RequestRecord:
    """One successful probe request as a RequestRecord (see the module docstring for the mapping)."""
    token_times, chunks = emission_times(result.chunk_times, result.chunk_tokens)
    ids = _token_ids(tokenizer, result.output_text)
    score, score_error = quality
    extra: dict[str, Any] = {
        "source": PROBE_KIND,
        "endpoint": endpoint,
        "request_index": result.index,
        "start_s": result.start_s,
        "token_count_source": result.token_count_source,
        "text_only": ids is None,
    }
    if score is not None:
        extra["quality"] = score
    if score_error:
        extra["quality_error"] = score_error
    pid = result.prompt_id or ""
    return RequestRecord(
        request_id=f"{drafter}|{gamma}|{pid or 'request'}|{result.index}",
        drafter=drafter,
        gamma=gamma,
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=0,
        seed=seed,
        prompt_tokens=0,
        output_tokens=len(token_times),
        text=result.output_text,
        token_ids=ids if ids is not None else [],
        stop_reason=_stop_reason(result.finish_reason),
        t_prefill=0.0,
        ttft=token_times[0] if token_times else 0.0,
        total_time=token_times[-1] if token_times else 0.0,
        token_times=token_times,
        chunks=chunks,
        rounds=[],
        category=category,
        prompt_id=pid,
        model=model,
        extra=extra,
    )


def records_from_probe(
    results: Iterable[RequestResult],
    *,
    drafter: str,
    gamma: int | str,
    temperature: float,
    model: str,
    endpoint: str,
    category_of: Callable[[str | None], str],
    score_of: Callable[[str | None, str], tuple[float | None, str | None]] | None = None,
    tokenizer: Tokenizer | None = None,
    top_p: float = 1.0,
    seed: int | None = None,
) -> list[RequestRecord]:
    """One RequestRecord per successful request that streamed at least one token, in request order.

    ``drafter`` ``"none"`` marks the baseline endpoint (its gamma is recorded as 0).
    """
    out = []
    for r in sorted(results, key=lambda r: r.index):
        if not r.ok or not any(n > 0 for n in r.chunk_tokens):
            continue
        out.append(
            record_from_result(
                r,
                drafter=drafter,
                gamma=0 if drafter == BASELINE_DRAFTER else gamma,
                temperature=temperature,
                model=model,
                endpoint=endpoint,
                category=category_of(r.prompt_id),
                top_p=top_p,
                seed=seed,
                tokenizer=tokenizer,
                quality=score_of(r.prompt_id, r.output_text) if score_of else (None, None),
            )
        )
    return out


def check_label(label: str) -> str:
    """The probed endpoint's drafter label: non-empty, no ``|``, and not the baseline's ``none``."""
    label = label.strip()
    if not label or "|" in label or label == BASELINE_DRAFTER:
        raise SpecLedgerError(f"--label {label!r} is not usable; give a name such as eagle3 (not 'none', no '|')")
    return label


def gamma_label(spec_decode: Mapping[str, Any] | None, given: str | None = None) -> int | str:
    """The probed endpoint's gamma: ``given`` (an integer string becomes an int), else the number of
    speculative positions its /metrics counted, else ``"server"``."""
    if given:
        return int(given) if given.strip().isdigit() else given.strip()
    rates = (spec_decode or {}).get("per_position_rates") or []
    return len(rates) if rates else SERVER_GAMMA


# ----------------------------------------------------------------------------- run directory


def check_new_run_dir(out: Path) -> None:
    """Refuse a folder that already holds traces (a probe never appends to another run)."""
    trace = Path(out) / TRACE_NAME
    if trace.exists() and trace.stat().st_size:
        raise SpecLedgerError(f"{out} already holds traces ({TRACE_NAME}); pass a new --out folder")


def _endpoint_meta(report: Mapping[str, Any], role: str, drafter: str, gamma: int | str) -> dict[str, Any]:
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
    endpoint: Mapping[str, Any],
    baseline: Mapping[str, Any] | None,
    *,
    drafter: str,
    gamma: int | str,
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
    }


def write_probe_run(out: Path, records: Sequence[RequestRecord], meta: Mapping[str, Any]) -> None:
    """``out/traces.jsonl`` (appended, fsync'ed) and ``out/run.json`` (atomic)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    check_new_run_dir(out)
    if records:
        append_records(out / TRACE_NAME, records)
    write_json_atomic(out / META_NAME, dict(meta))


def vllm_bench_document(source_file: str, summary: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """The normalised ``vllm_bench.json``: source, summary (probe keys) and the acceptance ledger."""
    return json_safe(
        {
            "source_file": source_file,
            "summary": dict(summary),
            "acceptance_ledger": acceptance_ledger(summary.get("spec_decode")),
            "note": VLLM_BENCH_NOTE,
            "raw": dict(raw),
        }
    )


def write_vllm_bench_run(out: Path, document: Mapping[str, Any], model: str | None) -> None:
    """``out/vllm_bench.json`` and, unless the folder already has one, ``out/run.json`` (kind vllm-bench)."""
    out = Path(out)
    write_json_atomic(out / VLLM_BENCH_JSON, document)
    meta_path = out / META_NAME
    if not meta_path.exists():
        write_json_atomic(
            meta_path,
            {
                "kind": VLLM_BENCH_KIND,
                "name": out.name,
                "model": model or "",
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "source_file": document.get("source_file"),
                "note": document.get("note"),
            },
        )


__all__ = [
    "ProbeWorkload",
    "check_label",
    "check_new_run_dir",
    "emission_times",
    "gamma_label",
    "probe_run_meta",
    "record_from_result",
    "records_from_probe",
    "vllm_bench_document",
    "workload_from_categories",
    "workload_from_jsonl",
    "workload_from_prompts",
    "write_probe_run",
    "write_vllm_bench_run",
]
