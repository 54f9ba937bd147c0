"""Latency histograms (bucket deltas, interpolated quantiles) and counter-pair rates of a ``/metrics`` window,
read with the name tables of :mod:`specledger.probe.engines`."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from specledger.errors import SpecLedgerError
from specledger.probe.documents import CounterRate, LatencyHistogramSummary
from specledger.probe.engines import LATENCY_DEFINITIONS, engines_in
from specledger.probe.prometheus import MetricsSnapshot, counter_delta, counter_total


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


def latency_histogram_summaries(before: MetricsSnapshot, after: MetricsSnapshot
                                ) -> dict[str, LatencyHistogramSummary]:
    """Latency histogram deltas of every engine found in ``after`` -> {quantity: {metric, definition, count,
    mean_s, p50_s, p95_s, p99_s}} (quantities of :data:`~specledger.probe.engines.LATENCY_DEFINITIONS`;
    for each, the first name of the first engine that exports one)."""
    out: dict[str, LatencyHistogramSummary] = {}
    for engine in engines_in(after.names()):
        for key, names in engine.histograms.items():
            for name in names:
                after_hist = histogram_from_snapshot(after, name)
                if key in out or after_hist is None:
                    continue
                delta = histogram_delta(histogram_from_snapshot(before, name), after_hist)
                out[key] = {
                    "metric": name,
                    "definition": LATENCY_DEFINITIONS[key],
                    "count": delta.count,
                    "mean_s": delta.mean,
                    "p50_s": histogram_quantile(0.5, delta.buckets),
                    "p95_s": histogram_quantile(0.95, delta.buckets),
                    "p99_s": histogram_quantile(0.99, delta.buckets),
                    "approximate": "interpolated within histogram buckets; server-wide",
                }
    return out


def counter_rates(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, CounterRate]:
    """Rates the engines' counter pairs give over the window: Δnumerator / Δdenominator (llama.cpp's
    tokens_predicted / tokens_predicted_seconds is the generation speed of one busy slot, not wall-clock
    throughput); None where the denominator did not grow."""
    out: dict[str, CounterRate] = {}
    for engine in engines_in(after.names()):
        for label, numerator, denominator in engine.rates:
            num = counter_delta(counter_total(before, numerator), counter_total(after, numerator))
            den = counter_delta(counter_total(before, denominator), counter_total(after, denominator))
            if num is None or den is None:
                continue
            out[label] = {"numerator": numerator, "denominator": denominator,
                          "value": num / den if den > 0 else None}
    return out
