"""Spec-decode figures of a window between two ``/metrics`` scrapes, for every engine.

Conventions (K = accepted candidates of a draft round, L = K + 1 committed tokens):

* ``mean_acceptance_length`` = 1 + accepted / drafts (vLLM's convention: the bonus token
  of a full round is counted, so it is E[L] = E[K] + 1 per draft round).
* ``draft_acceptance_rate`` = accepted / draft_tokens (fraction of proposed tokens kept).
* ``per_position_rates[i]`` = accepted_per_pos[i] / drafts = Pr(K >= i+1), unconditional.
* ``conditional_rates[i]`` = rate[i] / rate[i-1] = a_{i+1}, with rate[-1] = Pr(K >= 0) = 1
  (:func:`specledger.ledger.acceptance.conditional_ratios`: as measured, None where undefined).
* SGLang exposes gauges ``sglang:spec_accept_length`` (bonus token counted inside) and
  ``sglang:spec_accept_rate``: gauges are not deltas, so the after-scrape value is reported
  and it describes the whole server, not this probe. Both are 0 when speculation is off: read as
  ``off``, never as a measured length of 0.
* Positions are kept sparse (a dict ``position -> count``) and only positions 0 .. :data:`MAX_POSITIONS` - 1
  become rates: a ``position="1000000000"`` label (a broken or hostile exporter) costs what position 10
  costs, and is named in a warning instead of stretching the rates to a billion entries.
* Consistency: 1 + Σ_i per_position_rates[i] must equal 1 + accepted / drafts (every accepted token
  sits at one position); a gap larger than half a token per draft round is warned (positions missing
  from the dump, or a data-parallel deployment whose per-position counters undercount).

Which names each engine exports (vLLM v1 and v0, SGLang, llama.cpp, TGI) is the table of
:mod:`specledger.probe.engines`; every reader here looks names up there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from specledger.errors import SpecLedgerError
from specledger.ledger.acceptance import conditional_ratios
from specledger.ledger.server_acceptance import per_position_mismatch
from specledger.probe.documents import SpecDecodeDoc
from specledger.probe.engines import ENGINES, SGLANG, VLLM, EngineNames, SpecCounterNames
from specledger.probe.prometheus import (
    MetricsSnapshot,
    base_name,
    counter_by_label,
    counter_delta,
    counter_total,
    finite_mean,
    gauge_mean,
    gauge_values,
)

SERVER_WIDE_WARNING = (
    "server-wide counters: they include any other traffic the server handled during the probe window"
)
DUMP_WARNING = "one scrape: counters are totals since the server started, over all its traffic"
#: positions 0 .. MAX_POSITIONS - 1 are read as rates (llama.cpp exports 0..63; no drafter proposes 256)
MAX_POSITIONS = 256

# Kept for callers that name vLLM's counters directly; every name lives in :mod:`specledger.probe.engines`.
VLLM_DRAFTS = VLLM.spec.drafts
VLLM_DRAFT_TOKENS = VLLM.spec.draft_tokens
VLLM_ACCEPTED = VLLM.spec.accepted
VLLM_ACCEPTED_PER_POS = VLLM.spec.accepted_per_pos
SGLANG_ACCEPT_LENGTH = SGLANG.accept_length_gauge
SGLANG_ACCEPT_RATE = SGLANG.accept_rate_gauge


@dataclass(frozen=True)
class SpecDecodeCounters:
    """Spec-decode counters of one scrape (summed across labels); None where absent."""

    num_drafts: float | None
    num_draft_tokens: float | None
    num_accepted_tokens: float | None
    accepted_per_pos: dict[int, float] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snapshot: MetricsSnapshot, names: SpecCounterNames = VLLM.spec) -> SpecDecodeCounters:
        per_pos: dict[int, float] = {}
        for position, value in counter_by_label(snapshot, names.accepted_per_pos, "position").items():
            try:
                per_pos[int(position)] = value
            except ValueError:
                raise SpecLedgerError(
                    f"{names.accepted_per_pos} has a non-integer position label {position!r}"
                ) from None
        return cls(
            num_drafts=counter_total(snapshot, names.drafts),
            num_draft_tokens=counter_total(snapshot, names.draft_tokens),
            num_accepted_tokens=counter_total(snapshot, names.accepted),
            accepted_per_pos=per_pos,
        )

    @property
    def present(self) -> bool:
        return self.num_drafts is not None



def spec_counter_engine(snapshot: MetricsSnapshot) -> EngineNames | None:
    """The first engine (vLLM, then llama.cpp) whose spec-decode drafts counter ``snapshot`` holds."""
    names = {base_name(n) for n in snapshot.names()}
    return next((e for e in ENGINES if e.spec is not None and e.spec.drafts in names), None)


def counters_delta(before: SpecDecodeCounters, after: SpecDecodeCounters) -> SpecDecodeCounters:
    """after - before, field by field (a counter missing before counts as 0)."""
    positions = sorted(set(before.accepted_per_pos) | set(after.accepted_per_pos))
    return SpecDecodeCounters(
        num_drafts=counter_delta(before.num_drafts, after.num_drafts),
        num_draft_tokens=counter_delta(before.num_draft_tokens, after.num_draft_tokens),
        num_accepted_tokens=counter_delta(before.num_accepted_tokens, after.num_accepted_tokens),
        accepted_per_pos={
            p: after.accepted_per_pos.get(p, before.accepted_per_pos.get(p, 0.0))
            - before.accepted_per_pos.get(p, 0.0)
            for p in positions
        },
    )


@dataclass
class SpecDecodeFigures:
    """Spec-decode figures for a probe window, with their provenance and caveats.

    Two acceptance lengths that users confuse: ``mean_acceptance_length`` is *pooled* over draft rounds
    (1 + Σ accepted / Σ drafts, every round weighs the same); a per-request mean (the mean over requests of
    each request's own 1 + accepted/drafts) weighs short requests as much as long ones, and differs.
    """

    source: str | None = None  # "vllm", "vllm v0", "llama.cpp", "sglang" or None when none is exposed
    num_drafts: float | None = None
    num_draft_tokens: float | None = None
    num_accepted_tokens: float | None = None
    mean_acceptance_length: float | None = None  # 1 + accepted/drafts (bonus token counted), pooled
    mean_accepted_per_draft: float | None = None  # accepted/drafts = E[K] (no bonus token)
    draft_acceptance_rate: float | None = None  # accepted/draft_tokens
    per_position_rates: list[float] = field(default_factory=list)  # Pr(K >= i+1)
    conditional_rates: list[float | None] = field(default_factory=list)  # a_{i+1}
    sglang_accept_length: float | None = None  # gauge, bonus token counted inside
    sglang_accept_rate: float | None = None  # gauge
    off: bool = False  # the engine states that speculation is off (SGLang's zero gauges)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> SpecDecodeDoc:
        return cast(SpecDecodeDoc, dict(self.__dict__))  # every field by name: SpecDecodeDoc's keys


def _counter_figures(figures: SpecDecodeFigures, names: SpecCounterNames, before: MetricsSnapshot,
                     after: MetricsSnapshot) -> None:
    """Drafts, tokens, accepted and per-position rates from the counters' window delta."""
    delta = counters_delta(SpecDecodeCounters.from_snapshot(before, names),
                           SpecDecodeCounters.from_snapshot(after, names))
    figures.num_drafts = delta.num_drafts
    figures.num_draft_tokens = delta.num_draft_tokens
    figures.num_accepted_tokens = delta.num_accepted_tokens
    values = [delta.num_drafts, delta.num_draft_tokens, delta.num_accepted_tokens]
    values += list(delta.accepted_per_pos.values())
    if any(v is not None and v < 0 for v in values):
        figures.warnings.append("a counter went backwards between scrapes (server restarted?)")
        return
    drafts, accepted = delta.num_drafts or 0.0, delta.num_accepted_tokens
    if drafts > 0 and accepted is not None:
        figures.mean_accepted_per_draft = accepted / drafts
        figures.mean_acceptance_length = 1.0 + accepted / drafts
    if delta.num_draft_tokens and accepted is not None:
        figures.draft_acceptance_rate = accepted / delta.num_draft_tokens
    per_pos = _readable_positions(figures, names.accepted_per_pos, delta.accepted_per_pos)
    if names.trim_trailing_zero_positions:
        for position in sorted(per_pos, reverse=True):
            if per_pos[position] != 0:
                break
            del per_pos[position]
    if drafts > 0 and per_pos:
        last = max(per_pos)
        missing = [p for p in range(last + 1) if p not in per_pos]
        if missing:
            figures.warnings.append(
                f"{names.accepted_per_pos} lacks position(s) {', '.join(map(str, missing[:8]))}; counted as 0"
            )
        figures.per_position_rates = [per_pos.get(p, 0.0) / drafts for p in range(last + 1)]
        figures.conditional_rates = conditional_ratios(figures.per_position_rates)
        mismatch = per_position_mismatch(
            figures.mean_acceptance_length, figures.per_position_rates, tolerance=0.5 / drafts
        )
        if mismatch:
            figures.warnings.append(mismatch)
    if drafts == 0:
        figures.warnings.append("no draft rounds in the window (spec decoding off or idle?)")


def _readable_positions(figures: SpecDecodeFigures, name: str, per_pos: dict[int, float]) -> dict[int, float]:
    """The positions 0 .. :data:`MAX_POSITIONS` - 1 of ``per_pos`` (still sparse); the others are named in
    one warning (at most three of them) and left out."""
    kept = {p: v for p, v in per_pos.items() if 0 <= p < MAX_POSITIONS}
    dropped = sorted(p for p in per_pos if p not in kept)
    if dropped:
        shown = ", ".join(str(p) if abs(p) < 10**30 else f"~1e{len(str(abs(p))) - 1}" for p in dropped[:3])
        figures.warnings.append(
            f"{name}: {len(dropped)} position label(s) outside 0..{MAX_POSITIONS - 1} left out ({shown}"
            f"{' ...' if len(dropped) > 3 else ''}): not a speculative position"
        )
    return kept


def _legacy_vllm_figures(figures: SpecDecodeFigures, before: MetricsSnapshot, after: MetricsSnapshot) -> bool:
    """vLLM v0: drafts = emitted - accepted (each round emits its accepted tokens plus one); True if found."""
    emitted = counter_delta(counter_total(before, VLLM.legacy_emitted_counter),
                     counter_total(after, VLLM.legacy_emitted_counter))
    if emitted is None:
        return False
    figures.source = "vllm v0"
    accepted = counter_delta(counter_total(before, VLLM.legacy_accepted),
                             counter_total(after, VLLM.legacy_accepted))
    tokens = counter_delta(counter_total(before, VLLM.legacy_draft_tokens),
                           counter_total(after, VLLM.legacy_draft_tokens))
    figures.num_accepted_tokens, figures.num_draft_tokens = accepted, tokens
    if accepted is not None and emitted - accepted > 0 and accepted >= 0:
        figures.num_drafts = emitted - accepted
        figures.mean_accepted_per_draft = accepted / figures.num_drafts
        figures.mean_acceptance_length = emitted / figures.num_drafts
    if accepted is not None and tokens:
        figures.draft_acceptance_rate = accepted / tokens
    elif (gauge := gauge_mean(after, VLLM.legacy_acceptance_rate_gauge)) is not None:
        figures.draft_acceptance_rate = gauge
    figures.warnings.append("vLLM v0 counters: draft rounds derived as emitted - accepted tokens")
    return True


def _gauge_figures(figures: SpecDecodeFigures, engine: EngineNames, after: MetricsSnapshot) -> None:
    """SGLang's gauges (after-scrape value). A rank that exports 0 is not speculating: SGLang's accept
    length counts the bonus token, so a measured length is at least 1. All zero means off."""
    lengths = gauge_values(after, engine.accept_length_gauge)
    rates = gauge_values(after, engine.accept_rate_gauge)
    if not lengths and not rates:
        return
    figures.source = figures.source or engine.engine
    measured = [v for v in lengths if v > 0]
    if not measured and not any(v > 0 for v in rates):
        figures.off = True
        figures.warnings.append(
            f"{engine.accept_length_gauge} is 0: speculative decoding is off on this server (0 is SGLang's "
            "'off', not a measured length: a measured length counts the bonus token, so it is at least 1)"
        )
        return
    if any(v < 1 for v in measured):
        figures.warnings.append(f"{engine.accept_length_gauge} below 1 on some rank: not a possible length")
    figures.sglang_accept_length = finite_mean(measured)
    kept = [r for r, n in zip(rates, lengths) if n > 0] if len(rates) == len(lengths) else rates
    figures.sglang_accept_rate = finite_mean(kept)
    figures.warnings.append(
        "SGLang spec_accept_length/spec_accept_rate are gauges (after-scrape value, server-wide, "
        "not a delta); SGLang's accept length counts the bonus token inside"
    )
    if len(measured) < len(lengths):
        figures.warnings.append("ranks exporting spec_accept_length 0 (not speculating) are left out of the mean")


def spec_decode_figures(
    before: MetricsSnapshot, after: MetricsSnapshot, scope_warning: str = SERVER_WIDE_WARNING
) -> SpecDecodeFigures:
    """Spec-decode figures over the window between two scrapes (see module docstring), read with the
    name tables of :mod:`specledger.probe.engines`: vLLM v1 or llama.cpp counters, else vLLM v0 counters;
    SGLang gauges. Pass :data:`EMPTY_SNAPSHOT` as ``before`` to read one dump (totals since start)."""
    figures = SpecDecodeFigures(warnings=[scope_warning])
    engine = spec_counter_engine(after)
    if engine is not None and engine.spec is not None:
        figures.source = engine.engine
        _counter_figures(figures, engine.spec, before, after)
    else:
        _legacy_vllm_figures(figures, before, after)
    _gauge_figures(figures, SGLANG, after)
    if figures.source is None:
        figures.warnings.append("the server exposes no spec-decode metrics")
    return figures
