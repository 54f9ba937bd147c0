"""``specledger probe ... --budget 6m``: racing a real engine as ``specledger run`` races its own, within the budget.

The probe's configurations are its *parts*: ``off`` (the baseline) and every ``--spec`` of ``--launch``, or
the endpoint and its ``--baseline``. The decisions are ``run``'s (:func:`specledger.mainjob.race.decisions_so_far`:
paired per-prompt comparisons, the equivalence margin, the tie rule, the same wording); only how prompts reach
a configuration differs. Rounds, each at load 1 (one request at a time, the same prompts to every
configuration that runs them):

1. round 0: the first ``initial`` prompts of every category (:meth:`ProbeWorkload.pool`), every configuration
   (in ``order``, reversed every other round);
2. then, while the budget lasts: the decisions so far; for each open one (:func:`~specledger.mainjob.race.
   open_decisions`) ``step`` more prompts of its category, run by its contenders and, when the decision still
   needs it (``needs_plain``), the baseline. A configuration that is not a contender of an open decision is
   *dropped* for that category for good; one dropped everywhere is not started again (:func:`next_round`);
3. it stops when every decision is resolved, the open categories have no prompts left (or
   :data:`~specledger.mainjob.race.MAX_PROMPTS_PER_CATEGORY`), or the next round's estimate (per configuration:
   its start-up, plus its prompts at the median seconds per prompt so far) would pass the deadline.

Each (round, configuration) is saved as it finishes (``race/rNNN-NAME.json``), the round plans in
``race/rounds.json``, each load point as ``race/loadL-NAME.json``: the same command resumes, reading back what
finished and running only the rest. A launched configuration serves all its prompts of a round from one start;
its log is ``logs/NAME.rNNN.log``. The load points (loads > 1) follow, for the baseline and the configurations
the decisions stand on (:mod:`specledger.probe.launch_budget`).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from specledger.gates.decision import Verdict, VerdictDict, as_verdict
from specledger.mainjob.race import (
    MAX_PROMPTS_PER_CATEGORY,
    RACE_STEP,
    RaceLog,
    RaceLogDict,
    contenders,
    note_drops,
    open_decisions,
)
from specledger.probe.launch_runs import SpecRun, merge_repeats
from specledger.probe.loadgen import PromptItem
from specledger.probe.workload import ProbeWorkload
from specledger.rundir import RunDir, json_safe

RACE_DIR = "race"
ROUNDS_NAME = "rounds.json"
#: prompts of every category in round 0 (as ``specledger run``'s initial prompts)
INITIAL_PROMPTS = 2

#: runs configuration NAME on these prompts at these loads and returns its part
Runner = Callable[[str, list[PromptItem], Sequence[int], str], SpecRun]
#: the decisions of the parts so far (every configuration's load-1 part merged)
Decide = Callable[[Mapping[str, SpecRun]], list[dict[str, Any]]]
Plan = dict[str, list[str]]


@dataclass
class RaceState:
    """What the race has run: each round's plan (configuration -> prompt ids) and its parts."""

    rounds: list[Plan] = field(default_factory=list)
    parts: dict[tuple[int, str], SpecRun] = field(default_factory=dict)
    dropped: dict[str, set[str]] = field(default_factory=dict)  # category -> configurations out of it

    def used(self) -> set[str]:
        return {pid for plan in self.rounds for ids in plan.values() for pid in ids}

    def merged(self) -> dict[str, SpecRun]:
        """Every configuration's load-1 parts as one run (:func:`~specledger.probe.launch_runs.merge_repeats`:
        request numbers offset per part, the server-counter windows of every part kept)."""
        by_name: dict[str, list[SpecRun]] = {}
        for (_, name), part in sorted(self.parts.items()):
            by_name.setdefault(name, []).append(part)
        out = {}
        for name, parts in by_name.items():
            run = merge_repeats(parts)
            if len(parts) > 1:
                for p in run.points:
                    p.full["probe"]["spec_decode_note"] = f"pooled over {len(parts)} race rounds: see launch.specs"
            out[name] = run
        return out


def first_round(workload: ProbeWorkload, names: Sequence[str], initial: int) -> Plan:
    """Round 0: the first ``initial`` prompts of every category, for every configuration."""
    ids = [pid for pool in workload.pool().values() for pid in pool[:initial]]
    order = {it.id: k for k, it in enumerate(workload.items)}
    ids.sort(key=lambda pid: order[pid])  # interleaved, as the workload is
    return {name: list(ids) for name in names}


def next_round(decisions: Sequence[dict[str, Any]], state: RaceState, workload: ProbeWorkload, baseline: str,
               name_of: Mapping[str, str], step: int, max_per_category: int) -> Plan:
    """The next round from the decisions so far: for each open decision ``step`` unused prompts of its category,
    for its contenders (their configuration names via ``name_of``: setting name -> configuration) not dropped
    from that category, and the baseline when the decision needs plain. Every configuration that is not a
    contender of an open decision is dropped from its category for good. Empty: nothing left to run."""
    pool, used = workload.pool(), state.used()
    plan: Plan = {}
    for v in open_decisions(decisions):
        cat = str(v["category"])
        out = state.dropped.setdefault(cat, set())
        keep = [name_of[s] for s in contenders(v) if s in name_of and name_of[s] not in out]
        out |= {n for n in name_of.values() if n not in keep}
        fresh = [pid for pid in pool.get(cat, []) if pid not in used]
        ran = len(pool.get(cat, [])) - len(fresh)
        ids = fresh[: max(0, min(step, max_per_category - ran))]
        if not keep or not ids:
            continue
        for name in ([baseline] if v.get("needs_plain", True) else []) + keep:
            plan.setdefault(name, []).extend(ids)
    order = {it.id: k for k, it in enumerate(workload.items)}
    return {name: sorted(dict.fromkeys(ids), key=lambda pid: order[pid]) for name, ids in plan.items()}


def estimate_s(plan: Plan, state: RaceState) -> float:
    """Seconds a round would take: per configuration, its median start-up plus its prompts at the median
    seconds per prompt of its parts so far (every part's, when it has none yet)."""
    per_prompt: dict[str, list[float]] = {}
    starts: dict[str, list[float]] = {}
    for (_, name), part in state.parts.items():
        n = sum(len(p.results) for p in part.points) or 1
        wall = sum(float(p.full["probe"]["summary"].get("wall_time_s") or 0.0) for p in part.points)
        per_prompt.setdefault(name, []).append(wall / n)
        starts.setdefault(name, []).append(float(part.ready_s or 0.0))
    every = [x for xs in per_prompt.values() for x in xs] or [0.0]
    every_start = [x for xs in starts.values() for x in xs] or [0.0]
    return sum(statistics.median(starts.get(name) or every_start)
               + len(ids) * statistics.median(per_prompt.get(name) or every) for name, ids in plan.items())


class RaceFolder:
    """Where the parts and round plans are kept (``OUT/.../race``); None: in memory only (a probe without --out)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def part_name(self, index: int, name: str) -> str:
        """``rNNN-NAME.json`` for round NNN; ``loadL-NAME.json`` for the load point at load L (index -L)."""
        return f"load{-index}-{name}.json" if index < 0 else f"r{index:03d}-{name}.json"

    def read_rounds(self) -> list[Plan]:
        path = self.folder / ROUNDS_NAME if self.folder else None
        return json.loads(path.read_text(encoding="utf-8")) if path and path.is_file() else []

    def write_rounds(self, rounds: list[Plan]) -> None:
        if self.folder:
            RunDir(self.folder).write(ROUNDS_NAME, rounds)

    def read_part(self, index: int, name: str) -> SpecRun | None:
        path = self.folder / self.part_name(index, name) if self.folder else None
        return SpecRun.from_dict(RunDir(self.folder).read(path.name)) if path and path.is_file() else None

    def write_part(self, index: int, name: str, part: SpecRun) -> None:
        if self.folder:
            RunDir(self.folder).write(self.part_name(index, name), part.to_dict())


def _run_round(index: int, plan: Plan, order: Sequence[str], state: RaceState, store: RaceFolder,
               workload: ProbeWorkload, runner: Runner) -> None:
    by_id = {it.id: it for it in workload.items}
    for name in [n for n in order if plan.get(n)]:
        part = store.read_part(index, name)
        if part is None:
            part = runner(name, [by_id[pid] for pid in plan[name]], [1], f"r{index:03d}")
            store.write_part(index, name, part)
        state.parts[(index, name)] = part


def race_parts(workload: ProbeWorkload, order: Sequence[str], baseline: str, name_of: Mapping[str, str],
               runner: Runner, decide: Decide, budget_s: float, folder: Path | None, *, reserve_s: float = 0.0,
               initial: int = INITIAL_PROMPTS, step: int = RACE_STEP,
               max_per_category: int = MAX_PROMPTS_PER_CATEGORY, clock: Callable[[], float] = time.monotonic,
               progress: Callable[[str], None] | None = None) -> tuple[RaceState, RaceLog]:
    """Race the configurations (``order``: the baseline first) within ``budget_s`` less ``reserve_s`` (module
    doc); rounds saved under ``folder`` are read back, not run again. Returns the state (every part) and the
    log (rounds, drops, why it stopped, the final decisions)."""
    say = progress or (lambda _: None)
    log = RaceLog(budget_s=float(budget_s), started=clock())
    deadline = log.started + float(budget_s) - reserve_s
    store = RaceFolder(folder)
    state = RaceState(rounds=store.read_rounds())
    noted: set[tuple[str, float, str]] = set()
    shown: list[str] = []
    if not state.rounds:
        state.rounds = [first_round(workload, order, initial)]
        store.write_rounds(state.rounds)
    index = 0
    while True:
        plan = state.rounds[index]
        # the order reversed every other round (as --repeats): drift falls on every configuration alike
        _run_round(index, plan, order if index % 2 == 0 else list(order)[::-1], state, store, workload, runner)
        decisions = decide(state.merged())
        log.final = decisions
        now_open = sorted({str(v["category"]) for v in open_decisions(decisions)})
        if index == 0 or now_open != shown:  # one line when the open categories change, not one per round
            shown = now_open
            say(f"race after round {index} ({clock() - log.started:.0f} s): "
                + (f"open {', '.join(now_open)}" if now_open else "every decision resolved"))
        note_drops(log, decisions, dict(name_of), noted, lambda c: _prompts_of(state, c, workload))
        if index > 0:
            log.rounds.append({"after_s": round(clock() - log.started, 1), "round": index,
                               "prompts": {n: len(ids) for n, ids in plan.items()}})
        index += 1
        if index < len(state.rounds):
            continue  # a resumed run replays the rounds it had planned
        if not open_decisions(decisions):
            log.stopped = "every decision resolved"
            break
        nxt = next_round(decisions, state, workload, baseline, name_of, step, max_per_category)
        if not nxt:
            log.stopped = "no more prompts in the open categories"
            break
        if clock() + estimate_s(nxt, state) > deadline:
            log.stopped = "budget spent"
            break
        state.rounds.append(nxt)
        store.write_rounds(state.rounds)
    say(f"race: {len(state.rounds)} rounds in {clock() - log.started:.0f} s, {log.stopped}")
    return state, log


def _prompts_of(state: RaceState, category: str, workload: ProbeWorkload) -> int:
    return sum(1 for pid in state.used() if workload.category_of(pid) == category)


def survivors(decisions: Sequence[Verdict | VerdictDict], name_of: Mapping[str, str], baseline: str) -> list[str]:
    """The baseline, then the configurations the final decisions stand on (the chosen setting of a deploy, the
    contenders of an open decision): the ones the load points measure. The first configuration when none."""
    names = [baseline]
    for v in map(as_verdict, decisions):
        for s in [v.setting] * v.deploys + v.contenders:
            if s in name_of and name_of[s] not in names:
                names.append(name_of[s])
    if len(names) == 1:
        names += [n for n in name_of.values() if n != baseline][:1]
    return names


class RaceDocument(RaceLogDict, total=False):
    """``run.json``'s ``race`` of ``probe --budget``: the race's log, the prompts each configuration ran over
    every round; :mod:`specledger.probe.launch_budget` adds the configurations measured at the load points and,
    for an endpoint, the γ label its counters gave."""

    prompts_per_configuration: dict[str, int]
    round_count: int
    load_point_configurations: list[str]
    gamma_label: str | None


def race_document(state: RaceState, log: RaceLog) -> RaceDocument:
    """``run.json``'s ``race``: the log, and the prompts each configuration ran."""
    prompts: dict[str, int] = {}
    for plan in state.rounds:
        for name, ids in plan.items():
            prompts[name] = prompts.get(name, 0) + len(ids)
    doc: RaceDocument = {**log.to_dict(), "prompts_per_configuration": prompts, "round_count": len(state.rounds)}
    return cast(RaceDocument, json_safe(doc))  # the same keys, as strict JSON


__all__ = ["INITIAL_PROMPTS", "RACE_DIR", "RaceDocument", "RaceState", "estimate_s", "first_round", "next_round",
           "race_document", "race_parts", "survivors"]
