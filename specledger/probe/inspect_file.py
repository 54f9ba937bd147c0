"""``specledger inspect FILE``: sniff what a saved file is and show what it holds, with the same readers
as ``probe`` and the imports.

Formats: a Prometheus exposition (a ``/metrics`` dump of vLLM, SGLang, llama.cpp or TGI: name tables in
:mod:`specledger.probe.engines`), an SSE capture of an OpenAI-compatible (or TGI) stream, a ``vllm bench
serve`` result (JSON or JSON Lines) and a guidellm JSON report. The result lists the engine and version
where the file states them, the spec-decode figures with their definitions, latency summaries, tokens per
stream chunk, and one ``unread`` line for each thing that could not be read, with why. A file that is none
of these raises :class:`SpecLedgerError` (one line, exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specledger.errors import SpecLedgerError
from specledger.probe.engines import ENGINES, EngineNames, engines_in
from specledger.probe.guidellm import guidellm_version, parse_guidellm
from specledger.probe.metrics import response_timings_figures
from specledger.probe.prometheus import (
    DUMP_WARNING,
    EMPTY_SNAPSHOT,
    counter_rates,
    latency_histogram_summaries,
    parse_prometheus_text,
    spec_decode_figures,
)
from specledger.probe.sse import interpret_event, parse_sse
from specledger.probe.vllm_bench import parse_vllm_bench_text

DEFINITIONS = {
    "pooled acceptance length": "1 + Σ accepted / Σ draft rounds over every round (vLLM, llama.cpp, vllm bench); "
    "a per-request mean averages each request's own 1 + accepted/drafts, weighs short requests as much as "
    "long ones, and differs from it",
    "SGLang accept length": "accepted tokens per verify step, bonus token counted (>= 1; 0 means off), a gauge",
    "draft acceptance rate": "accepted / proposed draft tokens",
    "Pr(K>=i)": "share of draft rounds that accepted at least i tokens (unconditional); a_i = Pr(K>=i) / Pr(K>=i-1)",
    "tokens per chunk": "output tokens / token-bearing stream chunks; above 1 when speculation commits several "
    "tokens per step",
}
MAX_UNREAD = 10


def read_text(path: str | Path) -> str:
    """The file as UTF-8 text; unreadable, binary or empty -> one-line SpecLedgerError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecLedgerError(f"cannot read {path}: {exc}") from None
    if not text.strip():
        raise SpecLedgerError(f"{path} is empty; pass a /metrics dump, an SSE capture or a benchmark result")
    return text


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def sniff(text: str) -> str:
    """``"guidellm"``, ``"vllm-bench"``, ``"sse"`` or ``"prometheus"`` (the Prometheus parser has the last
    word: text that is none of these fails there)."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith("{"):
        whole = _json_object(stripped)
        if whole is not None:
            return "guidellm" if "benchmarks" in whole else "vllm-bench"
        if _json_object(stripped.splitlines()[0]) is not None:
            return "vllm-bench"  # JSON Lines
        raise SpecLedgerError("the file starts like JSON but is not JSON nor JSON Lines; is it complete?")
    if stripped.startswith("["):
        raise SpecLedgerError("the file is a JSON list; a benchmark result is a JSON object (or JSON Lines)")
    if any(line.startswith("data:") for line in stripped.splitlines()[:200]):
        return "sse"
    return "prometheus"


def _mapped_names(engine: EngineNames) -> set[str]:
    names = {n for n in (engine.accept_length_gauge, engine.accept_rate_gauge, engine.legacy_acceptance_rate_gauge,
                         engine.legacy_emitted_counter) if n}
    if engine.spec:
        names |= {engine.spec.drafts, engine.spec.draft_tokens, engine.spec.accepted, engine.spec.accepted_per_pos}
    names |= {n for group in engine.histograms.values() for n in group}
    names |= {n for _, a, b in engine.rates for n in (a, b)}
    return names


def _family(sample_name: str) -> str:
    for suffix in ("_total", "_created", "_bucket", "_sum", "_count"):
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name


def inspect_prometheus(text: str) -> dict[str, Any]:
    try:
        snap = parse_prometheus_text(text)
    except SpecLedgerError as exc:
        reason = str(exc).split("; point --metrics")[0]
        raise SpecLedgerError(
            f"not a Prometheus exposition, SSE capture, vllm bench result or guidellm report ({reason})"
        ) from None
    if not snap.samples:
        raise SpecLedgerError("no metric samples: not a Prometheus exposition, SSE capture or benchmark result")
    engines = engines_in(snap.names())
    out: dict[str, Any] = {"format": "prometheus", "engine": ", ".join(e.engine for e in engines) or None,
                           "version": None, "unread": []}
    for key, read in (("spec_decode", lambda: spec_decode_figures(EMPTY_SNAPSHOT, snap, DUMP_WARNING).to_dict()),
                      ("latency", lambda: latency_histogram_summaries(EMPTY_SNAPSHOT, snap)),
                      ("rates", lambda: counter_rates(EMPTY_SNAPSHOT, snap))):
        try:
            out[key] = read()
        except SpecLedgerError as exc:
            out[key] = None
            out["unread"].append(f"{key}: {exc}")
    families = {_family(n) for n in snap.names()}
    mapped = {n for e in ENGINES for n in _mapped_names(e)}
    for engine in engines:
        extra = sorted(f for f in families if f.startswith(engine.prefix) and f not in mapped)
        if extra:
            out["unread"].append(f"{len(extra)} {engine.engine} metric(s) not mapped to a ledger quantity: "
                                 f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    others = sorted(f for f in families if not any(f.startswith(e.prefix) for e in ENGINES))
    if others:
        out["unread"].append(f"{len(others)} metric(s) of no serving engine (process, runtime ...) not read")
    if not engines:
        out["unread"].append("no vLLM, SGLang, llama.cpp or TGI metric names: engine unknown")
    return out


def inspect_sse(text: str) -> dict[str, Any]:
    chunks = [interpret_event(e) for e in parse_sse(text)]
    unread = [f"event {i + 1}: {c.error}" for i, c in enumerate(chunks) if c.kind == "error"]
    token_chunks = [c for c in chunks if c.generated]
    usage = [c.usage["completion_tokens"] for c in chunks
             if c.usage and isinstance(c.usage.get("completion_tokens"), int)]
    timings = [c.timings for c in chunks if c.timings]
    fingerprints = sorted({c.system_fingerprint for c in chunks if c.system_fingerprint})
    stream = {
        "events": len(chunks),
        "streams_done": sum(1 for c in chunks if c.kind == "done"),
        "token_chunks": len(token_chunks),
        "answer_chars": sum(len(c.text) for c in chunks),
        "reasoning_chars": sum(len(c.reasoning) for c in chunks),
        "completion_tokens": sum(usage) if usage else None,
        "mean_tokens_per_chunk": sum(usage) / len(token_chunks) if usage and token_chunks else None,
        "models": sorted({c.model for c in chunks if c.model}),
    }
    if not usage:
        unread.append("no usage.completion_tokens: tokens per chunk unknown (send stream_options.include_usage)")
    unread.append("an SSE capture has no arrival times: TTFT, TPOT and ITL need a live probe")
    return {"format": "sse", "engine": "llama.cpp" if timings else None,
            "version": ", ".join(fingerprints) or None, "stream": stream,
            "spec_decode": response_timings_figures(timings), "unread": unread}


def inspect_vllm_bench(text: str) -> dict[str, Any]:
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    whole = _json_object(text)
    parts = [(0, text)] if whole is not None else lines
    records, unread = [], []
    for number, part in parts:
        try:
            result = parse_vllm_bench_text(part, f"line {number}" if number else "the JSON object")
        except SpecLedgerError as exc:
            unread.append(str(exc))
            continue
        records.append(result.summary())
        extra = sorted(k for k in (result.model_extra or {}) if not k.startswith(("p", "mean_", "median_", "std_")))
        if extra:
            unread.append(f"result {len(records)}: kept, not read: {', '.join(extra[:6])}")
    if not records:
        raise SpecLedgerError(unread[0] if whole is not None else f"no readable vllm bench result: {unread[0]}")
    return {"format": "vllm-bench", "engine": "vllm", "version": None, "records": records, "unread": unread}


def inspect_guidellm(text: str) -> dict[str, Any]:
    obj = _json_object(text) or {}
    return {"format": "guidellm", "engine": None, "version": guidellm_version(obj),
            "records": parse_guidellm(obj, "guidellm report"), "unread": []}


READERS = {"prometheus": inspect_prometheus, "sse": inspect_sse, "vllm-bench": inspect_vllm_bench,
           "guidellm": inspect_guidellm}


def inspect_file(path: str | Path) -> dict[str, Any]:
    """What ``path`` holds (see the module docstring); the definitions of its figures ride along."""
    text = read_text(path)
    try:
        found = READERS[sniff(text)](text)
    except SpecLedgerError as exc:
        raise SpecLedgerError(f"{path}: {exc}") from None
    return {"file": str(path), **found, "definitions": DEFINITIONS}


__all__ = ["DEFINITIONS", "inspect_file", "read_text", "sniff"]
