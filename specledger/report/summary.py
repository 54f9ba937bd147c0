"""Every figure of a run and its verdicts as one JSON-ready dict (``summary.json``): the one place
that runs the steps in order, each a layer below this one.

1. The main job's records (:func:`specledger.records.main_records`) are analysed per scenario
   (:func:`specledger.analysis.run.analyze_run`: ledger figures, S with the decisions' own interval, the
   round ledger's reconciliation, the run's cost model per drafter, optimal γ).
2. The prediction check (:func:`specledger.predict.check.run_prediction_check`: leave one γ out) and
   the end-to-end model's speed-up of every measured setting.
3. The four gates per scenario (:mod:`specledger.gates`) and the verdicts at load 1, then at every
   load > 1 of ``specledger run --loads`` (:func:`specledger.gates.load_verdicts.analyze_loads`).
4. The schedule over loads (:mod:`specledger.gates.schedule`).

The run's forecast inputs -- the verify surface measured at its start and the exact replayer of its
greedy rounds -- are built once per summary and shared by every step (the replayer keeps each
(drafter, γ) it has replayed). Nothing here draws: :mod:`specledger.report` renders the result.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specledger.analysis.endpoints import endpoint_experiments
from specledger.analysis.run import analyze_run
from specledger.analysis.scenario import group_scenarios
from specledger.cost.costmodel import CostModel, fit_cost_model
from specledger.gates import (
    SLO,
    check_target_load,
    control_repetition,
    verdicts,
    with_measured_margin,
)
from specledger.gates.context_schedule import context_schedules
from specledger.gates.load_verdicts import analyze_loads
from specledger.gates.mix import mix_decisions
from specledger.gates.schedule import schedules
from specledger.gates.solo import gate_scenarios
from specledger.gates.verdict_rules import setting_name
from specledger.mainjob.disturbance import run_finding
from specledger.predict.check import run_prediction_check, scenario_predictions, usable
from specledger.predict.replay import run_forecast_inputs
from specledger.probe.engine_command import check_engine_command, llama_flags_at_hand
from specledger.provenance import provenance
from specledger.records import RequestRecord, main_records
from specledger.report.view import interval_spec
from specledger.rundir import EXPERIMENT_FILES, TRACE_NAME, RunDir, json_safe, summary_meta

SCHEMA = "specledger.summary/1"
#: (the run's measured verify surface or None, the replayer of its greedy rounds or None)
ForecastInputs = tuple[Any, Any]



def measured_load(meta: dict[str, Any]) -> int:
    """The concurrency at which the run's plain records were measured: 1 for the main job (one request at a
    time); a probe's ``--concurrency`` for a probe at one load. A probe driven by ``--rate`` has no fixed
    concurrency; its verdict is read at the concurrency it reached, which the run does not record, so 1."""
    config = meta.get("config") or {}
    if meta.get("kind") == "probe" and config.get("concurrency") and not config.get("rate"):
        return int(config["concurrency"])
    return 1

def load_experiments(run: RunDir) -> dict[str, Any]:
    """The side-experiment results present in the run directory (``quantization.json``, ``policies.json``,
    ``serving.json``, ``simulate.json``) as they are, and the endpoint figures of ``probe.json`` /
    ``vllm_bench.json`` / ``guidellm.json`` (:func:`~specledger.analysis.endpoints.endpoint_experiments`)."""
    found = run.experiments()
    out = {key: found[key] for key in EXPERIMENT_FILES if key in found}
    out.update(endpoint_experiments(found))  # "probe" / "vllm_bench": endpoint figures, no per-request rows
    return out


def _chains(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The main job's chain records: the γ performance model is for chains (trees: ``analyze_trees``)."""
    return [r for r in main_records(records) if not r.tree_budget]


def _run_memory(meta: dict[str, Any]) -> float | None:
    for key in ("peak_memory_bytes", "peak_mem_bytes"):
        value = meta.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def race_drops(meta: dict[str, Any]) -> dict[tuple[str, float], list[dict[str, Any]]]:
    """The race's dropped settings per (category, temperature), as its log recorded them (``run.json`` ``race``)."""
    out: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for d in (meta.get("race") or {}).get("dropped") or []:
        out.setdefault((str(d.get("category")), float(d.get("temperature") or 0.0)), []).append(d)
    return out


def still_racing(scenarios: list[dict[str, Any]], drops: dict[tuple[str, float], list[dict[str, Any]]]
                 ) -> list[dict[str, Any]]:
    """The scenarios the load-1 decision chooses among: a setting the race dropped stays out (its drop held at
    every look, :mod:`specledger.analysis.sequential`), unless the race dropped every setting of its category."""
    def key(s: dict[str, Any]) -> tuple[str, float]:
        return str(s["category"]), float(s["temperature"])

    def dropped(s: dict[str, Any]) -> bool:
        return any(d["label"] == setting_name(s) for d in drops.get(key(s), []))

    kept = {key(s) for s in scenarios if not dropped(s)}
    return [s for s in scenarios if not dropped(s) or key(s) not in kept]


def story(verdict: dict[str, Any], drops: dict[tuple[str, float], list[dict[str, Any]]]) -> dict[str, Any]:
    """The race's own record of the category's dropped settings, told with its decision: ``race_dropped``."""
    these = drops.get((str(verdict.get("category")), float(verdict.get("temperature") or 0.0))) or []
    return {"race_dropped": [{"setting": d["label"], "after_prompts": d.get("after_prompts"), "why": d.get("why")}
                             for d in these]} if these else {}


def summarize(
    records: Sequence[RequestRecord],
    meta: dict[str, Any] | None = None,
    slo: SLO | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    experiments: dict[str, Any] | None = None,
    forecast_inputs: ForecastInputs | None = None,
    simulate_loads: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Every figure of the report as one JSON-ready dict: analysis + prediction check + gates + verdicts,
    plus the side experiments' results (``experiments``) as they are. Side-experiment records are left
    out of the main analysis (:func:`~specledger.records.main_records`). ``forecast_inputs``: the run's
    (surface, replayer) when the caller has built them (:func:`run_forecast_inputs` of the chains).
    ``simulate_loads`` (default: ``run.json``'s ``config.simulate_loads``): loads to simulate beyond the
    measured ones, each with verdicts labelled ``simulated`` (:mod:`specledger.gates.simulated_loads`)."""
    meta = dict(meta or {})
    all_records = list(records)
    records = main_records(all_records)
    slo = with_measured_margin(slo or SLO(), records)  # latency outcomes inside the run's own drift are marginal
    chains = _chains(records)
    inputs = forecast_inputs if forecast_inputs is not None else run_forecast_inputs(chains, meta)
    surface, replay = inputs  # the run's verify surface; exact replay of greedy rounds
    analysis = analyze_run(records, alpha=slo.decision_alpha, surface=surface, replay=replay)
    check = run_prediction_check(chains, meta, inputs=inputs)
    predicted = scenario_predictions(chains, check, meta, inputs=inputs)
    groups = group_scenarios(records)
    by_label = {k.label: k for k in groups}
    run_memory = _run_memory(meta)
    for s in analysis["scenarios"]:
        key = by_label[s["label"]]
        if s.get("memory_bytes") is None and run_memory is not None:
            s["memory_bytes"] = run_memory
        pred = (None if key.tree_budget
                else predicted.get((key.category, float(key.temperature), key.drafter, key.gamma)))
        s["predicted_speedup_e2e"] = pred["speedup"] if pred else None  # specledger.predict, end to end
        s["prediction_kind"] = pred["kind"] if pred else None
    plain_gates = gate_scenarios(analysis["scenarios"], groups, analysis["baselines"], slo)
    # the main job decodes one request at a time: its verdicts are at load 1, measured; the load
    # points (``specledger run --loads``) add a verdict per load > 1 (specledger.gates.load_verdicts)
    controls = control_repetition(records)
    solo_load = measured_load(meta)
    drops = race_drops(meta)
    decided = [{**v, "load": solo_load, "simulated": False, **story(v, drops)}
               for v in verdicts(still_racing(analysis["scenarios"], drops), slo, controls, plain_gates, solo_load)]
    at_loads = analyze_loads(all_records, meta, slo, controls)
    decided += at_loads["verdicts"]
    loads = sorted({solo_load, *at_loads["loads"]}) if records else at_loads["loads"]
    # loads beyond what ran here: the simulator, priced by this run (specledger.gates.simulated_loads)
    sim_loads = simulate_loads if simulate_loads is not None else (meta.get("config") or {}).get("simulate_loads")
    sim_loads = sorted(set(int(x) for x in sim_loads or []) - set(loads)) if records else []
    sim = None
    if sim_loads:
        from specledger.gates.simulated_loads import simulated_loads

        sim = simulated_loads(all_records, meta, slo, sim_loads, analysis["scenarios"] + at_loads["scenarios"],
                              controls, surface, n_resamples=n_resamples, seed=seed)
        decided += sim["verdicts"]
        sim_loads = sorted({int(v["load"]) for v in sim["verdicts"]})  # none when nothing could be simulated
    check_target_load(slo, loads, sim_loads)
    launch = meta.get("launch") if isinstance(meta.get("launch"), dict) else None
    disturbance = run_finding(all_records) or meta.get("disturbance")  # the run's prompts, or probe's seconds
    summary = json_safe(
        {
            "schema": SCHEMA,
            "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "provenance": provenance(),
            "meta": summary_meta(meta),
            "slo": slo.to_dict(),
            "intervals": interval_spec(slo.to_dict()),  # how every S and ratio below is estimated, at what level
            "requests": len(records),
            "experiment_requests": len(all_records) - len(records),
            "experiments": dict(experiments or {}),
            "verdicts": decided,
            # one setting for the traffic as a whole, by the same rule (specledger.gates.mix)
            "mix": mix_decisions(analysis["scenarios"], slo, meta.get("traffic_counts"), meta.get("traffic_mix")),
            # a category decided per context bucket, read as one schedule in context (specledger.gates.context_schedule)
            **({"context_schedules": cs} if (cs := context_schedules(decided, solo_load)) else {}),
            **({"race": meta["race"]} if isinstance(meta.get("race"), dict) else {}),  # the main job's race
            # was the machine disturbed while measuring (specledger.mainjob.disturbance)
            **({"disturbance": disturbance} if isinstance(disturbance, dict) else {}),
            # probe --launch: the engine's counters reconciled per configuration, and how it was launched
            **({"launch": launch, "engine_counters": meta.get("engine_counters")} if launch else {}),
            "schedules": [{k: v for k, v in sch.items() if k != "cells"}
                          for sch in schedules(decided, slo.target_load, llama_flags=llama_flags_at_hand())],
            "loads": loads,
            "simulated_loads": sim_loads,
            "simulation": sim["simulation"] if sim else None,
            "load_scenarios": at_loads["scenarios"] + (sim["scenarios"] if sim else []),
            "load_baselines": at_loads["baselines"],
            **analysis,
            "prediction_check": check,
        }
    )
    if launch:  # the schedules' configs are the launched engine's own command line, never another engine's
        from specledger.probe.launch_schedules import patch_launched_schedules

        patch_launched_schedules(summary, launch, loads)
        for sch in summary.get("schedules") or []:  # llama.cpp: the flags its own binary offers (--help)
            check_engine_command(sch.get("engine") or {})
    return summary  # type: ignore[return-value]


def run_cost_model(records: Sequence[RequestRecord], surface: Any, source: str) -> CostModel | None:
    """The run's cost model (``cost_model.json``, :mod:`specledger.cost.costmodel`) fitted, with its
    bootstrap, on the main job's solo static-γ requests over the verify ``surface`` measured at the run's
    start; None without such requests."""
    solo = usable(main_records(records))
    return fit_cost_model(solo, source=source, surface=surface) if solo else None


def summarize_run(
    run_dir: str | Path | RunDir, slo: SLO | None = None, n_resamples: int = 1000, seed: int = 0,
    simulate_loads: Sequence[int] | None = None,
) -> tuple[dict[str, Any], CostModel | None]:
    """A run directory's summary (:func:`summarize` of its records, ``run.json`` and side experiments,
    ``run_dir`` noted) and its cost model (:func:`run_cost_model`), both from one load of the folder
    and one build of its forecast inputs. Writes nothing."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    records, meta = run.records(), run.meta()
    inputs = run_forecast_inputs(_chains(records), meta)
    summary = summarize(records, meta, slo, n_resamples=n_resamples, seed=seed,
                        experiments=load_experiments(run), forecast_inputs=inputs, simulate_loads=simulate_loads)
    summary["run_dir"] = str(run.path)
    return summary, run_cost_model(records, inputs[0], f"fitted from {run.name}/{TRACE_NAME}")


__all__ = ["SCHEMA", "load_experiments", "run_cost_model", "summarize", "summarize_run"]
