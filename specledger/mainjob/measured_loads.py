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
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specledger.engine.protocol import TargetEngine
from specledger.load_points import interleaved, requests_at
from specledger.records import EXPERIMENT_KEY, LOAD_EXPERIMENT, load_records, setting_label
from specledger.rundir import RunDir


def memory_facts(engine: TargetEngine) -> dict[str, Any]:
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
    return [("none", 0)] + [(d, g) for d in plan.drafters for g in plan.gammas_for(d)]


def done_points(run: RunDir) -> set[tuple[int, float, str]]:
    """The (load, temperature, setting) points the run's trace already holds."""
    return {(int(r.extra["load"]), round(float(r.temperature), 6), str(r.extra.get("setting")))
            for r in load_records(run.records_so_far())}


def run_load_points(
    run: RunDir,
    plan: Any,
    engine: TargetEngine,
    items: Mapping[str, Any],
    encoded: Mapping[str, list[int]],
    layers: str | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    settings: Sequence[tuple[str, int]] | None = None,
) -> None:
    """Run every (load > 1, temperature, setting) point of ``plan`` not yet in the run's trace; ``settings``
    (plain first) limits them, e.g. to the settings a race left in contention."""
    from specledger.bench.serving import run_point
    from specledger.engine.drafters.registry import make_drafter
    from specledger.engine.sampling import SamplingParams
    from specledger.quality import answer_complete, score

    loads = sorted({x for x in plan.loads if x > 1})
    settings = list(settings) if settings is not None else settings_of(plan)
    ids = interleaved(list(encoded), {pid: items[pid].category for pid in encoded})
    done = done_points(run)
    total = len(loads) * len(plan.temperatures) * len(settings)
    count = 0
    eos = sorted(engine.eos_token_ids)
    for temperature in plan.temperatures:
        for k, load in enumerate(loads):
            reqs = requests_at(load, ids)
            prompts = [list(encoded[pid]) for pid in reqs]
            budgets = [plan.max_tokens_for(items[pid].category) for pid in reqs]
            shift = k % len(settings)
            for name, gamma in settings[shift:] + settings[:shift]:
                label = setting_label(name, gamma)
                count += 1
                if (load, round(float(temperature), 6), label) in done:
                    continue
                if progress:
                    progress(count - 1, total, f"load {load} T={temperature:g} {label}")
                def factory(n: str = name) -> Any:
                    return make_drafter(n, engine, layers=layers, draft_path=plan.draft)

                records, m = run_point(engine.model, prompts, factory, gamma, budgets, concurrency=load, eos=eos,
                                       params=SamplingParams(temperature=temperature, seed=plan.seed))
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
                run.append(records)
    if progress:
        progress(total, total, "done")


