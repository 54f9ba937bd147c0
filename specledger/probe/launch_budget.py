"""The two sources a probe races (:mod:`specledger.probe.launch_race`): engines it launches itself
(:func:`race_launch`: one start per configuration and round; a dropped configuration is never started again)
and an endpoint with its ``--baseline`` (:func:`race_endpoints`: both already running). Either way the
decisions are ``specledger run``'s (:func:`specledger.mainjob.race.decisions_so_far`) over the records the run
folder will hold, so the race, the summary and the console read the same decision.

After the race, the load points (loads > 1) run for the configurations the decisions stand on
(:func:`~specledger.probe.launch_race.survivors`), one start per configuration and load, over the workload's
interleaved prompts (max(--requests, L) requests at load L), saved as ``race/loadL-NAME.json`` (resumed like the
rounds); ``--loads A..B`` bisects between the ends (:func:`_load_points`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specledger.gates.decision import VerdictDict
from specledger.mainjob.plan import LOAD_POINTS_SHARE, REPORT_RESERVE_S
from specledger.mainjob.race import decisions_so_far
from specledger.probe.endpoint_loads import run_probe_loads
from specledger.probe.engine_command import (
    UNKNOWN_GAMMA,
    Spec,
    check_template,
    configured_gamma,
    engine_argv,
    engine_kind,
    spec_drafter_label,
)
from specledger.probe.launch import LAUNCH_DIR, check_plan, plan_document, probe_spec, run_order
from specledger.probe.launch_race import RACE_DIR, RaceDocument, RaceFolder, race_document, race_parts, survivors
from specledger.probe.launch_runs import SpecRun
from specledger.probe.loadgen import LoadConfig, PromptItem, Tokenizer
from specledger.probe.workload import ProbeWorkload

Progress = Callable[[str], None]


#: the load points' share of a probe's budget with ``--loads A..B``: locating a change within 2x takes up to
#: log2(B/A) points, each a start of every configuration kept (a launched engine starts again per load)
LOCATE_LOADS_SHARE = 0.4


def reserve_s(budget_s: float, loads: Sequence[int], locate: bool = False) -> float:
    """What the race leaves of the budget: the report's reserve, and the load points' share when there are
    loads > 1 (``run``'s :data:`~specledger.mainjob.plan.LOAD_POINTS_SHARE`; :data:`LOCATE_LOADS_SHARE` when the
    loads between the ends are bisected)."""
    share = LOCATE_LOADS_SHARE if locate else LOAD_POINTS_SHARE
    return REPORT_RESERVE_S + (share * budget_s if any(x > 1 for x in loads) else 0.0)


def _at_load_one(config: LoadConfig, items: Sequence[PromptItem], loads: Sequence[int]) -> LoadConfig:
    """A round's configuration: each prompt once, one at a time (load 1); the load points keep ``config``."""
    return replace(config, num_requests=len(items)) if list(loads) == [1] else config


def _load_points(names: Sequence[str], loads: Sequence[int], workload: ProbeWorkload, store: RaceFolder,
                 runner: Callable[[str, list[PromptItem], Sequence[int], str], SpecRun],
                 merged: Mapping[str, SpecRun], *, locate: bool = False, deadline: float = math.inf,
                 progress: Progress | None = None,
                 clock: Callable[[], float] = time.monotonic) -> dict[str, SpecRun]:
    """Every named configuration (the baseline first) at each load > 1 of ``loads``, one start per
    (configuration, load), read back when saved. With ``locate`` (``--loads A..B``: ``loads`` holds the ends) the
    loads between follow :func:`specledger.load_bisect.locate`: wherever S against 1 changes for some category
    and configuration between adjacent measured loads (load 1 is the race's), bisected in powers of two while
    the next point's estimated time fits before ``deadline``."""
    from specledger.load_bisect import locate as bisect
    from specledger.load_bisect import point_cost
    from specledger.probe.endpoint_loads import speedup_keys
    from specledger.probe.launch_runs import paired_points

    categories = {str(it.id): workload.category_of(it.id) for it in workload.items}
    got: dict[int, dict[str, SpecRun]] = {1: {n: merged[n] for n in names if n in merged}}
    costs: dict[int, float] = {}

    def measure(load: int) -> None:
        if load in got:
            return
        if progress:
            progress(f"load {load}: {', '.join(names)}")
        t0, got[load] = clock(), {}
        for name in names:
            part = store.read_part(-load, name)
            if part is None:
                part = runner(name, list(workload.items), [load], f"load{load}")
                store.write_part(-load, name, part)
            got[load][name] = part
        costs[load] = clock() - t0

    def keys() -> dict[int, Any]:
        out: dict[int, Any] = {}
        for load, parts in got.items():
            pairs = [paired_points(parts[c], parts[names[0]]) for c in names[1:] if c in parts and names[0] in parts]
            out[load] = tuple(speedup_keys([p for p in pts if p.load == load], categories).get(load)
                              for pts in pairs)
        return out

    wanted = sorted({int(x) for x in loads})
    if locate:
        bisect(wanted, measure, keys, lambda load: clock() + (point_cost(load, costs) or 0.0) <= deadline)
    else:
        for load in wanted:
            measure(load)
    return {name: replace(got[1].get(name) or next(iter(got[1].values())),
                          points=[p for load in sorted(got) if load > 1 for p in got[load][name].points])
            for name in names if any(load > 1 for load in got)}


def _combine(merged: Mapping[str, SpecRun], at_loads: Mapping[str, SpecRun]) -> dict[str, SpecRun]:
    """Every configuration's load-1 run with its load points (if it has some) after it."""
    return {name: replace(run, points=list(run.points) + list(at_loads[name].points if name in at_loads else []))
            for name, run in merged.items()}


@dataclass
class _GammaLabel:
    """The probed endpoint's γ label in a race: the one given, else the one its first part's counters give
    (:func:`specledger.probe.records.gamma_label`), kept for every round."""

    label: str | None


def race_launch(template: str, specs: Sequence[Spec], loads: Sequence[int], config: LoadConfig,
                workload: ProbeWorkload, out: Path, budget_s: float, slo: Any, *, port: int | None = None,
                ready_timeout_s: float = 600.0, tokenizer: Tokenizer | None = None,
                progress: Progress | None = None, locate: bool = False) -> tuple[dict[str, SpecRun], RaceDocument]:
    """``probe --launch ... --budget``: the race over launched engines, then the load points; returns every
    configuration's run (load 1 pooled over its rounds, then its load points) and ``run.json``'s ``race``."""
    from specledger.gates.verdicts import setting_name
    from specledger.probe.launch_dir import launch_records

    check_template(template)
    folder = Path(out) / LAUNCH_DIR
    check_plan(folder, {**plan_document(template, specs, loads, config, workload), "race": True})  # any budget
    argv0 = engine_argv(template, 0, specs[0])
    kind = engine_kind(argv0)
    by_name = {s.name: s for s in specs}
    gammas = {s.name: 0 if s.is_baseline else
              (configured_gamma(engine_argv(template, 0, s), kind, argv0[0]) or UNKNOWN_GAMMA) for s in specs}
    name_of = {setting_name({"drafter": spec_drafter_label(s, kind), "gamma": gammas[s.name]}): s.name
               for s in specs if not s.is_baseline}

    def runner(name: str, items: list[PromptItem], at: Sequence[int], tag: str) -> SpecRun:
        return probe_spec(template, by_name[name], at, _at_load_one(config, items, at), items, folder, port=port,
                          ready_timeout_s=ready_timeout_s, tokenizer=tokenizer, tag=tag)

    def decide(runs: Mapping[str, SpecRun]) -> list[VerdictDict]:
        return decisions_so_far(launch_records(dict(runs), kind, workload, tokenizer, config), slo)

    order = [s.name for s in run_order(specs)]
    state, log = race_parts(workload, order, order[0], name_of, runner, decide, budget_s, folder / RACE_DIR,
                            reserve_s=reserve_s(budget_s, loads, locate), progress=progress)
    keep = survivors(log.final, name_of, order[0])
    at_loads = _load_points(keep, loads, workload, RaceFolder(folder / RACE_DIR), runner, state.merged(),
                            locate=locate, deadline=log.started + budget_s - REPORT_RESERVE_S, progress=progress)
    runs = _combine(state.merged(), at_loads)
    return runs, {**race_document(state, log), "load_point_configurations": list(at_loads)}


def race_endpoints(url: str, baseline: str, config: LoadConfig, baseline_config: LoadConfig,
                   workload: ProbeWorkload, loads: Sequence[int], budget_s: float, slo: Any, label: str,
                   gamma: str | None, out: Path | None, *, metrics: bool = True, tokenizer: Tokenizer | None = None,
                   progress: Progress | None = None, locate: bool = False) -> tuple[dict[str, SpecRun], RaceDocument]:
    """``probe URL --baseline URL2 --budget``: the same race with both endpoints already up (the baseline first
    in even rounds, last in odd ones); returns the runs ``{"baseline": ..., "probe": ...}`` and ``run.json``'s
    ``race``."""
    from specledger.gates.verdicts import setting_name
    from specledger.probe.launch_runs import paired_points
    from specledger.probe.outputs import probe_loads_run
    from specledger.probe.records import gamma_label

    targets = {"baseline": (baseline, baseline_config), "probe": (url, config)}
    name_of: dict[str, str] = {}
    fixed = _GammaLabel(gamma)

    def runner(name: str, items: list[PromptItem], at: Sequence[int], tag: str) -> SpecRun:
        where, cfg = targets[name]
        points = run_probe_loads(where, _at_load_one(replace(cfg), items, at), items, at, metrics=metrics,
                                 tokenizer=tokenizer)
        if name == "probe" and fixed.label is None:
            fixed.label = str(gamma_label(points[0].full["probe"].get("spec_decode"), None))
        return SpecRun(Spec(name, ()), [], "", None, points)

    def decide(runs: Mapping[str, SpecRun]) -> list[VerdictDict]:
        records, _ = probe_loads_run(paired_points(runs["probe"], runs["baseline"]), workload, label,
                                     fixed.label, tokenizer, "probe")
        spec = next((r for r in records if r.drafter == label), None)
        name_of.clear()  # the endpoint's γ label may come from its counters: the setting name follows it
        if spec is not None:
            name_of[setting_name({"drafter": label, "gamma": spec.gamma})] = "probe"
        return decisions_so_far(records, slo)

    folder = Path(out) / RACE_DIR if out is not None else None
    if fixed.label is None and (first := RaceFolder(folder).read_part(0, "probe")) is not None:  # resumed
        fixed.label = str(gamma_label(first.points[0].full["probe"].get("spec_decode"), None))
    state, log = race_parts(workload, ["baseline", "probe"], "baseline", name_of, runner, decide, budget_s, folder,
                            reserve_s=reserve_s(budget_s, loads, locate), progress=progress)
    at_loads = _load_points(["baseline", "probe"], loads, workload, RaceFolder(folder), runner, state.merged(),
                            locate=locate, deadline=log.started + budget_s - REPORT_RESERVE_S, progress=progress)
    runs = _combine(state.merged(), at_loads)
    return runs, {**race_document(state, log), "load_point_configurations": list(at_loads),
                  "gamma_label": fixed.label}


__all__ = ["race_endpoints", "race_launch", "reserve_s"]
