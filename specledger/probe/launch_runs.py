"""One configuration's part of a ``probe --launch`` run (:class:`SpecRun`): saved and read back, its repeats
merged, paired with ``off`` at every load, and its server-counter windows reconciled and pooled into one
acceptance ledger."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict, cast

from specledger.ledger.server_acceptance import AcceptanceLedgerDict, acceptance_ledger
from specledger.probe.counters import EngineCountersReport, engine_counters_over, windows_counts
from specledger.probe.documents import EndpointReport, ProbeDocument, SpecCountersSnapshot
from specledger.probe.endpoint_loads import LoadPoint
from specledger.probe.engine_command import Spec
from specledger.probe.loadgen import RequestResult
from specledger.probe.metrics import speedup, summarize
from specledger.rundir import json_safe

#: a later repeat's request numbers start at repeat x this (merge_repeats): ids stay unique across repeats
REPEAT_INDEX_STRIDE = 1_000_000


class SavedPoint(TypedDict):
    """One load of a saved configuration: the endpoint's report there, per-request results included."""

    load: int
    report: EndpointReport


class SpecRunDoc(TypedDict):
    """:meth:`SpecRun.to_dict`: a configuration's part as saved (``launch/NAME.json``, ``race/rNNN-NAME.json``)."""

    name: str
    args: list[str]  # the configuration's engine arguments
    argv: list[str]  # the command line that ran
    log: str  # the engine's log file
    ready_s: float | None  # seconds until it answered /health
    points: list[SavedPoint]


#: the server-counter scrapes (before, after) around one load of one repeat
CounterWindow = tuple[SpecCountersSnapshot | None, SpecCountersSnapshot | None]


class PooledLedger(AcceptanceLedgerDict):
    """:func:`pooled_ledger`: the acceptance ledger of one configuration over its whole run, with the counts
    behind it (``gamma``: the configured draft length)."""

    rounds: int  # draft rounds
    draft_tokens: int  # draft tokens proposed
    accepted: int  # draft tokens accepted
    acceptance_rate: float | None  # accepted / draft_tokens
    positions_seen: int  # positions the counters show


@dataclass
class SpecRun:
    """One configuration's part of the run: every load's report and per-request results."""

    spec: Spec
    argv: list[str]
    log: str
    ready_s: float | None
    points: list[LoadPoint] = field(default_factory=list)

    def to_dict(self) -> SpecRunDoc:
        doc = {"name": self.spec.name, "args": list(self.spec.args), "argv": self.argv, "log": self.log,
               "ready_s": self.ready_s, "points": [{"load": p.load, "report": p.full["probe"]} for p in self.points]}
        return cast(SpecRunDoc, json_safe(doc))  # the same keys, as strict JSON

    @classmethod
    def from_dict(cls, doc: SpecRunDoc) -> SpecRun:
        points = [LoadPoint(int(p["load"]), {"probe": p["report"]},
                            [RequestResult.from_dict(r) for r in p["report"].get("results") or []])
                  for p in doc["points"]]
        return cls(Spec(str(doc["name"]), tuple(doc["args"])), list(doc["argv"]), str(doc["log"]),
                   doc.get("ready_s"), points)


def point_windows(point: LoadPoint) -> list[CounterWindow]:
    """The server-counter windows (before, after) behind one load point: one per repeat (a merged point keeps
    them under ``windows``; a restarted server counts from zero, so windows are added, never spanned)."""
    report = point.full["probe"]
    if report.get("windows") is not None:
        return [(b, a) for b, a in report["windows"]]
    counters = report.get("spec_decode_counters")
    return [(counters.get("before"), counters.get("after"))] if counters else [(None, None)]


def merge_repeats(runs: Sequence[SpecRun]) -> SpecRun:
    """One configuration's repeats as one run: per load, every repeat's results together and the probe
    summary over them (:func:`specledger.probe.metrics.summarize`, the repeats' wall times added: throughput is
    Σ tokens / Σ time); the server-counter window of every (repeat, load) kept, since a restarted server counts
    from zero (:func:`counters_of` adds the windows' deltas)."""
    first = runs[0]
    if len(runs) == 1:
        return first
    points = []
    for p in first.points:
        same = [q for run in runs for q in run.points if q.load == p.load]
        # each repeat's request numbers offset, so request ids (drafter|γ|prompt|index) stay unique
        results = [dataclasses.replace(r, index=k * REPEAT_INDEX_STRIDE + r.index)
                   for k, q in enumerate(same) for r in q.results]
        wall = sum(float(q.full["probe"]["summary"].get("wall_time_s") or 0.0) for q in same)
        report: EndpointReport = {**p.full["probe"], "summary": summarize(results, wall), "repeats": len(same),
                  "windows": [w for q in same for w in point_windows(q)],
                  "results": [r.to_dict() for r in results],
                  "warnings": [w for q in same for w in q.full["probe"].get("warnings") or []],
                  # one server's window each: pooled over the repeats in launch.specs.NAME.ledger instead
                  "spec_decode": None, "spec_decode_counters": None, "server_histograms": {}, "server_rates": {},
                  "spec_decode_note": f"pooled over {len(same)} repeats: see launch.specs in run.json"}
        points.append(LoadPoint(p.load, {"probe": report}, results))
    return SpecRun(first.spec, first.argv, first.log, first.ready_s, points)


def _points_by_load(run: SpecRun) -> dict[int, LoadPoint]:
    return {p.load: p for p in run.points}


def paired_points(cand: SpecRun, base: SpecRun) -> list[LoadPoint]:
    """``cand`` against ``off`` at every load: the ``probe --baseline --loads`` shape (off ran first)."""
    base_at = _points_by_load(base)
    out = []
    for p in cand.points:
        b = base_at[p.load]
        full: ProbeDocument = {"probe": p.full["probe"], "baseline": b.full["probe"],
                               "speedup": speedup(p.full["probe"]["summary"], b.full["probe"]["summary"])}
        out.append(LoadPoint(p.load, full, p.results, b.results, ("baseline", "probe")))
    return out


def counters_of(run: SpecRun) -> EngineCountersReport:
    """Σ per-request speculation figures over every load and repeat against the server's counter deltas added
    over the (repeat, load) windows (:func:`specledger.probe.counters.engine_counters_over`: nothing else
    reached the server inside a window; a restarted server counts from zero)."""
    return engine_counters_over([r for p in run.points for r in p.results],
                                [w for p in run.points for w in point_windows(p)])


def _accepted_at(scrape: SpecCountersSnapshot | None) -> dict[str, float]:
    """A scrape's accepted draft tokens per position ({} for none, or no scrape)."""
    return (scrape.get("accepted_per_pos") if scrape else None) or {}


def pooled_ledger(run: SpecRun | Sequence[LoadPoint], gamma: int | None) -> PooledLedger:
    """The acceptance ledger of one configuration over its whole run, from the server's counter windows (each
    load of each repeat): ``E[L] = 1 + accepted / drafts`` (bonus token counted), per-position rates
    ``Pr(K ≥ i) = Δaccepted_at_i / Δdrafts`` and their conditional chain
    (:func:`specledger.ledger.server_acceptance.acceptance_ledger`), ``gamma`` the configured draft length
    (not the number of positions the counters show). Every figure None when the server drafted nothing."""
    points = run.points if isinstance(run, SpecRun) else run
    windows = [w for p in points for w in point_windows(p)]
    totals = windows_counts(windows)[0]  # the same deltas engine_counters_over reconciles
    drafts, drafted, accepted = (float(totals[k] or 0) for k in ("drafts", "draft_tokens", "accepted"))

    def delta_at(position: str) -> float:
        return sum(float(_accepted_at(a).get(position) or 0) - float(_accepted_at(b).get(position) or 0)
                   for b, a in windows)

    positions = sorted({int(k) for _, a in windows for k in _accepted_at(a)})
    rates = [delta_at(str(i)) / drafts for i in positions] if drafts > 0 else []
    ledger = acceptance_ledger({"per_position_rates": rates,
                                "mean_acceptance_length": 1 + accepted / drafts if drafts > 0 else None})
    return {**ledger, "gamma": gamma, "rounds": int(drafts), "draft_tokens": int(drafted), "accepted": int(accepted),
            "acceptance_rate": accepted / drafted if drafted > 0 else None, "positions_seen": len(rates)}
