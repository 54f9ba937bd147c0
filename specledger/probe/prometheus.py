"""Prometheus text exposition -> a flat snapshot of samples, and sums over it (counters, gauges).

Parsing is delegated to ``prometheus_client.parser`` and wrapped so that malformed input
raises :class:`SpecLedgerError` naming the offending line, never another exception.

Counters are compared between two scrapes (before / after a probe run). vLLM's counters
may be exposed with or without the ``_total`` suffix and with any extra labels
(``model_name``, ``engine`` ...); values are summed across those labels.

What the samples mean for speculative decoding is :mod:`specledger.probe.spec_figures`; latency histograms
and counter rates are :mod:`specledger.probe.histograms`.

A server chooses how much it exposes, so the text is read line by line and only a bounded part reaches the
parser (:func:`bounded_exposition`): at most :data:`MAX_SERIES_PER_NAME` series per sample name and
:data:`MAX_SERIES` in all, and per-position series (a ``position`` label) only up to :data:`MAX_POSITION`;
the rest is counted in :attr:`MetricsSnapshot.dropped` and named in one warning. Memory and what is written
then stay bounded whatever the size of the exposition.
"""

from __future__ import annotations

import io
import math
import re
import warnings
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from specledger.errors import SpecLedgerError, SpecLedgerWarning

#: series kept per sample name (a vLLM histogram has ~30 buckets per label set) and over the whole exposition
MAX_SERIES_PER_NAME = 4096
MAX_SERIES = 50_000
#: per-position acceptance series past this position are dropped (no drafter proposes more tokens per step;
#: spec_figures.MAX_POSITIONS - 1), all but the first MAX_FAR_POSITIONS of them, which the figures then name
MAX_POSITION = 255
MAX_FAR_POSITIONS = 16
#: a line longer than this (a label value of megabytes) is dropped whatever it is
MAX_LINE_CHARS = 64 * 1024
_POSITION = re.compile(r'[{,]\s*position\s*=\s*"(\d+)"')


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
    dropped: int = 0  # sample lines past the caps of bounded_exposition, not read

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


def _sample_name(line: str) -> str:
    """The sample name a sample line starts with (up to ``{``, a space or a tab)."""
    end = len(line)
    for sep in ("{", " ", "\t"):
        at = line.find(sep, 0, end)
        if at >= 0:
            end = at
    return line[:end]


def bounded_exposition(text: str) -> tuple[str, int]:
    """(the exposition with only the sample lines within the caps, how many sample lines were dropped).

    Comments (HELP, TYPE) up to :data:`MAX_SERIES` of them are kept, blank lines dropped; a line longer than
    :data:`MAX_LINE_CHARS` is dropped; a sample line is dropped once its name has :data:`MAX_SERIES_PER_NAME`
    series, once :data:`MAX_SERIES` are kept in all, or when its ``position`` label is above
    :data:`MAX_POSITION` (but for the first :data:`MAX_FAR_POSITIONS`). Reads ``text`` line by line (no list
    of every line is built)."""
    kept: list[str] = []
    per_name: dict[str, int] = {}
    total = dropped = comments = far = 0
    for line in io.StringIO(text):
        if len(line) > MAX_LINE_CHARS:
            dropped += 1
            continue
        body = line.strip()
        if not body:
            continue
        if body.startswith("#"):
            comments += 1
            if comments > MAX_SERIES:
                dropped += 1
            else:
                kept.append(line if line.endswith("\n") else line + "\n")
            continue
        name = _sample_name(body)
        position = _POSITION.search(body) if "position" in body else None
        count = per_name.get(name, 0)
        is_far = position is not None and int(position.group(1)) > MAX_POSITION
        if total >= MAX_SERIES or count >= MAX_SERIES_PER_NAME or (is_far and far >= MAX_FAR_POSITIONS):
            dropped += 1
            continue
        far += is_far
        per_name[name] = count + 1
        total += 1
        kept.append(line if line.endswith("\n") else line + "\n")
    return "".join(kept), dropped


def parse_prometheus_text(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a flat snapshot, within the caps of :func:`bounded_exposition`
    (what they drop is counted in ``dropped`` and named in one :class:`SpecLedgerWarning`).

    Raises SpecLedgerError (with the 1-based line number) when the text is malformed.
    """
    if not isinstance(text, str):
        raise SpecLedgerError("Prometheus metrics must be text; fetch the /metrics endpoint as text")
    if "\x00" in text:
        raise SpecLedgerError("Prometheus metrics contain a NUL byte; is this really a /metrics endpoint?")
    bounded, dropped = bounded_exposition(text)
    try:
        samples = tuple(
            MetricSample(name=s.name, labels=dict(s.labels), value=float(s.value))
            for family in text_string_to_metric_families(bounded)
            for s in family.samples
        )
    except Exception:
        number, line, reason = _first_bad_line(text)
        shown = line if len(line) <= 80 else line[:77] + "..."
        raise SpecLedgerError(
            f"malformed Prometheus text at line {number} ({reason}): {shown!r}; "
            "point --metrics at a Prometheus text endpoint or use --no-metrics"
        ) from None
    if dropped:
        warnings.warn(SpecLedgerWarning(
            f"the metrics exposition has more series than are read: {dropped} sample lines past the caps "
            f"({MAX_SERIES_PER_NAME} per name, {MAX_SERIES} in all, positions up to {MAX_POSITION}) were not read"),
            stacklevel=2)
    return MetricsSnapshot(samples=samples, dropped=dropped)


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
            for f in text_string_to_metric_families(bounded_exposition(text)[0])]


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

