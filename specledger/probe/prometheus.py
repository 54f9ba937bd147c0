"""Prometheus text exposition -> a flat snapshot of samples, and sums over it (counters, gauges).

Parsing is delegated to ``prometheus_client.parser`` and wrapped so that malformed input
raises :class:`SpecLedgerError` naming the offending line, never another exception.

Counters are compared between two scrapes (before / after a probe run). vLLM's counters
may be exposed with or without the ``_total`` suffix and with any extra labels
(``model_name``, ``engine`` ...); values are summed across those labels.

What the samples mean for speculative decoding is :mod:`specledger.probe.spec_figures`; latency histograms
and counter rates are :mod:`specledger.probe.histograms`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from specledger.errors import SpecLedgerError


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


EMPTY_SNAPSHOT = MetricsSnapshot(samples=())


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


@dataclass(frozen=True)
class MetricFamily:
    """One family of an exposition as declared: name (no ``_total``), TYPE, HELP, (sample name, value)s."""

    name: str
    type: str
    help: str
    samples: tuple[tuple[str, float], ...]


def metric_families(text: str) -> list[MetricFamily]:
    """The families of a Prometheus text exposition with their TYPE and HELP (what a flat
    :class:`MetricsSnapshot` drops); malformed text raises like :func:`parse_prometheus_text`."""
    parse_prometheus_text(text)  # the one-line error for malformed text
    return [MetricFamily(name=f.name, type=f.type, help=f.documentation or "",
                         samples=tuple((s.name, float(s.value)) for s in f.samples))
            for f in text_string_to_metric_families(text)]


def base_name(sample_name: str) -> str:
    """Counter name without the ``_total`` suffix."""
    return sample_name[: -len("_total")] if sample_name.endswith("_total") else sample_name


def counter_total(snapshot: MetricsSnapshot, name: str) -> float | None:
    """Sum of counter ``name`` (with or without ``_total``) across all label sets; None if absent."""
    values = [s.value for s in snapshot.samples if base_name(s.name) == name]
    if not values:
        return None
    try:
        return math.fsum(values)
    except OverflowError:  # partial sums past the float range (values near 1e308): the plain sum is ±inf
        return float(sum(values))


def counter_by_label(snapshot: MetricsSnapshot, name: str, label: str) -> dict[str, float]:
    """Counter ``name`` summed per value of ``label`` (other labels summed away)."""
    out: dict[str, float] = {}
    for s in snapshot.samples:
        if base_name(s.name) == name and label in s.labels:
            out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def gauge_values(snapshot: MetricsSnapshot, name: str) -> list[float]:
    """The finite values of gauge ``name``, one per label set (e.g. per data-parallel rank)."""
    return [s.value for s in snapshot.samples if s.name == name and math.isfinite(s.value)]


def gauge_mean(snapshot: MetricsSnapshot, name: str) -> float | None:
    """Mean of gauge ``name`` across label sets (e.g. one per data-parallel rank); None if absent."""
    return finite_mean(gauge_values(snapshot, name))


def finite_mean(values: list[float]) -> float | None:
    """The mean of finite ``values`` (None if empty), finite too: a hostile server's values near 1e308 overflow
    the plain sum, so then each is divided by the count first."""
    if not values:
        return None
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return math.fsum(v / len(values) for v in values)



def counter_delta(before: float | None, after: float | None) -> float | None:
    """after - before of one counter (missing before counts as 0); None when absent after."""
    if after is None:
        return None
    return after - (before or 0.0)

