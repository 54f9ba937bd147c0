"""Loads in the main job: each setting under continuous batching at every load > 1 (``specledger run --loads``).

After the solo job (load 1), every setting -- plain decoding and each drafter × γ of the plan --
serves the run's own prompts through the batch engine, closed loop at each concurrency L > 1:
max(L, prompts) requests (the prompts cycled, categories interleaved so that every wave mixes
them), the same requests for every setting, the order of the settings rotated from one load to the
next so that a slow phase of the machine does not always hit the same one. One point per (load,
temperature, setting) is :func:`specledger.bench.serving.run_point` -- the serving experiment's
loop, not a second one.

Every request is a record in ``traces.jsonl`` tagged ``extra.experiment = "load"`` (kept apart
from the solo records: :func:`specledger.records.main_records`) with its point's ``load``,
``setting``, wall time, CPU time (``time.process_time`` around the point) and committed tokens,
from which :mod:`specledger.gates.load_verdicts` builds the gates and the verdict per (category,
temperature, load). ``--resume`` skips the points already in the trace (a point's records are
appended together).

``--loads A..B`` (``plan.locate_loads``) measures both ends, then bisects in powers of two where the decisions
so far change between adjacent measured loads (:mod:`specledger.load_bisect`, the planner the probe uses too),
until each change is bracketed within 2× or the budget holds no further point.

Each point is watched (:class:`specledger.mainjob.disturbance.LoadWatch`): its records carry their window's
``extra.disturbance`` (marked ``load_point``), and a disturbed point is measured once more, its first records kept
under ``extra.experiment = "disturbed"`` (out of :func:`specledger.records.load_records`), at most once per point
and not while the disturbance lasts (the rule in :mod:`specledger.mainjob.disturbance`).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypedDict

from specledger.engine.drafters.catalog import PLAIN
from specledger.engine.protocol import TargetEngine
from specledger.load_points import interleaved, requests_at
from specledger.mainjob.disturbance import LoadWatch, watched
from specledger.records import EXPERIMENT_KEY, LOAD_EXPERIMENT, load_records, setting_label
from specledger.rundir import RunDir

Progress = Callable[[int, int, str], None]
#: an extra load point is started only when its estimated time, times this, ends before the deadline (the
#: estimate interpolates between other loads: a point can take longer than it says)
POINT_COST_MARGIN = 1.25


class MemoryFacts(TypedDict):
    """``run.json``'s figures for the KV-capacity gate at loads > 1."""

    kv_bytes_per_token: int  # m_KV: bytes of K and V per token of context
    memory_total_bytes: int | None  # the machine's physical memory (None: unknown)


def memory_facts(engine: TargetEngine) -> MemoryFacts:
    """What the KV-capacity gate needs: m_KV (bytes of K and V per token, from the model config:
    2 · layers · kv_heads · head_dim · bytes per element) and the machine's memory."""
    from specledger.bench.serving_memory import model_kv_shape

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    return {"kv_bytes_per_token": model_kv_shape(engine.model).bytes_per_token, "memory_total_bytes": total}


def settings_of(plan: Any) -> list[tuple[str, int]]:
    """Plain decoding, then every drafter × γ of the plan (the solo job's settings)."""
    return [(PLAIN.name, 0)] + [(d, g) for d in plan.drafters for g in plan.gammas_for(d)]


def done_points(run: RunDir) -> set[tuple[int, float, str]]:
    """The (load, temperature, setting) points the run's trace already holds."""
    return {(int(r.extra["load"]), round(float(r.temperature), 6), str(r.extra.get("setting")))
            for r in load_records(run.records_so_far())}


def point_costs(records: Sequence[Any], settings: Sequence[tuple[str, int]],
                prompt_ids: Collection[str] | None = None) -> dict[int, float]:
    """What each measured load cost per request served (s): at load > 1 the wall time of its points (one
    ``point_wall_s`` per (load, temperature, setting)) over the requests of one point; at load 1 the solo job's
    time of the same settings on the load points' prompts (``prompt_ids``; None: every prompt) over the prompts:
    the requests a load point serves, one at a time. A point at load L serves max(L, prompts) requests."""
    labels = {setting_label(d, g) for d, g in settings}
    walls: dict[tuple[int, float, str], tuple[float, int]] = {}
    for r in load_records(records):
        walls[(int(r.extra["load"]), float(r.temperature), str(r.extra.get("setting")))] = \
            (float(r.extra.get("point_wall_s") or 0.0), int(r.extra.get("point_requests") or 1))
    out: dict[int, float] = defaultdict(float)
    for (load, _, _), (wall, requests) in walls.items():
        out[load] += wall / max(requests, 1)
    solo = [r for r in records if not r.extra.get(EXPERIMENT_KEY) and not r.tree_budget
            and setting_label(r.drafter, r.gamma) in labels and (prompt_ids is None or r.prompt_id in prompt_ids)]
    if solo:
        out[1] = sum(float(r.total_time) for r in solo) / len({r.prompt_id for r in solo})
    return dict(out)


def measured_keys(run: RunDir, slo: Any = None) -> dict[int, Any]:
    """``{load: key}`` of what the run decided so far at each measured load (the solo job's verdicts at load 1,
    :mod:`specledger.gates.load_verdicts` at loads > 1; :func:`specledger.gates.load_verdicts.decision_keys`)."""
    from specledger.gates import SLO, control_repetition, with_measured_margin
    from specledger.gates.load_verdicts import analyze_loads, decision_keys
    from specledger.gates.solo import solo_decisions
    from specledger.records import main_records

    records = run.records_so_far()
    slo = with_measured_margin(slo or SLO(), main_records(records))
    solo = [{**v, "load": 1} for v in solo_decisions(records, slo)]
    at = analyze_loads(records, run.meta(), slo, control_repetition(main_records(records)))
    return decision_keys(solo + at["verdicts"])


def run_load_points(
    run: RunDir,
    plan: Any,
    engine: TargetEngine,
    items: Mapping[str, Any],
    encoded: Mapping[str, list[int]],
    layers: str | None = None,
    progress: Progress | None = None,
    settings: Sequence[tuple[str, int]] | None = None,
    slo: Any = None,
    deadline: float | None = None,
    watch: LoadWatch | None = None,
) -> list[int]:
    """Run every (load > 1, temperature, setting) point of ``plan`` not yet in the run's trace; ``settings``
    (plain first) limits them, e.g. to the settings a race left in contention. With ``plan.locate_loads``
    (``--loads A..B``) the loads are both ends (and the SLO's target load inside them), then the loads
    :func:`specledger.load_bisect.next_load` asks for, read from the decisions so far (``slo``), each only
    while its estimated time (:func:`specledger.load_bisect.point_cost` per request, times the requests, times
    :data:`POINT_COST_MARGIN`) ends before ``deadline`` (a
    ``time.monotonic()`` reading; None: no limit). Each point is watched by ``watch`` (default a fresh
    :class:`~specledger.mainjob.disturbance.LoadWatch`). Returns the loads measured."""
    from specledger.load_bisect import locate, point_cost, range_loads

    settings = list(settings) if settings is not None else settings_of(plan)
    ids = interleaved(list(encoded), {pid: items[pid].category for pid in encoded})
    done = done_points(run)
    watch = watch or LoadWatch()
    order: list[int] = []

    def measure(load: int) -> None:
        order.append(load)
        if load > 1:
            _measure_load(run, plan, engine, items, encoded, layers, progress, settings, ids, done, load,
                          sum(1 for x in order if x > 1) - 1, watch)

    if not getattr(plan, "locate_loads", False):
        for load in sorted(set(plan.loads)):
            measure(load)
    else:
        target = getattr(slo, "target_load", None)

        def afford(load: int) -> bool:
            each = point_cost(load, point_costs(run.records_so_far(), settings, set(encoded)))
            cost = None if each is None else POINT_COST_MARGIN * each * len(requests_at(load, ids))
            ok = deadline is None or (cost is not None and time.monotonic() + cost <= deadline)
            if progress and not ok:
                progress(0, 0, f"load {load} left out: about {cost or 0:.0f} s, more than the budget leaves")
            return ok

        lo, hi = min(plan.loads), max(plan.loads)
        locate(range_loads(lo, hi, [target] if target else []), measure,
               lambda: {x: k for x, k in measured_keys(run, slo).items() if lo <= x <= hi}, afford)
    if progress:
        progress(1, 1, "done")
    return order


def _measure_load(run: RunDir, plan: Any, engine: TargetEngine, items: Mapping[str, Any],
                  encoded: Mapping[str, list[int]], layers: str | None, progress: Progress | None,
                  settings: list[tuple[str, int]], ids: list[str], done: set[tuple[int, float, str]], load: int,
                  k: int, watch: LoadWatch | None = None) -> None:
    """Every (temperature, setting) point at ``load`` not in ``done``, appended to the run's trace; the order of
    the settings rotated by ``k`` (the load's place among the run's loads > 1, in the order measured). Each point
    watched by ``watch`` (default a fresh one): a disturbed point measured once more, its first records appended
    under experiment ``disturbed`` (:func:`specledger.mainjob.disturbance.watched`)."""
    from specledger.bench.serving import run_point
    from specledger.engine.drafters.registry import make_drafter
    from specledger.engine.sampling import SamplingParams

    watch = watch or LoadWatch()
    eos = sorted(engine.eos_token_ids)
    reqs = requests_at(load, ids)
    prompts = [list(encoded[pid]) for pid in reqs]
    budgets = [plan.max_tokens_for(items[pid].category) for pid in reqs]
    shift = k % len(settings)
    total = len(plan.temperatures) * len(settings)
    count = 0
    for temperature in plan.temperatures:
        for name, gamma in settings[shift:] + settings[:shift]:
            label = setting_label(name, gamma)
            count += 1
            if (load, round(float(temperature), 6), label) in done:
                continue
            if progress:
                progress(count - 1, total, f"load {load} T={temperature:g} {label}")

            def point(n: str = name, g: int = gamma, t: float = temperature) -> list[Any]:
                def factory() -> Any:
                    return make_drafter(n, engine, layers=layers, draft_path=plan.draft)

                records, m = run_point(engine.model, prompts, factory, g, budgets, concurrency=load, eos=eos,
                                       params=SamplingParams(temperature=t, seed=plan.seed))
                _tag_point(records, m, items, reqs, load, n, g, t)
                return records

            run.append(watched(watch, point, run.append))


def _tag_point(records: Sequence[Any], m: Mapping[str, Any], items: Mapping[str, Any], reqs: Sequence[str],
               load: int, name: str, gamma: int, temperature: float) -> None:
    """One point's records (``run_point``'s, with its figures ``m``) tagged as a load record: the request's prompt
    and category, the setting, ``extra.experiment = "load"``, the point's wall and CPU time, tokens and memory,
    the answer's quality."""
    from specledger.quality import answer_complete, score

    label = setting_label(name, gamma)
    draft = m.get("draft_memory", {})
    tokens = sum(r.output_tokens for r in records)
    for r in records:
        i = int(r.prompt_id[1:])
        pid = reqs[i]
        item = items[pid]
        r.prompt_id, r.category = pid, item.category
        r.drafter, r.gamma, r.temperature = name, gamma, temperature
        r.request_id = f"load{load}|{label}|T{temperature:g}|{i}"
        r.extra.update({
            EXPERIMENT_KEY: LOAD_EXPERIMENT, "kind": "concurrency", "load": load, "setting": label,
            "point_wall_s": m["wall_s"], "point_cpu_s": m["cpu_s"], "point_tokens": tokens,
            "point_requests": len(records), "slots": m.get("slots"),
            "preemptions": m.get("preemptions"),
            "draft_weight_bytes": draft.get("weight_bytes", 0),
            "draft_kv_bytes_per_token": draft.get("kv_bytes_per_token", 0),
            "quality": score(item, r.text),
        })
        if (complete := answer_complete(item, r.text, r.stop_reason)) is not None:
            r.extra["quality_complete"] = complete
