"""``specledger inspect FILE``: sniff what a saved file is and show what it holds, with the same readers
as ``probe`` and the imports.

Formats: a Prometheus exposition (a ``/metrics`` dump of vLLM, SGLang, llama.cpp or TGI: name tables in
:mod:`specledger.probe.engines`), an SSE capture of an OpenAI-compatible (or TGI) stream, a non-streamed
OpenAI-compatible reply (one JSON object with ``choices``), a ``vllm bench serve`` result (JSON or JSON Lines)
and a guidellm JSON report. The result lists the engine and version
where the file states them, the spec-decode figures with their definitions, latency summaries, tokens per
stream chunk, and one ``unread`` line for each thing that could not be read, with why. A file that is none
of these raises :class:`SpecLedgerError` (one line, exit 2).

A dump's own counters and gauges are listed as they are (``counters``: each engine family of type counter,
gauge or untyped, summed over its label sets, mean for gauges, with its HELP text), besides the ledger
figures read from them. An SSE capture is split into responses (at each ``data: [DONE]``, or where the
chunk ``id`` changes); llama.cpp's ``timings`` is a cumulative snapshot, so only the *last* one of each
response is read (:func:`specledger.probe.metrics.response_timings_totals`), draft fields or not; vLLM's and
SGLang's per-request figures likewise (:mod:`specledger.probe.counters`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar, cast

from specledger.errors import SpecLedgerError
from specledger.probe.counters import counts_from_spec_stats
from specledger.probe.documents import (
    CounterRate,
    EndpointSummary,
    LatencyHistogramSummary,
    ResponseTimingsFigures,
    ResponseTimingsTotals,
    SpecDecodeDoc,
)
from specledger.probe.engines import ENGINES, EngineNames, engines_in
from specledger.probe.guidellm import guidellm_version, parse_guidellm
from specledger.probe.histograms import counter_rates, latency_histogram_summaries
from specledger.probe.metrics import response_timings_figures, response_timings_totals
from specledger.probe.prometheus import EMPTY_SNAPSHOT, metric_families, parse_prometheus_text
from specledger.probe.spec_figures import DUMP_WARNING, spec_decode_figures
from specledger.probe.sse import SSEEvent, StreamChunk, interpret_event, parse_sse
from specledger.probe.vllm_bench import parse_vllm_bench_text
from specledger.probe.wire import EngineSpecStats

DEFINITIONS = {
    "pooled acceptance length": "1 + Σ accepted / Σ draft rounds over every round (vLLM, llama.cpp, vllm bench); "
    "a per-request mean averages each request's own 1 + accepted/drafts, weighs short requests as much as "
    "long ones, and differs from it",
    "SGLang accept length": "accepted tokens per verify step, bonus token counted (>= 1; 0 means off), a gauge",
    "draft acceptance rate": "accepted / proposed draft tokens",
    "Pr(K>=i)": "share of draft rounds that accepted at least i tokens (unconditional); a_i = Pr(K>=i) / Pr(K>=i-1)",
    "timings ...": "llama.cpp's per-response timings: the last (cumulative) snapshot of each response, summed over "
    "responses (counts and milliseconds)",
    "per request ...": "the speculation figures vLLM (metrics.speculative_decoding) or SGLang "
    "(sglext.spec_tokens_details) returned with each response, the last per response, summed",
    "tokens per chunk": "output tokens / token-bearing stream chunks; above 1 when speculation commits several "
    "tokens per step",
}
MAX_UNREAD = 10


class _Found(TypedDict, total=False):
    """What :func:`inspect_file` adds to every reading: the file and the definitions of its figures."""

    file: str
    definitions: dict[str, str]  # term -> meaning


class _ScalarKeys(TypedDict):
    """The keys every :class:`ScalarFamily` has."""

    type: str  # counter, gauge, untyped or unknown
    value: float | None  # Σ over label sets (their mean for a gauge); None: not measured
    series: int  # label sets read
    help: str


class ScalarFamily(_ScalarKeys, total=False):
    """One counter or gauge family of a dump (:func:`engine_scalars`)."""

    note: str  # why there is no value


class PrometheusFindings(_Found):
    """A ``/metrics`` dump: the engines named, spec-decode figures, latency histograms, counter rates, every
    engine counter and gauge; None where a part could not be read (``unread`` says why)."""

    format: Literal["prometheus"]
    engine: str | None
    version: str | None
    unread: list[str]
    spec_decode: SpecDecodeDoc | None
    latency: dict[str, LatencyHistogramSummary] | None
    rates: dict[str, CounterRate] | None
    counters: dict[str, ScalarFamily]


class PerRequestSums(TypedDict):
    """vLLM's or SGLang's per-request speculation figures (the last per response) summed over responses."""

    source: str
    responses: int
    drafts: int | None  # draft rounds
    draft_tokens: int | None
    accepted: int | None


class StreamFindings(_Found):
    """An SSE capture or a non-streamed reply: the stream's counts (``stream``: figure -> value, shown as
    rows), llama.cpp's timings summed, the per-request speculation figures summed."""

    format: Literal["sse", "completion"]
    engine: str | None
    version: str | None
    stream: dict[str, float | str | list[str] | None]
    response_timings: ResponseTimingsTotals | None
    per_request_spec: PerRequestSums | None
    spec_decode: ResponseTimingsFigures | None
    unread: list[str]


class BenchmarkFindings(_Found):
    """A ``vllm bench serve`` result or a guidellm report: one summary per result."""

    format: Literal["vllm-bench", "guidellm"]
    engine: str | None
    version: str | None
    records: list[EndpointSummary]
    unread: list[str]


#: what ``inspect`` found in a file, by format
InspectResult = PrometheusFindings | StreamFindings | BenchmarkFindings


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


def _json_object(text: str) -> dict[str, Any] | None:  # a decoded JSON object: whatever the file holds
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def sniff(text: str) -> str:
    """``"guidellm"``, ``"completion"`` (a non-streamed reply: a JSON object with ``choices``), ``"vllm-bench"``,
    ``"sse"`` or ``"prometheus"`` (the Prometheus parser has the last word: text that is none of these fails
    there)."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith("{"):
        whole = _json_object(stripped)
        if whole is not None:
            return "guidellm" if "benchmarks" in whole else "completion" if "choices" in whole else "vllm-bench"
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


Read = TypeVar("Read")


def _part(name: str, read: Callable[[], Read], unread: list[str]) -> Read | None:
    """``read()``, or None with a line in ``unread`` when it fails."""
    try:
        return read()
    except SpecLedgerError as exc:
        unread.append(f"{name}: {exc}")
        return None


def inspect_prometheus(text: str) -> PrometheusFindings:
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
    unread: list[str] = []
    out: PrometheusFindings = {
        "format": "prometheus", "engine": ", ".join(e.engine for e in engines) or None, "version": None,
        "unread": unread,
        "spec_decode": _part("spec_decode", lambda: spec_decode_figures(EMPTY_SNAPSHOT, snap, DUMP_WARNING).to_dict(),
                             unread),
        "latency": _part("latency", lambda: latency_histogram_summaries(EMPTY_SNAPSHOT, snap), unread),
        "rates": _part("rates", lambda: counter_rates(EMPTY_SNAPSHOT, snap), unread),
        "counters": engine_scalars(text, engines),
    }
    families = {_family(n) for n in snap.names()}
    mapped = {n for e in ENGINES for n in _mapped_names(e)} | set(out["counters"])
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


def engine_scalars(text: str, engines: list[EngineNames]) -> dict[str, ScalarFamily]:
    """The engines' counter, gauge and untyped families of a dump, by family name: ``{"type", "value",
    "series", "help"}`` (value: Σ over label sets, their mean for a gauge; untyped lines of one name merge
    into one family); the per-position spec-decode counters are left to the rates. A gauge whose 0 means
    "speculation off" (SGLang's accept length and rate, :func:`zero_is_off`) averages its non-zero series
    only, and is None (not measured) where every series is 0: never a figure of 0."""
    per_pos = {e.spec.accepted_per_pos for e in engines if e.spec}
    off_gauges = zero_is_off(engines)
    found: dict[str, tuple[str, str, list[float]]] = {}  # name -> (type, help, values); untyped lines merge
    for family in metric_families(text):
        if family.type not in ("counter", "gauge", "untyped", "unknown") or family.name in per_pos:
            continue
        if not any(family.name.startswith(e.prefix) for e in engines):
            continue
        values = [v for name, v in family.samples if not name.endswith("_created")]
        if family.name in off_gauges:
            values = [v for v in values if v != 0] or [math.nan]  # NaN: every series says off
        kind, help_text, seen = found.get(family.name, (family.type, family.help, []))
        found[family.name] = (kind, help_text or family.help, seen + values)
    out: dict[str, ScalarFamily] = {}
    for name, (kind, help_text, values) in found.items():
        if not values:
            continue
        values = [v for v in values if not (name in off_gauges and math.isnan(v))]
        if not values:
            out[name] = {"type": kind, "value": None, "series": 0, "help": help_text,
                         "note": "0 on every series: speculation is off, nothing measured"}
            continue
        try:
            total = math.fsum(values)
        except (OverflowError, ValueError):  # partial sums past the float range, or inf - inf: plain sum
            total = float(sum(values))
        value = total / len(values) if kind == "gauge" else total
        out[name] = {"type": kind, "value": int(value) if value.is_integer() else value, "series": len(values),
                     "help": help_text}
    return out


def split_responses(chunks: list[StreamChunk]) -> list[list[StreamChunk]]:
    """The chunks of a capture, one list per response: a response ends at ``data: [DONE]`` or where the
    chunk ``id`` changes (both ids known); chunks before any id join the response that follows."""
    responses: list[list[StreamChunk]] = []
    current: list[StreamChunk] = []
    current_id: str | None = None
    for chunk in chunks:
        if chunk.response_id and current_id and chunk.response_id != current_id:
            responses.append(current)
            current, current_id = [], None
        current.append(chunk)
        current_id = current_id or chunk.response_id
        if chunk.kind == "done":
            responses.append(current)
            current, current_id = [], None
    if current:
        responses.append(current)
    return [r for r in responses if any(c.kind != "done" for c in r)]


def _last(values: list[Any]) -> Any:
    return values[-1] if values else None


def inspect_sse(text: str) -> StreamFindings:
    """An SSE capture: its events as stream chunks, read by :func:`inspect_chunks`."""
    return inspect_chunks([interpret_event(e) for e in parse_sse(text)], "sse")


def inspect_completion(text: str) -> StreamFindings:
    """A non-streamed reply (``"stream": false``): the one object read as one chunk by :func:`inspect_chunks`
    (``choices[0].message`` in place of the delta; its ``usage``, llama.cpp's ``timings``, vLLM's and SGLang's
    per-request figures as in a stream)."""
    return inspect_chunks([interpret_event(SSEEvent(data=text))], "completion")


def inspect_chunks(chunks: list[StreamChunk], fmt: Literal["sse", "completion"]) -> StreamFindings:
    """What the chunks of a capture (``fmt`` "sse") or of a non-streamed reply ("completion") hold: text and
    tokens, llama.cpp's last ``timings`` per response, the per-request speculation figures, one ``unread``
    line per thing that could not be read."""
    unread = [f"event {i + 1}: {c.error}" for i, c in enumerate(chunks) if c.kind == "error"]
    token_chunks = [c for c in chunks if c.generated]
    usage = [c.usage["completion_tokens"] for c in chunks
             if c.usage and isinstance(c.usage.get("completion_tokens"), int)]
    responses = split_responses(chunks)
    timings = [t for t in (_last([c.timings for c in r if c.timings is not None]) for r in responses) if t]
    specs = [s for s in (_last([c.spec_stats for c in r if c.spec_stats]) for r in responses) if s]
    fingerprints = sorted({c.system_fingerprint for c in chunks if c.system_fingerprint})
    stream: dict[str, float | str | list[str] | None] = {
        "events": len(chunks),
        "responses": len(responses),
        "streams_done": sum(1 for c in chunks if c.kind == "done"),
        "token_chunks": len(token_chunks),
        "answer_chars": sum(len(c.text) for c in chunks),
        "reasoning_chars": sum(len(c.reasoning) for c in chunks),
        "completion_tokens": sum(usage) if usage else None,
        "mean_tokens_per_chunk": sum(usage) / len(token_chunks) if usage and token_chunks and fmt == "sse" else None,
        "models": sorted({c.model for c in chunks if c.model}),
    }
    totals = response_timings_totals(timings)
    if totals:
        stream.update({f"timings_{k}": cast(float, v) for k, v in totals.items() if v is not None})  # counts, ms
    per_request = _spec_sums(specs)
    if per_request:
        stream["per_request_source"] = per_request["source"]
        counts = {"responses": per_request["responses"], "drafts": per_request["drafts"],
                  "draft_tokens": per_request["draft_tokens"], "accepted": per_request["accepted"]}  # KEYS' order
        stream.update({f"per_request_{k}": v for k, v in counts.items() if v is not None})
    if not usage:
        unread.append("no usage.completion_tokens: tokens per chunk unknown (send stream_options.include_usage)")
    unread.append("an SSE capture has no arrival times: TTFT, TPOT and ITL need a live probe" if fmt == "sse" else
                  "a non-streamed reply has no chunks and no arrival times: tokens per chunk, TTFT, TPOT and ITL "
                  "need a streamed one")
    engine = "llama.cpp" if timings else (specs[0]["source"] if specs else None)
    return {"format": fmt, "engine": engine, "version": ", ".join(fingerprints) or None, "stream": stream,
            "response_timings": totals, "per_request_spec": per_request,
            "spec_decode": response_timings_figures(timings), "unread": unread}


def _spec_sums(specs: list[EngineSpecStats]) -> PerRequestSums | None:
    """vLLM / SGLang per-request figures (last per response) summed per key; None when there are none."""
    counts = [c for c in (counts_from_spec_stats(s) for s in specs) if c is not None]
    if not counts:
        return None

    def total(key: str) -> int | None:
        values = [getattr(c, key) for c in counts if getattr(c, key) is not None]
        return sum(values) if values else None

    return {"source": counts[0].source, "responses": len(counts), "drafts": total("drafts"),
            "draft_tokens": total("draft_tokens"), "accepted": total("accepted")}


def zero_is_off(engines: list[EngineNames]) -> set[str]:
    """The gauges whose 0 is an engine's "speculation off", not a measurement: SGLang's
    ``spec_accept_length`` (a measured length counts the bonus token, so it is >= 1) and ``spec_accept_rate``."""
    return {n for e in engines for n in (e.accept_length_gauge, e.accept_rate_gauge) if n}


def counter_rows(found: InspectResult) -> list[tuple[str, str]]:
    """(label, value) rows of a dump's counters and gauges, for the ``inspect`` table."""
    rows = []
    for name, c in (found["counters"] if found["format"] == "prometheus" else {}).items():
        value = c["value"]
        shown = f"{value:.6g}" if isinstance(value, float) else "not measured" if value is None else str(value)
        series = f" over {c['series']} series" if c["series"] > 1 else ""
        says = c.get("note") or c.get("help")
        rows.append((f"{name} ({c['type']})", f"{shown}{series}" + (f": {says}" if says else "")))
    return rows


def inspect_vllm_bench(text: str) -> BenchmarkFindings:
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    whole = _json_object(text)
    parts = [(0, text)] if whole is not None else lines
    records: list[EndpointSummary] = []
    unread: list[str] = []
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


def inspect_guidellm(text: str) -> BenchmarkFindings:
    obj = _json_object(text) or {}
    return {"format": "guidellm", "engine": None, "version": guidellm_version(obj),
            "records": parse_guidellm(obj, "guidellm report"), "unread": []}


READERS: dict[str, Callable[[str], InspectResult]] = {
    "prometheus": inspect_prometheus, "sse": inspect_sse, "completion": inspect_completion,
    "vllm-bench": inspect_vllm_bench, "guidellm": inspect_guidellm}


def inspect_file(path: str | Path) -> InspectResult:
    """What ``path`` holds (see the module docstring); the definitions of its figures ride along."""
    text = read_text(path)
    try:
        found = READERS[sniff(text)](text)
    except SpecLedgerError as exc:
        raise SpecLedgerError(f"{path}: {exc}") from None
    return cast(InspectResult, {"file": str(path), **found, "definitions": DEFINITIONS})  # the file's key first


__all__ = ["DEFINITIONS", "BenchmarkFindings", "InspectResult", "PerRequestSums", "PrometheusFindings",
           "ScalarFamily", "StreamFindings", "counter_rows", "engine_scalars", "inspect_chunks", "inspect_file",
           "read_text", "sniff", "split_responses"]
