"""The main job: plain decoding and every drafter over real workloads, across gamma and temperature.

A run directory holds ``run.json`` (what was planned, on which model and machine),
``traces.jsonl`` (one RequestRecord per finished request, appended and fsync'ed as each
prompt's requests end) and, at the end, ``summary.json`` + ``report.html``. A job is identified by
(prompt id, drafter, gamma, temperature, tree budget); ``resume`` skips jobs already in the trace, so an
interrupted run loses at most the prompt that was in flight.

Fairness on a noisy machine: for each prompt (and temperature) the plain baseline and every speculative
setting run side by side, one round of each in turn (:mod:`specledger.engine.interleave`: each request
solo, with its own KV cache and a clock that stops while the others run), so the machine's drift hits
all settings alike and cancels in their speed-ups. What does not cancel (another process taking a core for
part of a prompt) is watched for, and such a prompt measured once more (:mod:`specledger.mainjob.disturbance`).
``RunPlan.interleave_rounds = False`` runs them one after the other instead.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict
from warnings import warn

from specledger.engine.drafters.catalog import LAYERSKIP, PLAIN
from specledger.engine.protocol import StreamArgs, TargetEngine
from specledger.errors import SpecLedgerError, SpecLedgerWarning, require
from specledger.mainjob.disturbance import RunWatch, watched
from specledger.mainjob.plan import (
    DEFAULT_BUDGET_S,
    DEFAULT_CATEGORIES,
    DEFAULT_DRAFTERS,
    DEFAULT_INITIAL_PROMPTS,
    DEFAULT_LOADS,
    FULL_LOADS,
    LOAD_POINT_SETTINGS,
    LOAD_POINTS_SHARE,
    MAX_SIDE_BY_SIDE,
    QUALITY_MAX_TOKENS,
    QUICK_BUDGET_S,
    QUICK_LOADS,
    REPORT_RESERVE_S,
    SIMULATED_LOADS,
    Job,
    RunPlan,
    check_budget,
    initial_seconds,
    job_groups,
    plan_config,
    plan_jobs,
    preset,
    survivor_settings,
)
from specledger.mainjob.prompts import (
    RUN_SURFACE_REPEATS,
    PromptPool,
    Workload,
    context_candidates,
    done_keys,
    load_items,
    measure_run_surface,
    surface_contexts,
    traffic_counts,
)
from specledger.records import setting_label
from specledger.rundir import SURFACE_KEY, RunDir

if TYPE_CHECKING:
    from specledger.engine.drafters.base import Drafter
    from specledger.engine.tree_shape import StaticTreeShape
    from specledger.gates.decision import VerdictDict
    from specledger.gates.slo import SLO
    from specledger.mainjob.race import RaceLog, Setting

Progress = Callable[[int, int, str], None]


class DrafterInfo(TypedDict, total=False):
    """``run.json``'s ``drafters``: what the run's drafters were built with."""

    layerskip_layers: str | None  # the layers layerskip keeps ("0-7,26-29"): given, or calibrated once
    tree_shape: dict[str, str]  # drafter -> where its static tree shape comes from (``--tree-shape`` not dynamic)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class DrafterSet:
    """One drafter instance per setting (drafter, gamma, temperature, tree budget): a cross-request drafter
    (suffix) must not learn a prompt's answer from another setting's run of the same prompt. layerskip's
    layers are calibrated once; a static tree shape (``plan.tree_shape`` other than dynamic) is built once
    per drafter. ``info`` is run.json's ``drafters``."""

    def __init__(self, plan: RunPlan, engine: TargetEngine) -> None:
        from specledger.engine.drafters.registry import make_drafter

        self.plan, self.engine = plan, engine
        self.layers = plan.layers
        self.info: DrafterInfo = {}
        if LAYERSKIP.name in plan.drafters and not self.layers:
            self.layers = ",".join(map(str, make_drafter(LAYERSKIP.name, engine).layers))  # calibrate once
        if LAYERSKIP.name in plan.drafters:
            self.info["layerskip_layers"] = self.layers
        self._made: dict[tuple[str, int, float, int], Drafter] = {}
        self._shapes: dict[str, StaticTreeShape | None] = {}
        if any(plan.tree_budgets) and plan.tree_shape != "dynamic":  # the DP's static shape, per drafter
            from specledger.mainjob.tree_shape_spec import tree_shape_from_spec

            self._shapes = {d: tree_shape_from_spec(plan.tree_shape, d) for d in plan.drafters}
            self.info["tree_shape"] = {d: s.source for d, s in self._shapes.items()}

    def for_job(self, job: Job) -> Drafter:
        from specledger.engine.drafters.registry import make_drafter

        key = (job.drafter, job.gamma, job.temperature, job.tree_budget)
        if key not in self._made:
            self._made[key] = make_drafter(job.drafter, self.engine, layers=self.layers, draft_path=self.plan.draft)
            if job.tree_budget:
                self._made[key].tree_shape = self._shapes.get(job.drafter)
        return self._made[key]


class Executor:
    """Runs jobs side by side per prompt (one KV cache per request in flight) and appends their records,
    each scored for quality and tagged with its output budget and the process's peak memory."""

    def __init__(self, rd: RunDir, plan: RunPlan, engine: TargetEngine, workload: Workload, drafters: DrafterSet,
                 progress: Progress | None, watch: RunWatch | None = None) -> None:
        from specledger.engine.interleave import SideBySide

        self.rd, self.plan, self.engine, self.workload, self.drafters = rd, plan, engine, workload, drafters
        self.progress = progress
        self.side_by_side = SideBySide()
        self.watch = watch or RunWatch()

    def request(self, job: Job) -> tuple[TargetEngine, list[int], StreamArgs]:
        from specledger.engine.sampling import SamplingParams

        plan = self.plan
        return self.engine, self.workload.encoded[job.prompt_id], StreamArgs(
            drafter=self.drafters.for_job(job), gamma=job.gamma,
            params=SamplingParams(temperature=job.temperature, seed=plan.seed),
            max_tokens=plan.max_tokens_for(self.workload.by_id[job.prompt_id].category),
            request_id=f"{job.prompt_id}|{job.drafter}|{job.gamma}|{job.temperature:g}"
            + (f"|tree{job.tree_budget}" if job.tree_budget else ""), tree_budget=job.tree_budget)

    def __call__(self, jobs: Sequence[Job], finished: int, total: int) -> int:
        """Run ``jobs`` side by side per prompt, append their records; returns the new finished count."""
        from specledger.quality import answer_complete, score

        plan = self.plan
        for group in job_groups(jobs, plan.interleave_rounds):
            item = self.workload.by_id[group[0].prompt_id]
            if self.progress:
                what = ", ".join(setting_label(j.drafter, j.gamma, j.tree_budget) for j in group)
                self.progress(finished, total, f"{item.category} T={group[0].temperature:g}: {what}")
            records = self.measure(group, item)
            for rec in records:
                rec.category = item.category
                rec.prompt_id = item.id
                rec.extra["max_tokens"] = plan.max_tokens_for(item.category)  # this request's own output budget
                rec.extra["quality"] = score(item, rec.text)
                if (complete := answer_complete(item, rec.text, rec.stop_reason)) is not None:
                    rec.extra["quality_complete"] = complete
                rec.extra["peak_memory_bytes"] = peak_rss_bytes()
            self.rd.append(records)
            finished += len(group)
        return finished

    def measure(self, group: Sequence[Job], item: Any) -> list[Any]:
        """One prompt's group side by side, watched (:mod:`specledger.mainjob.disturbance`): measured once more
        when the machine was disturbed and the rule allows, the first records then appended under experiment
        ``disturbed`` (kept, out of the figures) and the drafters' cross-request state rewound first."""
        drafters = [self.drafters.for_job(job) for job in group]
        saved = [d.checkpoint() for d in drafters]

        def set_aside(records: list[Any]) -> None:
            for rec in records:
                rec.category, rec.prompt_id = item.category, item.id
            self.rd.append(records)
            for d, state in zip(drafters, saved):
                d.rewind(state)

        return watched(self.watch, lambda: self.side_by_side.run([self.request(job) for job in group]), set_aside)


def run(
    run_dir: Path,
    plan: RunPlan,
    engine: TargetEngine,
    resume: bool = False,
    progress: Progress | None = None,
    on_warning: Callable[[str], None] | None = None,
    slo: SLO | None = None,
    started: float | None = None,
    watch: RunWatch | None = None,
) -> Path:
    """Execute (or continue) the plan into ``run_dir``; returns the trace path. ``on_warning`` hears
    each workload warning (a bad JSONL line, a prompt over the budget) as the run starts; run.json
    keeps them too. With ``plan.budget_s`` the job races after its initial prompts and load points
    (:mod:`specledger.mainjob.race`), judging by ``slo`` (default SLO) until ``started`` (a
    ``time.monotonic()`` reading; default now) + the budget, less :data:`REPORT_RESERVE_S`.

    Phases: measure (the initial prompts of every setting), race (more prompts where decisions are open),
    load points (the settings the race left, at every load > 1). Every prompt's group is watched for a
    disturbed machine (``watch``, default :class:`~specledger.mainjob.disturbance.RunWatch` priced by the run's
    cost surface) and measured once more when it was."""
    started = time.monotonic() if started is None else started
    plan.validate()
    run_dir.mkdir(parents=True, exist_ok=True)
    rd = RunDir(run_dir)
    items, warnings = load_items(plan, engine.model.config.vocab_size)
    workload = Workload(plan, engine)
    items = workload.split_by_context(items, context_candidates(plan, workload.file))
    workload.register(items)
    _report_warnings(plan, warnings, workload.skipped, on_warning)
    room = engine.max_context - plan.max_tokens - 1
    require(max(plan.tree_budgets) <= room, f"tree budget {max(plan.tree_budgets)} exceeds the cache's room "
            f"({room} positions past max_tokens in a {engine.max_context}-token context); lower --tree-budgets")
    require(bool(workload.by_id), "no workload item fits the prompt budget and the model's context; give shorter "
            "prompts or a lower --max-tokens")
    drafters = DrafterSet(plan, engine)
    meta = _start_meta(rd, plan, engine, workload, warnings, drafters.info, resume, progress)
    if plan.budget_s is not None:
        check_budget(plan, meta[SURFACE_KEY], time.monotonic() - started, sorted({it.category for it in items}))
        need = initial_seconds(plan, meta[SURFACE_KEY], [(it.category, len(workload.encoded[it.id]))
                                                         for it in items if it.id in workload.encoded])
        if on_warning and time.monotonic() - started + need + REPORT_RESERVE_S > plan.budget_s:
            on_warning(f"the initial prompts alone need about {need:.0f} s here (prefill and every "
                       f"setting's output), more than --budget {plan.budget_s:g}s leaves: the run will overrun it; "
                       "raise --budget or give fewer or shorter prompts")
    rd.write_meta(meta)
    if resume:
        _repair(rd)
    execute = Executor(rd, plan, engine, workload, drafters, progress, watch or run_watch(meta[SURFACE_KEY]))
    initial_ids = [pid for pid in workload.by_id if pid in {it.id for it in items}]
    jobs = plan_jobs(initial_ids, plan)
    done = done_keys(rd) if resume else set()
    todo = [j for j in jobs if j.key not in done]
    finished = execute(todo, len(jobs) - len(todo), len(jobs))
    at_loads = any(x > 1 for x in plan.loads)
    survivors = None
    if plan.budget_s is not None:
        reserve = REPORT_RESERVE_S + (LOAD_POINTS_SHARE * plan.budget_s if at_loads else 0.0)
        log = _race(rd, plan, workload, execute, done, slo, started, progress, {it.id for it in items}, reserve)
        survivors = survivor_settings(log.final, plan)
        meta["prompts"] = workload.facts()
        meta["race"] = {**log.to_dict(), "load_point_settings": [setting_label(d, g) for d, g in survivors[1:]]}
        rd.write_meta(meta)
    if at_loads:  # after the race: only the settings it left in contention, on the initial prompts
        from specledger.mainjob.measured_loads import run_load_points

        run_load_points(rd, plan, engine, {pid: workload.by_id[pid] for pid in initial_ids},
                        {pid: workload.encoded[pid] for pid in initial_ids}, drafters.layers, progress, survivors,
                        slo=slo, deadline=None if plan.budget_s is None
                        else started + float(plan.budget_s) - REPORT_RESERVE_S)
    elif progress:
        progress(finished, len(jobs), "done")
    return rd.trace_path


def run_watch(surface: dict[str, Any]) -> RunWatch:
    """The run's disturbance watch, its plain steps priced by the verify cost surface measured at the start (a
    1-row forward at the step's context)."""
    from specledger.cost.surface import CostSurface

    priced = CostSurface.from_dict(surface)
    return RunWatch(expected=lambda context: priced.round_s(1, context))


def _report_warnings(plan: RunPlan, warnings: Sequence[str], skipped: Sequence[str],
                     on_warning: Callable[[str], None] | None) -> None:
    """Each workload warning and skipped prompt to ``on_warning``, prefixed with the workload file."""
    if on_warning is None:
        return
    from specledger.workloads.jsonl import workload_warning

    for message in list(warnings) + [f"skipped {m}" for m in skipped]:
        on_warning(workload_warning(plan.workload_file, message))


def _start_meta(rd: RunDir, plan: RunPlan, engine: TargetEngine, workload: Workload, warnings: list[str],
                drafter_info: DrafterInfo, resume: bool, progress: Progress | None) -> dict[str, Any]:
    """run.json as the run starts (or continues): the plan, model, machine and prompts, checked against a
    resumed run's own, with the verify cost surface (measured now, or the resumed run's)."""
    from specledger.engine.device import machine_info
    from specledger.provenance import provenance

    run_dir, trace_path = rd.path, rd.trace_path
    meta = {
        "name": run_dir.name,
        "model": engine.name,
        "dtype": engine.dtype,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "provenance": provenance(),
        "weight_bytes": engine.model.weight_bytes(),
        "config": asdict(plan),
        "drafters": drafter_info,
        "workload_warnings": warnings,
        # the one recommendation for all the traffic (specledger.gates.mix): --mix, else the workload's shares
        "traffic_mix": plan.mix,
        "traffic_counts": traffic_counts(plan, workload.file, workload.decision_key),
        "skipped_prompts": workload.skipped,
        "prompts": workload.facts(),
    }
    if any(x > 1 for x in plan.loads):  # what the KV-capacity gate needs (m_KV from the model config)
        from specledger.mainjob.measured_loads import memory_facts

        meta.update(memory_facts(engine))
    old: dict[str, Any] = {}
    if resume and rd.meta_path.exists():
        old = rd.meta(f"restart the run with another --out instead of --resume {run_dir}")
        if plan_config(old.get("config")) != plan:
            raise SpecLedgerError(f"{run_dir} was started with another configuration; resume it without options")
        if (old.get("model"), str(old.get("dtype"))) != (meta.get("model"), str(meta.get("dtype"))):
            raise SpecLedgerError(f"{run_dir} was measured on {old.get('model')} ({old.get('dtype')}), not "
                                  f"{meta.get('model')} ({meta.get('dtype')}): resume it with the --target and "
                                  "--dtype it started with, or start a new run with --out")
        meta["started"] = old.get("started", meta["started"])
        for pid, facts in (old.get("prompts") or {}).items():  # prompts a race had added
            if pid not in workload.encoded and isinstance(facts, dict) and facts.get("token_ids"):
                workload.encoded[pid] = list(facts["token_ids"])
    elif not resume and trace_path.exists() and trace_path.stat().st_size:
        raise SpecLedgerError(f"{run_dir} already holds a run; use --resume {run_dir} or another --out")
    if resume and rd.meta_path.exists() and old.get(SURFACE_KEY):
        meta[SURFACE_KEY] = old[SURFACE_KEY]
    else:
        if progress:
            progress(0, 1, "measuring the verify cost surface (rows 1-33)")
        meta[SURFACE_KEY] = measure_run_surface(
            engine, [len(v) for v in workload.encoded.values()],
            max(plan.max_tokens_for(it.category) for it in workload.by_id.values())).to_dict()
    return meta


def _repair(rd: RunDir) -> None:
    """What an interruption left in a resumed run: a kill inside an atomic write (a report's temp copy,
    rewritten before the end), a torn last trace line (that request runs again)."""
    rd.remove_stale_temp_files()
    if removed := rd.repair_tail():
        warn(f"{rd.trace_path}: removed the torn last line ({removed} bytes) the interruption left; "
             "that request runs again", SpecLedgerWarning, stacklevel=3)


def _race(rd: RunDir, plan: RunPlan, workload: Workload, execute: Executor, done: set, slo: SLO | None,
          started: float, progress: Progress | None, used: set[str], reserve_s: float) -> RaceLog:
    """Race rounds until the budget (see :mod:`specledger.mainjob.race`); returns the race log."""
    from specledger.mainjob.race import RaceLog, Setting, decisions_so_far, race

    log = RaceLog(budget_s=float(plan.budget_s), started=started)
    by_id = workload.by_id
    pool = PromptPool(plan, set(by_id) | used, workload.bucket, workload.file)
    settings = [Setting(d, g, b) for d in plan.drafters for g in plan.gammas_for(d) for b in plan.tree_budgets]
    counter = {"n": 0}

    def decide() -> list[VerdictDict]:
        return decisions_so_far(rd.records_so_far(), slo)

    def more(category: str, k: int) -> list[str]:
        """Up to ``k`` new prompts that fit the prompt budget (long ones are skipped, and more are drawn)."""
        ids: list[str] = []
        while len(ids) < k and (batch := pool.more(category, k - len(ids))):
            ids += workload.register(batch)
        return ids

    def run_prompts(category: str, temperature: float, ids: list[str], keep: list[Setting], with_plain: bool
                    ) -> None:
        jobs = [j for pid in ids for j in [Job(pid, PLAIN.name, 0, temperature)][: int(with_plain)]
                + [Job(pid, s.drafter, s.gamma, temperature, s.tree_budget) for s in keep]]
        jobs = [j for j in jobs if j.key not in done]
        if progress:
            progress(0, 0, f"race: {category} +{len(ids)} prompts")
        counter["n"] = execute(jobs, counter["n"], counter["n"] + len(jobs))

    def prompts_so_far(category: str) -> int:
        return sum(1 for it in by_id.values() if it.category == category)

    deadline = started + float(plan.budget_s) - reserve_s
    return race(log, deadline, decide, more, run_prompts, settings, prompts_so_far, step=plan.race_step)


def record_bandwidth(run_dir: Path, engine: TargetEngine) -> None:
    """run.json ``bandwidth``: plain decoding's achieved bandwidth over the main job's plain requests against
    this machine's read bandwidth measured now (:func:`specledger.engine.bandwidth.plain_decode_bandwidth`)."""
    from specledger.engine.bandwidth import plain_decode_bandwidth
    from specledger.records import main_records

    rd = RunDir(run_dir)
    plain = [r for r in main_records(rd.records()) if r.drafter == PLAIN.name]
    meta = rd.meta()
    figures = plain_decode_bandwidth(engine.model, plain, device=engine.device)
    if figures:
        meta["bandwidth"] = figures
    rd.write_meta(meta)


__all__ = [
    "DEFAULT_BUDGET_S", "DEFAULT_CATEGORIES", "DEFAULT_DRAFTERS", "DEFAULT_INITIAL_PROMPTS", "DEFAULT_LOADS",
    "FULL_LOADS", "LOAD_POINTS_SHARE", "LOAD_POINT_SETTINGS", "MAX_SIDE_BY_SIDE", "QUALITY_MAX_TOKENS",
    "QUICK_BUDGET_S", "QUICK_LOADS", "REPORT_RESERVE_S", "RUN_SURFACE_REPEATS", "SIMULATED_LOADS", "DrafterSet",
    "Executor", "Job", "PromptPool", "RunPlan", "Workload", "check_budget", "done_keys", "job_groups",
    "load_items", "measure_run_surface", "peak_rss_bytes", "plan_config", "plan_jobs", "preset", "record_bandwidth",
    "run",
    "surface_contexts", "survivor_settings",
]
