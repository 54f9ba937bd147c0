"""``specledger probe URL --baseline URL2 --loads 1,4,16``: the verdict per load for a real engine.

At each load L (ascending) both endpoints serve the same requests -- max(``--requests``, L) of them,
the workload cycled in the same order -- closed loop at concurrency L, one endpoint after the other.
The order alternates from one load to the next (the endpoint first at the 1st, 3rd, ... load, the
baseline first at the others), so a slow phase of the machine does not always hit the same side.
``/metrics`` is scraped around each endpoint's part, so every load has its own spec-decode figures.

The requests become a run (:func:`load_point_records`) shaped like ``specledger run --loads``:

* load 1 is the solo job's shape (one request at a time): its records are the run's main records
  (``extra.load = 1``), analysed like the local solo job -- the gates of :mod:`specledger.gates`;
* every load L > 1 is a load point as :mod:`specledger.mainjob.measured_loads` writes them:
  ``extra.experiment = "load"``, ``kind = "concurrency"``, ``load``, ``setting``, ``point_wall_s``
  (that endpoint's wall time at that load), ``point_tokens`` and ``point_requests``; there is no
  ``point_cpu_s`` (the server's CPU is not the client's to see), so the capacity gate reports no CPU
  cost. :mod:`specledger.gates.load_verdicts` then gives the four gates and the verdict per (category,
  temperature, load), and :mod:`specledger.gates.schedule` the schedule.

Without ``--baseline`` every load still gets its figures (records per load), but no verdict: there
is no plain decoding to compare with.

``--loads A..B`` measures both ends, then bisects in powers of two wherever S against 1 (per category) changes
between adjacent measured loads, until each change is bracketed within 2× (:mod:`specledger.load_bisect`, the
planner ``specledger run`` uses too); the load order (which side first) follows the order measured.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from specledger.errors import SpecLedgerError
from specledger.probe.documents import EndpointReport, ProbeDocument, Side, SpecDecodeDoc
from specledger.probe.endpoint import probe_endpoint_results
from specledger.probe.loadgen import LoadConfig, PromptItem, RequestResult, Tokenizer
from specledger.probe.metrics import speedup
from specledger.records import EXPERIMENT_KEY, LOAD_EXPERIMENT, GammaSpec, RequestRecord, setting_label


@dataclass
class LoadPoint:
    """Both endpoints at one load: ``full = {"probe": report[, "baseline": report, "speedup": ratios]}``
    and each side's per-request results; ``order`` says which side ran first."""

    load: int
    full: ProbeDocument
    results: list[RequestResult]
    base_results: list[RequestResult] = field(default_factory=list)
    order: tuple[Side, ...] = ("probe",)


def at_load(config: LoadConfig, load: int) -> LoadConfig:
    """``config`` as a closed loop at concurrency ``load`` over max(its request count, ``load``) requests."""
    if load < 1:
        raise SpecLedgerError(f"load {load} is not a concurrency; give whole numbers >= 1, e.g. --loads 1,4,16")
    return replace(config, concurrency=int(load), rate=None, num_requests=max(int(config.num_requests), int(load)))


def side_order(index: int, with_baseline: bool) -> tuple[Side, ...]:
    """Which endpoint runs first at the ``index``-th load: the probed one at even indexes, the baseline at odd."""
    if not with_baseline:
        return ("probe",)
    return ("probe", "baseline") if index % 2 == 0 else ("baseline", "probe")


def run_probe_loads(
    url: str,
    config: LoadConfig,
    items: list[PromptItem],
    loads: Sequence[int],
    *,
    baseline: str | None = None,
    baseline_config: LoadConfig | None = None,
    metrics: bool = True,
    tokenizer: Tokenizer | None = None,
    progress: Callable[[int, str], None] | None = None,
    locate: bool = False,
    categories: Mapping[str, str] | None = None,
    keys: Callable[[Sequence[LoadPoint]], Mapping[int, Hashable]] | None = None,
    afford: Callable[[int], bool] | None = None,
) -> list[LoadPoint]:
    """Both endpoints at every load of ``loads`` (ascending), alternating which goes first. With ``locate``
    (``--loads A..B``: ``loads`` holds the ends) the loads :func:`specledger.load_bisect.next_load` asks for follow,
    read from ``keys(points)`` (default :func:`speedup_keys`: S against 1 per category of ``categories``, prompt
    id -> category) and each run only while ``afford(load)`` allows it; the points come back sorted by load."""
    from specledger.load_bisect import locate as bisect

    points: list[LoadPoint] = []
    targets = {"probe": (url, config), "baseline": (baseline, baseline_config or config)}

    def measure(load: int) -> None:
        order = side_order(len(points), bool(baseline))
        got: dict[Side, tuple[EndpointReport, list[RequestResult]]] = {}
        for role in order:
            where, cfg = targets[role]
            if progress:
                progress(load, role)
            got[role] = probe_endpoint_results(str(where), at_load(cfg, load), items, metrics=metrics,
                                               tokenizer=tokenizer)
        full: ProbeDocument = {"probe": got["probe"][0]}
        base_results: list[RequestResult] = []
        if "baseline" in got:
            base_report, base_results = got["baseline"]
            full["baseline"] = base_report
            full["speedup"] = speedup(full["probe"]["summary"], base_report["summary"])
        points.append(LoadPoint(load, full, got["probe"][1], base_results, order))

    wanted = sorted(set(int(x) for x in loads))
    if locate:
        bisect(wanted, measure, lambda: (keys or (lambda ps: speedup_keys(ps, categories)))(points), afford)
    else:
        for load in wanted:
            measure(load)
    return sorted(points, key=lambda p: p.load)


def category_speedups(point: LoadPoint, categories: Mapping[str, str] | None = None) -> dict[str, float | None]:
    """Per category (``categories``: prompt id -> category; one group "all" without it): S = (Σ tokens / Σ request
    time) of the probed endpoint over the baseline's, over the requests that succeeded -- the paired ratio of
    speed-ups with plain decoding cancelled (docs/decisions.md); None where a side has no tokens or no time."""
    def rates(results: Sequence[RequestResult]) -> dict[str, float | None]:
        tok: dict[str, float] = {}
        sec: dict[str, float] = {}
        for r in results:
            if not r.ok:
                continue
            c = categories.get(r.prompt_id or "", "all") if categories else "all"
            tok[c] = tok.get(c, 0.0) + float(r.completion_tokens)
            sec[c] = sec.get(c, 0.0) + max(0.0, float(r.end_s) - float(r.start_s))
        return {c: (tok[c] / sec[c] if sec[c] > 0 and tok[c] > 0 else None) for c in tok}

    mine, base = rates(point.results), rates(point.base_results)
    return {c: (mine[c] / base[c] if mine.get(c) and base.get(c) else None) for c in sorted(set(mine) | set(base))}


def speedup_keys(points: Sequence[LoadPoint], categories: Mapping[str, str] | None = None) -> dict[int, Hashable]:
    """``{load: key}`` for the load bisection: per category, whether S (:func:`category_speedups`) is above 1
    (None where it is unknown: no baseline, no tokens). Loads with equal keys answered alike."""
    return {p.load: tuple((c, None if s is None else s > 1.0) for c, s in category_speedups(p, categories).items())
            for p in points}


def tag_load_point(records: list[RequestRecord], load: int, drafter: str, gamma: GammaSpec,
                   wall_s: float | None) -> list[RequestRecord]:
    """Label one endpoint's records at ``load`` (in place; returned): ``extra.load`` always; at load > 1
    also the load-point keys of :mod:`specledger.mainjob.measured_loads` and a request id unique across loads."""
    tokens = sum(r.output_tokens for r in records)
    for r in records:
        r.extra["load"] = int(load)
        if load > 1:
            r.request_id = f"load{load}|{r.request_id}"
            r.extra.update({
                EXPERIMENT_KEY: LOAD_EXPERIMENT, "kind": "concurrency", "setting": setting_label(drafter, gamma),
                "point_wall_s": wall_s, "point_tokens": tokens, "point_requests": len(records),
            })
    return records


def first_spec_decode(points: Sequence[LoadPoint]) -> SpecDecodeDoc | None:
    """The probed endpoint's spec-decode figures at the lowest load that has per-position rates (else the
    lowest load's): the gamma label of every load comes from them, so all loads name the same setting."""
    figures = [p.full["probe"].get("spec_decode") for p in points]
    return next((f for f in figures if f and f.get("per_position_rates")), figures[0] if figures else None)


class LoadEntry(ProbeDocument):
    """One load of ``probe.json``'s ``loads``: its figures (:class:`ProbeDocument`, results kept), the load and
    which endpoint ran first."""

    load: int
    order: list[Side]


class LoadReport(EndpointReport):
    """One configuration's report at one load in ``probe.json``'s ``specs`` (``--launch``; results left out)."""

    load: int


class LoadsDocument(ProbeDocument, total=False):
    """``probe.json`` of a probe at loads (and of ``--launch``, which adds ``specs``: each configuration's
    reports per load)."""

    loads: list[LoadEntry]
    specs: dict[str, list[LoadReport]]


def probe_document(points: Sequence[LoadPoint]) -> LoadsDocument:
    """``probe.json`` of a probe at loads: the lowest load's reports at the top (what the report's endpoint
    section reads; per-request results left out there) and every load's in ``loads`` (results kept)."""
    first = points[0].full
    top = {k: ({kk: vv for kk, vv in v.items() if kk != "results"} if isinstance(v, dict) and "url" in v else v)
           for k, v in first.items()}
    loads = [{"load": p.load, "order": list(p.order), **p.full} for p in points]
    return cast(LoadsDocument, {**top, "loads": loads})  # the first load's keys, reports without results


def without_results(full: ProbeDocument) -> ProbeDocument:
    """``full`` (a probe's ``{"probe": report, ...}``) without the per-request ``results`` of each report."""
    kept = {k: ({kk: vv for kk, vv in v.items() if kk != "results"} if isinstance(v, dict) else v)
            for k, v in full.items()}
    return cast(ProbeDocument, kept)  # the same keys; each report without its results


__all__ = ["LoadEntry", "LoadPoint", "LoadReport", "LoadsDocument", "at_load", "category_speedups", "first_spec_decode",
           "probe_document", "run_probe_loads", "side_order", "speedup_keys", "tag_load_point", "without_results"]
