"""Prometheus text exposition -> speculative-decoding and latency figures.

Parsing is delegated to ``prometheus_client.parser`` and wrapped so that malformed input
raises :class:`SpecLedgerError` naming the offending line, never another exception.

Counters are compared between two scrapes (before / after a probe run). vLLM's counters
may be exposed with or without the ``_total`` suffix and with any extra labels
(``model_name``, ``engine`` ...); values are summed across those labels.

Conventions (K = accepted candidates of a draft round, L = K + 1 committed tokens):

* ``mean_acceptance_length`` = 1 + accepted / drafts (vLLM's convention: the bonus token
  of a full round is counted, so it is E[L] = E[K] + 1 per draft round).
* ``draft_acceptance_rate`` = accepted / draft_tokens (fraction of proposed tokens kept).
* ``per_position_rates[i]`` = accepted_per_pos[i] / drafts = Pr(K >= i+1), unconditional.
* ``conditional_rates[i]`` = rate[i] / rate[i-1] = a_{i+1}, with rate[-1] = Pr(K >= 0) = 1
  (:func:`specledger.ledger.acceptance.conditional_ratios`: as measured, None where undefined).
* SGLang exposes gauges ``sglang:spec_accept_length`` (bonus token counted inside) and
  ``sglang:spec_accept_rate``: gauges are not deltas, so the after-scrape value is reported
  and it describes the whole server, not this probe.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from specledger.errors import SpecLedgerError
from specledger.ledger.acceptance import conditional_ratios

SERVER_WIDE_WARNING = (
    "server-wide counters: they include any other traffic the server handled during the probe window"
)

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"
SGLANG_ACCEPT_RATE = "sglang:spec_accept_rate"

TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
ITL_HISTOGRAMS = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")


@dataclass(frozen=True)
class MetricSample:
    """One exposed sample: full sample name (suffixes included), labels, value."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class MetricsSnapshot:
    """All samples of one scrape, flattened across metric families."""

    samples: tuple[MetricSample, ...]

    def names(self) -> set[str]:
        return {s.name for s in self.samples}


def _first_bad_line(text: str) -> tuple[int, str, str]:
    """Find the first line that the parser rejects on its own; (line number, line, reason)."""
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            for family in text_string_to_metric_families(line + "\n"):
                list(family.samples)
        except Exception as exc:  # the parser raises ValueError, IndexError, KeyError ...
            return number, line, str(exc) or type(exc).__name__
    return 0, "", "inconsistent metric families"


def parse_prometheus_text(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a flat snapshot.

    Raises SpecLedgerError (with the 1-based line number) when the text is malformed.
    """
    if not isinstance(text, str):
        raise SpecLedgerError("Prometheus metrics must be text; fetch the /metrics endpoint as text")
    if "\x00" in text:
        raise SpecLedgerError("Prometheus metrics contain a NUL byte; is this really a /metrics endpoint?")
    try:
        samples = tuple(
            MetricSample(name=s.name, labels=dict(s.labels), value=float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        )
    except Exception:
        number, line, reason = _first_bad_line(text)
        shown = line if len(line) <= 80 else line[:77] + "..."
        raise SpecLedgerError(
            f"malformed Prometheus text at line {number} ({reason}): {shown!r}; "
            "point --metrics at a Prometheus text endpoint or use --no-metrics"
        ) from None
    return MetricsSnapshot(samples=samples)


def _base_name(sample_name: str) -> str:
    """Counter name without the ``_total`` suffix."""
    return sample_name[: -len("_total")] if sample_name.endswith("_total") else sample_name


def counter_total(snapshot: MetricsSnapshot, name: str) -> float | None:
    """Sum of counter ``name`` (with or without ``_total``) across all label sets; None if absent."""
    values = [s.value for s in snapshot.samples if _base_name(s.name) == name]
    return math.fsum(values) if values else None


def counter_by_label(snapshot: MetricsSnapshot, name: str, label: str) -> dict[str, float]:
    """Counter ``name`` summed per value of ``label`` (other labels summed away)."""
    out: dict[str, float] = {}
    for s in snapshot.samples:
        if _base_name(s.name) == name and label in s.labels:
            out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def gauge_mean(snapshot: MetricsSnapshot, name: str) -> float | None:
    """Mean of gauge ``name`` across label sets (e.g. one per data-parallel rank); None if absent."""
    values = [s.value for s in snapshot.samples if s.name == name and math.isfinite(s.value)]
    return math.fsum(values) / len(values) if values else None


@dataclass(frozen=True)
class SpecDecodeCounters:
    """vLLM spec-decode counters of one scrape (summed across labels); None where absent."""

    num_drafts: float | None
    num_draft_tokens: float | None
    num_accepted_tokens: float | None
    accepted_per_pos: dict[int, float] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snapshot: MetricsSnapshot) -> SpecDecodeCounters:
        per_pos: dict[int, float] = {}
        for position, value in counter_by_label(snapshot, VLLM_ACCEPTED_PER_POS, "position").items():
            try:
                per_pos[int(position)] = value
            except ValueError:
                raise SpecLedgerError(
                    f"{VLLM_ACCEPTED_PER_POS} has a non-integer position label {position!r}"
                ) from None
        return cls(
            num_drafts=counter_total(snapshot, VLLM_DRAFTS),
            num_draft_tokens=counter_total(snapshot, VLLM_DRAFT_TOKENS),
            num_accepted_tokens=counter_total(snapshot, VLLM_ACCEPTED),
            accepted_per_pos=per_pos,
        )

    @property
    def present(self) -> bool:
        return self.num_drafts is not None


def _delta(before: float | None, after: float | None) -> float | None:
    if after is None:
        return None
    return after - (before or 0.0)


def counters_delta(before: SpecDecodeCounters, after: SpecDecodeCounters) -> SpecDecodeCounters:
    """after - before, field by field (a counter missing before counts as 0)."""
    positions = sorted(set(before.accepted_per_pos) | set(after.accepted_per_pos))
    return SpecDecodeCounters(
        num_drafts=_delta(before.num_drafts, after.num_drafts),
        num_draft_tokens=_delta(before.num_draft_tokens, after.num_draft_tokens),
        num_accepted_tokens=_delta(before.num_accepted_tokens, after.num_accepted_tokens),
        accepted_per_pos={
            p: after.accepted_per_pos.get(p, before.accepted_per_pos.get(p, 0.0))
            - before.accepted_per_pos.get(p, 0.0)
            for p in positions
        },
    )


@dataclass
class SpecDecodeFigures:
    """Spec-decode figures for a probe window, with their provenance and caveats."""

    source: str | None = None  # "vllm", "sglang" or None when the server exposes neither
    num_drafts: float | None = None
    num_draft_tokens: float | None = None
    num_accepted_tokens: float | None = None
    mean_acceptance_length: float | None = None  # 1 + accepted/drafts (bonus token counted)
    mean_accepted_per_draft: float | None = None  # accepted/drafts = E[K] (no bonus token)
    draft_acceptance_rate: float | None = None  # accepted/draft_tokens
    per_position_rates: list[float] = field(default_factory=list)  # Pr(K >= i+1)
    conditional_rates: list[float | None] = field(default_factory=list)  # a_{i+1}
    sglang_accept_length: float | None = None  # gauge, bonus token counted inside
    sglang_accept_rate: float | None = None  # gauge
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def spec_decode_figures(before: MetricsSnapshot, after: MetricsSnapshot) -> SpecDecodeFigures:
    """Spec-decode figures over the window between two scrapes (see module docstring)."""
    figures = SpecDecodeFigures(warnings=[SERVER_WIDE_WARNING])
    after_counters = SpecDecodeCounters.from_snapshot(after)
    if after_counters.present:
        figures.source = "vllm"
        delta = counters_delta(SpecDecodeCounters.from_snapshot(before), after_counters)
        figures.num_drafts = delta.num_drafts
        figures.num_draft_tokens = delta.num_draft_tokens
        figures.num_accepted_tokens = delta.num_accepted_tokens
        values = [delta.num_drafts, delta.num_draft_tokens, delta.num_accepted_tokens]
        values += list(delta.accepted_per_pos.values())
        if any(v is not None and v < 0 for v in values):
            figures.warnings.append("a counter went backwards between scrapes (server restarted?)")
            return figures
        drafts, accepted = delta.num_drafts or 0.0, delta.num_accepted_tokens
        if drafts > 0 and accepted is not None:
            figures.mean_accepted_per_draft = accepted / drafts
            figures.mean_acceptance_length = 1.0 + accepted / drafts
        if delta.num_draft_tokens and accepted is not None:
            figures.draft_acceptance_rate = accepted / delta.num_draft_tokens
        if drafts > 0 and delta.accepted_per_pos:
            last = max(delta.accepted_per_pos)
            rates = [delta.accepted_per_pos.get(p, 0.0) / drafts for p in range(last + 1)]
            figures.per_position_rates = rates
            figures.conditional_rates = conditional_ratios(rates)
        if drafts == 0:
            figures.warnings.append("no draft rounds during the probe window (spec decoding off or idle?)")
    accept_length = gauge_mean(after, SGLANG_ACCEPT_LENGTH)
    accept_rate = gauge_mean(after, SGLANG_ACCEPT_RATE)
    if accept_length is not None or accept_rate is not None:
        figures.source = figures.source or "sglang"
        figures.sglang_accept_length = accept_length
        figures.sglang_accept_rate = accept_rate
        figures.warnings.append(
            "SGLang spec_accept_length/spec_accept_rate are gauges (after-scrape value, server-wide, "
            "not a delta); SGLang's accept length counts the bonus token inside"
        )
    if figures.source is None:
        figures.warnings.append("the server exposes no spec-decode metrics")
    return figures


# --- histograms -----------------------------------------------------------------------------


@dataclass(frozen=True)
class HistogramDelta:
    """Cumulative bucket counts (upper bound -> count <= bound), sum and count over a window."""

    buckets: tuple[tuple[float, float], ...]
    total: float
    count: float

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None


def histogram_from_snapshot(snapshot: MetricsSnapshot, name: str) -> HistogramDelta | None:
    """Histogram ``name`` summed across labels (buckets keyed by ``le``); None if absent."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    found = False
    for s in snapshot.samples:
        if s.name == f"{name}_bucket" and "le" in s.labels:
            try:
                bound = float(s.labels["le"])
            except ValueError:
                raise SpecLedgerError(
                    f"{name}_bucket has a non-numeric le label {s.labels['le']!r}"
                ) from None
            buckets[bound] = buckets.get(bound, 0.0) + s.value
            found = True
        elif s.name == f"{name}_sum":
            total += s.value
        elif s.name == f"{name}_count":
            count += s.value
    if not found:
        return None
    return HistogramDelta(buckets=tuple(sorted(buckets.items())), total=total, count=count)


def histogram_delta(before: HistogramDelta | None, after: HistogramDelta) -> HistogramDelta:
    """after - before, bucket by bucket (a missing before counts as empty)."""
    if before is None:
        return after
    old = dict(before.buckets)
    return HistogramDelta(
        buckets=tuple((bound, value - old.get(bound, 0.0)) for bound, value in after.buckets),
        total=after.total - before.total,
        count=after.count - before.count,
    )


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Approximate the q-quantile from cumulative buckets, Prometheus-style.

    Linear interpolation inside the bucket holding rank q*N (lower bound of the first bucket is
    0); if that bucket is +Inf, the largest finite bound is returned. None when empty.
    """
    ordered = sorted(buckets)
    if not ordered or not 0.0 <= q <= 1.0:
        return None
    total = ordered[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, cumulative in ordered:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower_bound
            width = cumulative - lower_count
            if width <= 0:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / width
        lower_bound, lower_count = bound, cumulative
    return ordered[-1][0] if math.isfinite(ordered[-1][0]) else lower_bound


def latency_histogram_summaries(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, dict]:
    """TTFT and inter-token latency histogram deltas -> {mean, p50, p95, p99, count} in seconds."""
    out: dict[str, dict] = {}
    candidates = {"ttft": (TTFT_HISTOGRAM,), "itl": ITL_HISTOGRAMS}
    for key, names in candidates.items():
        for name in names:
            after_hist = histogram_from_snapshot(after, name)
            if after_hist is None:
                continue
            delta = histogram_delta(histogram_from_snapshot(before, name), after_hist)
            out[key] = {
                "metric": name,
                "count": delta.count,
                "mean_s": delta.mean,
                **{f"p{int(q * 100)}_s": histogram_quantile(q, delta.buckets) for q in (0.5, 0.95, 0.99)},
                "approximate": "interpolated within histogram buckets; server-wide",
            }
            break
    return out
