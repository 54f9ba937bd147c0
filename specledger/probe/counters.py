"""Per-request speculation figures against the server's own counters: do they agree?

Three quantities, vLLM's meaning, the same on both sides:

* ``drafts``: draft (verify) rounds;
* ``draft_tokens``: draft tokens proposed;
* ``accepted``: draft tokens accepted (the bonus token of a round not counted).

**Per request** (one :class:`RequestCounts` per finished request, :func:`request_counts`), read from what
each engine returns with a response, as their sources write it:

* llama.cpp: ``timings.draft_n`` and ``timings.draft_n_accepted`` (``server_slot_stats::to_json``). Each
  ``timings`` is a cumulative snapshot of the response, so the *last* one counts (``draft_n`` 25 then 60
  in one response is 60, never 85). ``to_json`` writes the draft fields only once the slot drafted, so a
  ``timings`` without them is 0 drafted, 0 accepted. No rounds per response: ``drafts`` is None.
* vLLM >= 0.29, started with ``--per-request-spec-decode-metrics summary`` (or ``detailed``):
  ``metrics.speculative_decoding`` on the final usage chunk (so ``stream_options.include_usage`` must be
  on; n == 1 only): ``num_spec_steps`` -> drafts, ``num_draft_tokens`` -> draft_tokens,
  ``num_accepted_draft_tokens`` -> accepted. vLLM 0.8 - 0.28 return no per-request speculation figure
  at all (``RequestOutput`` / the OpenAI protocol carry none).
* SGLang >= 0.5.19, with the request option ``"return_spec_tokens_details": true``
  (:data:`SGLANG_REQUEST_OPTION`): ``sglext.spec_tokens_details`` in a chunk of its own: ``spec_verify_ct``
  -> drafts, ``spec_num_proposed_drafts`` -> draft_tokens, ``spec_num_correct_drafts`` -> accepted. Earlier
  SGLang puts them only in the native ``/generate`` ``meta_info`` (``spec_verify_ct`` from 0.4;
  ``spec_accept_token_num`` / ``spec_draft_token_num`` in 0.5.6 - 0.5.10, ``spec_accepted_drafts`` /
  ``spec_proposed_drafts`` in 0.5.11, ``spec_num_correct_drafts`` / ``spec_num_proposed_drafts`` from
  0.5.12), not in the OpenAI API the probe speaks; those ``meta_info`` keys are read too when a mapping
  carries them.

**Server** (``server_after - server_before``, two ``/metrics`` scrapes): vLLM ``vllm:spec_decode_num_drafts``,
``..._num_draft_tokens``, ``..._num_accepted_tokens``; llama.cpp ``llamacpp:spec_decode_num_drafts`` (its
verification steps), ``..._num_draft_tokens``, ``..._num_accepted_tokens`` (both add a slot's figures when
its request ends); SGLang >= 0.5.15 ``sglang:spec_verify_calls_total`` (drafts only: the sum of the
finished requests' ``spec_verify_ct``).

Entry point, for the launcher (one call per spec name; store the result as
``summary["engine_counters"][NAME]``)::

    engine_counters(per_request, server_before, server_after, tolerance=0.01) -> {
        "server": {"drafts", "draft_tokens", "accepted"},           # counter deltas, None if not exported
        "per_request_sum": {"drafts", "draft_tokens", "accepted"},  # Σ over requests, None if none reports it
        "rel_diff": {key: |a - b| / max(|a|, |b|) or None},         # 0 when both are 0
        "agree": bool | None,      # every comparable key within tolerance; None when no key is comparable
        "compared": [keys], "requests": n, "requests_reporting": k,
        "sources": {"per_request": ..., "server": ...}, "tolerance": 0.01,
        "verdict": "one sentence",
    }

``per_request``: :class:`~specledger.records.RequestRecord` (``extra["engine_spec"]``, written by
:mod:`specledger.probe.records`), :class:`~specledger.probe.loadgen.RequestResult` (``server_timings`` /
``server_spec``), their ``to_dict()`` forms (a probe report's ``results``), or a mapping with the three
keys. ``server_before`` / ``server_after``: a :class:`~specledger.probe.prometheus.MetricsSnapshot`,
Prometheus text, a probe report's ``spec_decode_counters["before"]`` / ``["after"]`` entry, or None (no
scrape: before counts as zero, after as not exported). Pure: nothing is fetched.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from specledger.probe.engines import LLAMACPP, VLLM, SpecCounterNames
from specledger.probe.prometheus import (
    EMPTY_SNAPSHOT,
    MetricsSnapshot,
    counter_total,
    parse_prometheus_text,
)

KEYS = ("drafts", "draft_tokens", "accepted")
LABELS = {"drafts": "drafts", "draft_tokens": "draft tokens", "accepted": "accepted"}
TOLERANCE = 0.01
#: the request body field that makes SGLang (>= 0.5.19) return per-request speculation figures
SGLANG_REQUEST_OPTION = {"return_spec_tokens_details": True}
#: SGLang >= 0.5.15: verification calls, summed over finished requests
SGLANG_VERIFY_CALLS = "sglang:spec_verify_calls"
#: per-request field names, (drafts, draft_tokens, accepted), by source
_VLLM_FIELDS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")
_SGLANG_FIELDS = (("spec_verify_ct",), ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num"),
                  ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num"))


class RequestCountsDoc(TypedDict):
    """:meth:`RequestCounts.to_dict`: a record's ``extra["engine_spec"]``."""

    drafts: int | None
    draft_tokens: int | None
    accepted: int | None
    source: str


class CounterSources(TypedDict):
    """Where each side's figures came from: the per-request sources seen, the engine whose counters were read."""

    per_request: list[str] | None
    server: str | None


class _CountersCompared(TypedDict):
    """Both sides of :func:`engine_counters` and how they compare (counts in tokens or rounds)."""

    server: dict[str, int | float | None]  # counter deltas per quantity (KEYS); None where not exported
    per_request_sum: dict[str, int | None]  # Σ over the requests that report it; None where none does
    rel_diff: dict[str, float | None]  # |a - b| / max(|a|, |b|); None where a side is missing
    agree: bool | None  # every comparable quantity within ``tolerance``; None when none is comparable
    compared: list[str]  # the quantities on both sides
    requests: int
    requests_reporting: int  # requests that returned figures
    sources: CounterSources
    tolerance: float  # relative
    warnings: list[str]


class EngineCountersReport(_CountersCompared):
    """:func:`engine_counters`: per-request speculation figures reconciled with the server's counters (run.json
    and summary.json ``engine_counters.NAME``), with a one-sentence verdict."""

    verdict: str


@dataclass(frozen=True)
class RequestCounts:
    """One request's speculation figures (None where its engine does not report one) and their source."""

    drafts: int | None
    draft_tokens: int | None
    accepted: int | None
    source: str

    def to_dict(self) -> RequestCountsDoc:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "source": self.source}


#: no engine counts 2**53 draft tokens; past it a float cannot hold every whole number
MAX_COUNT = 2**53


def _count(value: Any) -> int | None:
    """A whole count in 0 .. :data:`MAX_COUNT`; None for anything else (bools, strings, NaN, 1e400, -3, 2.5)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if 0 <= value <= MAX_COUNT else None


def counts_from_timings(timings: Mapping[str, Any]) -> RequestCounts:
    """llama.cpp's last ``timings`` of a response: draft_n / draft_n_accepted, 0 / 0 when absent (llama.cpp
    writes them only once the slot drafted); a draft_n_accepted above draft_n is not a count (None)."""
    drafted = _count(timings.get("draft_n")) if "draft_n" in timings else 0
    accepted = _count(timings.get("draft_n_accepted")) if "draft_n_accepted" in timings else 0
    if drafted is not None and accepted is not None and accepted > drafted:
        drafted = accepted = None
    return RequestCounts(drafts=None, draft_tokens=drafted, accepted=accepted, source="llama.cpp timings")


def _first(details: Mapping[str, Any], names: Iterable[str]) -> int | None:
    for name in names:
        if name in details:
            return _count(details[name])
    return None


def _summed(values: list[int | None]) -> int | None:
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


def counts_from_spec_stats(spec: Mapping[str, Any]) -> RequestCounts | None:
    """vLLM's ``metrics.speculative_decoding`` or SGLang's ``sglext.spec_tokens_details`` (a list when n > 1:
    summed), as tagged by :func:`specledger.probe.sse.engine_spec_stats`; None for anything else."""
    source, details = spec.get("source"), spec.get("details")
    items = details if isinstance(details, list) else [details]
    if not items or not all(isinstance(d, Mapping) for d in items):
        return None
    if source == "vllm":
        fields = [[_count(d.get(name)) if name in d else None for d in items] for name in _VLLM_FIELDS]
        label = "vLLM metrics.speculative_decoding"
    elif source == "sglang":
        fields = [[_first(d, names) for d in items] for names in _SGLANG_FIELDS]
        label = "SGLang sglext.spec_tokens_details"
    else:
        return None
    drafts, tokens, accepted = (_summed(f) for f in fields)
    return RequestCounts(drafts=drafts, draft_tokens=tokens, accepted=accepted, source=label)


def _counts_from_mapping(item: Mapping[str, Any]) -> RequestCounts | None:
    """A mapping: already normalised counts, a RequestResult.to_dict(), or an SGLang ``meta_info``."""
    if any(k in item for k in KEYS) and "source" in item:
        return RequestCounts(*(_count(item.get(k)) for k in KEYS), source=str(item.get("source")))
    extra = item.get("extra")
    if isinstance(extra, Mapping) and isinstance(extra.get("engine_spec"), Mapping):
        return _counts_from_mapping(extra["engine_spec"])
    if isinstance(item.get("server_spec"), Mapping):
        found = counts_from_spec_stats(item["server_spec"])
        if found is not None:
            return found
    if isinstance(item.get("server_timings"), Mapping):
        return counts_from_timings(item["server_timings"])
    if "spec_verify_ct" in item:  # SGLang's native meta_info
        found = counts_from_spec_stats({"source": "sglang", "details": dict(item)})
        return None if found is None else RequestCounts(found.drafts, found.draft_tokens, found.accepted,
                                                        "SGLang meta_info")
    return None


def request_counts(item: Any) -> RequestCounts | None:
    """The speculation figures of one request, whatever carries them (module docstring); None when the
    engine returned none with it. vLLM / SGLang figures win over llama.cpp ``timings`` when both exist."""
    if isinstance(item, Mapping):
        return _counts_from_mapping(item)
    extra = getattr(item, "extra", None)
    if isinstance(extra, Mapping):
        spec = extra.get("engine_spec")
        return _counts_from_mapping(spec) if isinstance(spec, Mapping) else None
    spec, timings = getattr(item, "server_spec", None), getattr(item, "server_timings", None)
    if isinstance(spec, Mapping) and (found := counts_from_spec_stats(spec)) is not None:
        return found
    return counts_from_timings(timings) if isinstance(timings, Mapping) else None


def _snapshot(value: MetricsSnapshot | str | None) -> MetricsSnapshot | None:
    if value is None or isinstance(value, MetricsSnapshot):
        return value
    return parse_prometheus_text(value)


def _whole(value: float | None) -> int | float | None:
    return int(value) if value is not None and math.isfinite(value) and value.is_integer() else value


#: the keys of a probe report's ``spec_decode_counters.before`` / ``.after`` (specledger/probe/endpoint.py)
_REPORT_KEYS = {"drafts": "num_drafts", "draft_tokens": "num_draft_tokens", "accepted": "num_accepted_tokens"}

Scrape = MetricsSnapshot | str | Mapping[str, Any] | None


def _report_counts(before: Mapping[str, Any] | None, after: Mapping[str, Any]
                   ) -> tuple[dict[str, int | float | None], str | None, list[str]]:
    """Δ of two ``spec_decode_counters`` entries of a probe report (``{"engine", "num_drafts", ...}``)."""
    out: dict[str, int | float | None] = dict.fromkeys(KEYS)
    warnings = []
    for key, name in _REPORT_KEYS.items():
        value = after.get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        start = (before or {}).get(name)
        delta = value - (start if isinstance(start, (int, float)) and not isinstance(start, bool) else 0)
        if delta < 0:
            warnings.append(f"{name} went backwards between the scrapes (server restarted?)")
        else:
            out[key] = _whole(float(delta))
    engine = after.get("engine")
    return out, engine if isinstance(engine, str) else None, warnings


def server_counts(before: Scrape, after: Scrape) -> tuple[dict[str, int | float | None], str | None, list[str]]:
    """(Δ counters per key, the engine whose names were found, warnings). A counter absent from ``after``
    is None; one absent from ``before`` counts from 0; one that went backwards is None, with a warning.
    Each side is a snapshot, Prometheus text, a probe report's ``spec_decode_counters`` entry, or None."""
    if isinstance(after, Mapping):
        return _report_counts(before if isinstance(before, Mapping) else None, after)
    if isinstance(before, Mapping):
        before = None  # a report entry cannot be subtracted from a scrape: read ``after`` as totals
    old, new = _snapshot(before) or EMPTY_SNAPSHOT, _snapshot(after)
    empty: dict[str, int | float | None] = dict.fromkeys(KEYS)
    if new is None:
        return empty, None, []
    for engine, spec in (("vllm", VLLM.spec), ("llama.cpp", LLAMACPP.spec)):
        names = _spec_names(spec)
        found = {k: counter_total(new, names[k]) for k in KEYS}
        if any(v is not None for v in found.values()):
            return _deltas(old, found, names, engine)
    verify = counter_total(new, SGLANG_VERIFY_CALLS)
    if verify is not None:
        return _deltas(old, {**empty, "drafts": verify}, {"drafts": SGLANG_VERIFY_CALLS}, "sglang")
    return empty, None, []


def _spec_names(spec: SpecCounterNames | None) -> dict[str, str]:
    assert spec is not None  # vLLM and llama.cpp both have a spec-decode counter table
    return {"drafts": spec.drafts, "draft_tokens": spec.draft_tokens, "accepted": spec.accepted}


def _deltas(old: MetricsSnapshot, after: dict[str, float | None], names: dict[str, str], engine: str
            ) -> tuple[dict[str, int | float | None], str, list[str]]:
    out: dict[str, int | float | None] = dict.fromkeys(KEYS)
    warnings = []
    for key, value in after.items():
        if value is None:
            continue
        delta = value - (counter_total(old, names[key]) or 0.0)
        if delta < 0:
            warnings.append(f"{names[key]} went backwards between the scrapes (server restarted?)")
        else:
            out[key] = _whole(delta)
    return out, engine, warnings


def rel_diff(a: float | None, b: float | None) -> float | None:
    """|a - b| / max(|a|, |b|); 0 when both are 0; None when either is missing or not finite."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return None
    scale = max(abs(a), abs(b))
    return 0.0 if scale == 0 else abs(a - b) / scale


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _no_figures_hint(engine: str | None) -> str:
    return {
        "vllm": "vLLM returns them only from v0.29, started with --per-request-spec-decode-metrics summary, "
                "on the usage chunk (stream_options.include_usage)",
        "sglang": 'SGLang returns them from v0.5.19 when the request sends "return_spec_tokens_details": true',
        "llama.cpp": "llama.cpp returns them in each response's timings; none was read",
    }.get(engine or "", "the engine returned none with its responses")


def _verdict(result: _CountersCompared, warnings: list[str]) -> str:
    server, summed, compared = result["server"], result["per_request_sum"], result["compared"]
    engine = result["sources"]["server"]
    if warnings:
        return f"cannot reconcile: {warnings[0]}"
    if result["requests_reporting"] == 0 and engine is None:
        return "nothing to reconcile: no per-request speculation figures and no spec-decode counters on the server"
    if result["requests_reporting"] == 0:
        return f"nothing to reconcile: no request carried speculation figures ({_no_figures_hint(engine)})"
    if engine is None:
        return "nothing to reconcile: the server exports no spec-decode counters (or was not scraped)"
    if not compared:
        return "nothing to reconcile: the per-request figures and the server counters share no quantity"
    pairs = ", ".join(f"{LABELS[k]} {_fmt(summed[k])} vs {_fmt(server[k])}" for k in compared)
    missing = [LABELS[k] for k in KEYS if k not in compared]
    tail = f"; {', '.join(missing)} not comparable" if missing else ""
    short = result["requests_reporting"] < result["requests"]
    lost = f" ({result['requests'] - result['requests_reporting']} request(s) returned no figures)" if short else ""
    if result["agree"]:
        return (f"per-request sums agree with the server counters within {result['tolerance']:.0%} "
                f"(per-request vs server: {pairs}{tail}){lost}")
    worst = max(compared, key=lambda k: result["rel_diff"][k] or 0.0)
    return (f"per-request sums disagree with the server counters ({pairs}; {LABELS[worst]} off by "
            f"{result['rel_diff'][worst]:.1%}){lost}: other traffic on the server, requests the client lost, "
            "or figures the engine does not count alike")


def engine_counters(
    per_request: Iterable[Any],
    server_before: Scrape,
    server_after: Scrape,
    tolerance: float = TOLERANCE,
) -> EngineCountersReport:
    """Reconcile Σ per-request speculation figures with the server's counter deltas (module docstring for
    the shape). ``agree``: for every key both sides report, :func:`rel_diff` <= ``tolerance``; None when
    no key is on both sides."""
    return engine_counters_over(per_request, [(server_before, server_after)], tolerance)


def windows_counts(windows: Sequence[tuple[Scrape, Scrape]]
                   ) -> tuple[dict[str, int | float | None], str | None, list[str]]:
    """:func:`server_counts` added over several (before, after) windows (one server per window, or one server
    restarted between them); a key None in any window is None."""
    parts = [server_counts(before, after) for before, after in windows] or [server_counts(None, None)]
    server: dict[str, int | float | None] = {
        k: None if any(p[0][k] is None for p in parts) else sum(p[0][k] for p in parts) for k in KEYS}
    engine = next((p[1] for p in parts if p[1] is not None), None)
    return server, engine, [w for p in parts for w in p[2]]


def engine_counters_over(
    per_request: Iterable[Any],
    windows: Sequence[tuple[Scrape, Scrape]],
    tolerance: float = TOLERANCE,
) -> EngineCountersReport:
    """:func:`engine_counters` with the server's side added over ``windows`` (:func:`windows_counts`)."""
    items = list(per_request)
    counts = [c for c in (request_counts(i) for i in items) if c is not None]
    summed: dict[str, int | None] = {k: _summed_present([getattr(c, k) for c in counts]) for k in KEYS}
    server, engine, warnings = windows_counts(windows)
    diffs = {k: rel_diff(summed[k], server[k]) for k in KEYS}
    compared = [k for k in KEYS if diffs[k] is not None]
    result: _CountersCompared = {
        "server": server,
        "per_request_sum": summed,
        "rel_diff": diffs,
        "agree": all((diffs[k] or 0.0) <= tolerance for k in compared) if compared and not warnings else None,
        "compared": compared,
        "requests": len(items),
        "requests_reporting": len(counts),
        "sources": {"per_request": sorted({c.source for c in counts}) or None, "server": engine},
        "tolerance": tolerance,
        "warnings": warnings,
    }
    return {**result, "verdict": _verdict(result, warnings)}


def _summed_present(values: list[int | None]) -> int | None:
    """Σ of the requests that report the quantity; None when none does."""
    present = [v for v in values if v is not None]
    return sum(present) if present else None


__all__ = ["KEYS", "SGLANG_REQUEST_OPTION", "TOLERANCE", "CounterSources", "EngineCountersReport", "RequestCounts",
           "RequestCountsDoc", "counts_from_spec_stats", "counts_from_timings", "engine_counters",
           "engine_counters_over", "rel_diff", "request_counts", "server_counts", "windows_counts"]
