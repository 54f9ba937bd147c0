"""What ``probe --launch`` writes into its run folder once every configuration is in: every configuration's
records at every load (one drafter label each), ``run.json`` with ``engine_counters`` and ``launch`` (each
configuration's arguments, γ, pooled acceptance ledger, log), the model file's m_KV, and ``probe.json``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from specledger.probe.endpoint_loads import LoadPoint, LoadReport, probe_document, tag_load_point
from specledger.probe.engine_command import (
    BASELINE_SPEC,
    UNKNOWN_GAMMA,
    Spec,
    configured_gamma,
    engine_kind,
    spec_drafter_label,
)
from specledger.probe.engine_server import HOST
from specledger.probe.launch import run_order
from specledger.probe.launch_race import RaceDocument
from specledger.probe.launch_runs import SpecRun, counters_of, paired_points, pooled_ledger
from specledger.probe.loadgen import LoadConfig, Tokenizer
from specledger.probe.model_file import gguf_kv_facts, machine_memory, model_path
from specledger.probe.outputs import probe_run_meta, write_probe_run
from specledger.probe.records import records_from_probe
from specledger.probe.workload import ProbeWorkload
from specledger.records import GammaSpec, RequestRecord
from specledger.rundir import PROBE_JSON, RunDir


def launch_records(runs: Mapping[str, SpecRun], kind: str, workload: ProbeWorkload, tokenizer: Tokenizer | None,
                   config: LoadConfig) -> list[RequestRecord]:
    """Every configuration's records at every load (:func:`specledger.probe.endpoint_loads.tag_load_point`), one drafter
    label each (:func:`spec_drafter_label`), γ from :func:`configured_gamma`."""
    records: list[RequestRecord] = []
    for name, run in runs.items():
        label = spec_drafter_label(run.spec, kind)
        gamma: GammaSpec = (0 if run.spec.is_baseline
                            else configured_gamma(run.argv, kind, run.argv[0]) or UNKNOWN_GAMMA)
        for p in run.points:
            report = p.full["probe"]
            recs = records_from_probe(p.results, drafter=label, gamma=gamma, model=report["model"],
                                      endpoint=f"{report['url']} ({name})", temperature=config.temperature,
                                      top_p=config.top_p, seed=config.seed, category_of=workload.category_of,
                                      score_of=workload.score_of, tokenizer=tokenizer)
            records += tag_load_point(recs, p.load, label, gamma, report["summary"].get("wall_time_s"))
    return records


def _load_report(point: LoadPoint) -> LoadReport:
    """One configuration's report at one load for ``probe.json``'s ``specs``: the load, then the report without
    its per-request results."""
    return cast(LoadReport, {"load": point.load, **{k: v for k, v in point.full["probe"].items() if k != "results"}})


def write_launch_dir(out: Path, runs: Mapping[str, SpecRun], template: str, specs: Sequence[Spec],
                     loads: Sequence[int], config: LoadConfig, workload: ProbeWorkload, tokenizer: Tokenizer | None,
                     repeats: int = 1, race: RaceDocument | None = None) -> None:
    """traces.jsonl + run.json (with ``engine_counters`` and ``launch``) + probe.json. The report is the
    caller's to build: its summary carries ``launch`` and ``engine_counters`` from run.json, and its schedules'
    snippets become the engine's own command
    (:func:`specledger.probe.launch_schedules.patch_launched_schedules`)."""
    base = runs[BASELINE_SPEC]
    first_argv = base.argv
    kind = engine_kind(first_argv)
    cands = [s for s in run_order(specs) if not s.is_baseline]
    records = launch_records(runs, kind, workload, tokenizer, config)
    first = paired_points(runs[cands[0].name], base)
    gammas = {s.name: configured_gamma(runs[s.name].argv, kind, runs[s.name].argv[0]) for s in cands}
    meta = probe_run_meta(Path(out).name, first[0].full["probe"], first[0].full["baseline"],
                          drafter=spec_drafter_label(cands[0], kind), gamma=gammas[cands[0].name] or UNKNOWN_GAMMA,
                          workload=workload)
    counters = {name: counters_of(run) for name, run in runs.items()}
    gguf = model_path(first_argv)
    meta.update({
        "machine": f"launched {kind} engine on {HOST}",
        "loads": sorted(set(loads)),
        "load_order": {str(load): [s.name for r in range(repeats) for s in run_order(specs, r)]
                       for load in sorted(set(loads))},
        "engine_counters": counters,
        "launch": {"command": template, "engine": kind, "repeats": repeats,
                   "order": ("off first, then each --spec in the order given" if repeats == 1 else
                             f"{repeats} repeats, the order reversed every other repeat (off first, then last, ...)")
                            + "; each server serves every load in ascending order, then stops",
                   "specs": {s.name: {"args": list(s.args), "label": spec_drafter_label(s, kind),
                                      "gamma": 0 if s.is_baseline else (gammas[s.name] or UNKNOWN_GAMMA),
                                      "ledger": None if s.is_baseline else pooled_ledger(runs[s.name], gammas[s.name]),
                                      "log": runs[s.name].log, "ready_s": runs[s.name].ready_s} for s in specs}},
    })
    if race is not None:  # probe --launch --budget: the race's log (launch_race), as run.json's race of `run`
        meta["race"] = dict(race)
        meta["launch"]["order"] = ("race rounds at load 1, off first in even rounds and last in odd ones, one start "
                                   "per configuration and round; then each load point, one start per "
                                   "configuration and load")
    if gguf is not None:
        meta.update(gguf_kv_facts(gguf, first_argv))
        if kind == "llama.cpp":
            meta["memory_total_bytes"] = machine_memory()  # the CPU build's memory: this machine's
    document = probe_document(first)
    document["specs"] = {name: [_load_report(p) for p in run.points] for name, run in runs.items()}
    RunDir(out).write(PROBE_JSON, document)
    write_probe_run(out, records, meta)
