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
from dataclasses import replace
from pathlib import Path
from typing import Any, NotRequired, TypedDict, TypeVar

from specledger.analysis.endpoints import endpoint_experiments
from specledger.analysis.run import analyze_run
from specledger.analysis.scenario import ScenarioKey, group_scenarios
from specledger.cost.costmodel import CostModel, fit_cost_model
from specledger.gates import (
    SLO,
    check_target_load,
    control_repetition,
    with_measured_margin,
)
from specledger.gates.context_schedule import context_schedules
from specledger.gates.decision import RaceDrop, Verdict, VerdictDict
from specledger.gates.load_verdicts import analyze_loads
from specledger.gates.mix import mix_decisions
from specledger.gates.schedule import schedules
from specledger.gates.solo import gate_scenarios
from specledger.gates.verdicts import decide
from specledger.mainjob.disturbance import run_finding
from specledger.mainjob.race import RaceDropped, Setting
from specledger.predict.check import run_prediction_check, scenario_predictions, usable
from specledger.predict.replay import run_forecast_inputs
from specledger.probe.engine_command import check_engine_command, llama_flags_at_hand
from specledger.provenance import provenance
from specledger.records import GammaSpec, RequestRecord, main_records
from specledger.report.summary_model import measured_load
from specledger.report.view import interval_spec
from specledger.rundir import EXPERIMENT_FILES, TRACE_NAME, RunDir, json_safe, summary_meta

SCHEMA = "specledger.summary/1"
#: (the run's measured verify surface or None, the replayer of its greedy rounds or None)
ForecastInputs = tuple[Any, Any]



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


#: the race's dropped settings per (category, temperature): :func:`race_drops`
RaceDrops = dict[tuple[str, float], list[RaceDropped]]


class ScenarioKeys(TypedDict):
    """What names a scenario row's setting and decision (:func:`specledger.analysis.run.analyze_scenario`)."""

    category: str
    temperature: float
    drafter: str
    gamma: GammaSpec
    tree_budget: NotRequired[int]


#: a scenario row, whatever else it carries
Row = TypeVar("Row", bound=ScenarioKeys)


def race_drops(meta: dict[str, Any]) -> RaceDrops:
    """The race's dropped settings per (category, temperature), as its log recorded them (``run.json`` ``race``)."""
    out: RaceDrops = {}
    for d in (meta.get("race") or {}).get("dropped") or []:
        out.setdefault((str(d.get("category")), float(d.get("temperature") or 0.0)), []).append(d)
    return out


def _setting_of(s: ScenarioKeys) -> Setting:
    """A scenario row's setting (a γ given as digits read as the number its label shows)."""
    gamma = s["gamma"]
    return Setting(s["drafter"], int(gamma) if isinstance(gamma, str) and gamma.isdigit() else gamma,
                   s.get("tree_budget") or 0)


def still_racing(scenarios: list[Row], drops: RaceDrops) -> list[Row]:
    """The scenarios the load-1 decision chooses among: a setting the race dropped stays out (its drop held at
    every look, :mod:`specledger.analysis.sequential`), unless the race dropped every setting of its category."""
    def key(s: Row) -> tuple[str, float]:
        return str(s["category"]), float(s["temperature"])

    def dropped(s: Row) -> bool:
        return _setting_of(s) in {Setting.parse(d["label"]) for d in drops.get(key(s), [])}

    kept = {key(s) for s in scenarios if not dropped(s)}
    return [s for s in scenarios if not dropped(s) or key(s) not in kept]


def story(verdict: Verdict, drops: RaceDrops) -> list[RaceDrop] | None:
    """The race's own record of the category's dropped settings, told with its decision (``race_dropped``); None
    where it dropped none."""
    these = drops.get((str(verdict.category), float(verdict.temperature or 0.0))) or []
    return [RaceDrop(d["label"], d.get("after_prompts"), d.get("why")) for d in these] or None


def _scenario_key(s: ScenarioKeys) -> ScenarioKey:
    """The key an analysed scenario row was grouped by (:meth:`~specledger.analysis.scenario.ScenarioKey.as_dict`)."""
    return ScenarioKey(s["category"], s["temperature"], s["drafter"], s["gamma"], s.get("tree_budget") or 0)


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
    run_memory = _run_memory(meta)
    for s in analysis["scenarios"]:
        key = _scenario_key(s)
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
    solo_load = measured_load(meta.get("kind"), meta.get("config"))
    drops = race_drops(meta)
    decided: list[VerdictDict] = [
        replace(v, load=solo_load, simulated=False, race_dropped=story(v, drops)).to_dict()
        for v in decide(still_racing(analysis["scenarios"], drops), slo, controls, plain_gates, solo_load)]
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
            "intervals": interval_spec(slo.decision_alpha),  # how every S and ratio below is estimated, at what level
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
