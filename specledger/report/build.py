"""Build ``summary.json`` and a self-contained ``report.html`` from a run directory.

Nothing is re-run: the report is a pure function of ``traces.jsonl`` (+ ``run.json``) and the SLO.
Both files are written atomically (:func:`specledger.rundir.write_text_atomic`).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specledger.analysis.run import analyze_run
from specledger.analysis.scenario import baseline_key, group_scenarios
from specledger.engine.trace import RequestRecord
from specledger.errors import SpecLedgerError
from specledger.gates import (
    GATES,
    NOT_ASSESSED,
    SLO,
    check_target_load,
    control_repetition,
    evaluate_gates,
    load_slo,
    verdicts,
)
from specledger.predict.check import run_prediction_check, scenario_predictions
from specledger.predict.replay import run_forecast_inputs
from specledger.report.endpoints import endpoint_experiments
from specledger.rundir import (
    ENDPOINT_FILES,
    EXPERIMENT_FILES,
    EXPERIMENT_KEY,
    HTML_NAME,
    META_NAME,
    SUMMARY_NAME,
    TRACE_NAME,
    json_safe,
    read_json,
    read_records,
    write_json_atomic,
    write_text_atomic,
)
from specledger.schedule import schedules

SCHEMA = "specledger.summary/1"


def load_run(run_dir: str | Path) -> tuple[list[RequestRecord], dict[str, Any]]:
    """Records of ``run_dir/traces.jsonl`` and the ``run.json`` metadata ({} when absent)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SpecLedgerError(f"run directory not found: {run_dir}; pass the folder that holds traces.jsonl")
    trace = run_dir / TRACE_NAME
    endpoint_only = any((run_dir / name).is_file() for name in ENDPOINT_FILES)
    if not trace.is_file() and not endpoint_only:
        raise SpecLedgerError(
            f"no {TRACE_NAME} in {run_dir}; run `specledger run` first or point at a run folder"
        )
    records = list(read_records(trace)) if trace.is_file() else []
    if not records and not endpoint_only:
        raise SpecLedgerError(f"{trace} holds no complete request; run more requests before reporting")
    meta: dict[str, Any] = {}
    meta_path = run_dir / META_NAME
    if meta_path.is_file():
        loaded = read_json(meta_path, "fix or delete it")
        if not isinstance(loaded, dict):
            raise SpecLedgerError(f"{meta_path} must hold a JSON object")
        meta = loaded
    return records, meta


def main_records(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The records of the main job: side-experiment records (``extra["experiment"]`` set, e.g. the
    four-way's int8 target or a second plain baseline of the same prompt) would pair wrongly with
    the main baselines, so they are analysed only by their own experiment (its JSON file)."""
    return [r for r in records if not r.extra.get(EXPERIMENT_KEY)]  # load points too (analysis.loads)


def load_experiments(run_dir: str | Path) -> dict[str, Any]:
    """The side-experiment results present in ``run_dir`` (``quantization.json``, ``policies.json``,
    ``serving.json``), and the endpoint figures of ``probe.json`` / ``vllm_bench.json``."""
    out: dict[str, Any] = {}
    for name, filename in EXPERIMENT_FILES.items():
        path = Path(run_dir) / filename
        if not path.is_file():
            continue
        loaded = read_json(path, "re-run `specledger sweep` or delete it")
        if isinstance(loaded, dict):
            out[name] = loaded
    out.update(endpoint_experiments(run_dir))  # "probe" / "vllm_bench": endpoint figures, no per-request rows
    return out


def _run_memory(meta: dict[str, Any]) -> float | None:
    for key in ("peak_memory_bytes", "peak_mem_bytes"):
        value = meta.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def summarize(
    records: Sequence[RequestRecord],
    meta: dict[str, Any] | None = None,
    slo: SLO | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    experiments: dict[str, Any] | None = None,
    simulate_loads: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Every figure of the report as one JSON-ready dict: analysis + gates + verdicts, plus the
    side experiments' results (``experiments``) as they are. Side-experiment records are left out
    of the main analysis (:func:`main_records`). ``simulate_loads`` (default: ``run.json``'s
    ``config.simulate_loads``): loads to simulate beyond the measured ones, each with verdicts
    labelled ``simulated`` (:mod:`specledger.report.simulated`)."""
    meta = dict(meta or {})
    slo = slo or SLO()
    all_records = list(records)
    records = main_records(all_records)
    chains = [r for r in records if not r.tree_budget]  # the γ performance model is for chains
    surface, replay = run_forecast_inputs(chains, meta)  # the run's verify surface; exact replay of greedy rounds
    analysis = analyze_run(records, n_resamples=n_resamples, seed=seed, surface=surface, replay=replay)
    check = run_prediction_check(chains, meta)
    predicted = scenario_predictions(chains, check, meta)
    groups = group_scenarios(records)
    by_label = {k.label: k for k in groups}
    run_memory = _run_memory(meta)
    for s in analysis["scenarios"]:
        key = by_label[s["label"]]
        if s.get("memory_bytes") is None and run_memory is not None:
            s["memory_bytes"] = run_memory
        gates = evaluate_gates(s, groups[key], groups.get(baseline_key(key), []), slo)
        pred = None if key.tree_budget else predicted.get((key.category, float(key.temperature), key.drafter, key.gamma))
        s["predicted_speedup_e2e"] = pred["speedup"] if pred else None  # specledger.predict, end to end
        s["prediction_kind"] = pred["kind"] if pred else None
        s["gates"] = {name: gates[name].to_dict() for name in GATES}
    # the main job decodes one request at a time: its verdicts are at load 1, measured; the load
    # points (``specledger run --loads``) add a verdict per load > 1 (specledger.analysis.loads)
    from specledger.analysis.loads import analyze_loads

    controls = control_repetition(records)
    decided = [{**v, "load": 1, "simulated": False} for v in verdicts(analysis["scenarios"], slo, controls)]
    at_loads = analyze_loads(all_records, meta, slo, controls, n_resamples=n_resamples, seed=seed)
    decided += at_loads["verdicts"]
    loads = sorted({1, *at_loads["loads"]}) if records else at_loads["loads"]
    # loads beyond what ran here: the simulator, priced by this run (specledger.report.simulated)
    sim_loads = simulate_loads if simulate_loads is not None else (meta.get("config") or {}).get("simulate_loads")
    sim_loads = sorted(set(int(x) for x in sim_loads or []) - set(loads)) if records else []
    sim = None
    if sim_loads:
        from specledger.report.simulated import simulated_loads

        sim = simulated_loads(all_records, meta, slo, sim_loads, analysis["scenarios"] + at_loads["scenarios"],
                              controls, surface, n_resamples=n_resamples, seed=seed)
        decided += sim["verdicts"]
        sim_loads = sorted({int(v["load"]) for v in sim["verdicts"]})  # none when nothing could be simulated
    check_target_load(slo, loads, sim_loads)
    return json_safe(
        {
            "schema": SCHEMA,
            "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "meta": meta,
            "slo": slo.to_dict(),
            "requests": len(records),
            "experiment_requests": len(all_records) - len(records),
            "experiments": dict(experiments or {}),
            "verdicts": decided,
            "schedules": [{k: v for k, v in sch.items() if k != "cells"} for sch in schedules(decided, slo.target_load)],
            "loads": loads,
            "simulated_loads": sim_loads,
            "simulation": sim["simulation"] if sim else None,
            "load_scenarios": at_loads["scenarios"] + (sim["scenarios"] if sim else []),
            "load_baselines": at_loads["baselines"],
            **analysis,
            "prediction_check": check,
        }
    )  # type: ignore[return-value]


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None or isinstance(x, str):
        return "n/a" if x is None else x
    return f"{x:,.{digits}f}"


def _fmt_bytes(x: Any) -> str:
    """Bytes in binary units: 512 B, 1.5 KiB, 3.2 MiB, ... ("n/a" for None)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "n/a"
    value = float(x)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GiB"


def render_html(summary: dict[str, Any], title: str = "") -> str:
    """The self-contained report page: plotly.js inlined once, every figure drawn from ``summary``."""
    import jinja2
    from plotly.offline import get_plotlyjs

    from specledger.report.plots import experiment_figure_divs, figure_divs

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("specledger.report", "."),
        autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
        undefined=jinja2.ChainableUndefined,
    )
    template = env.get_template("template.html.j2")
    meta = summary.get("meta", {})
    meta_line = [
        (k, meta[k])
        for k in ("model", "dtype", "machine", "started")
        if isinstance(meta.get(k), (str, int, float))
    ]
    return template.render(
        title=title or str(meta.get("name", "run")),
        generated=summary["generated"],
        meta_line=meta_line,
        slo=summary["slo"],
        verdicts=summary["verdicts"],
        schedules=summary.get("schedules", []),
        load_scenarios=summary.get("load_scenarios", []),
        simulation=summary.get("simulation"),
        unpaired=summary["unpaired"],
        scenarios=summary["scenarios"],
        baselines=summary["baselines"],
        cost_models=summary["cost_models"],
        optimal_gamma=summary["optimal_gamma"],
        prediction_check=summary.get("prediction_check"),
        trees=summary.get("trees") or [],
        gate_names=GATES,
        status_class={"pass": "pass", "fail": "fail", NOT_ASSESSED: "na"},
        fmt=_fmt,
        fmt_bytes=_fmt_bytes,
        plots={**figure_divs(summary), **experiment_figure_divs(summary)},
        experiments=summary.get("experiments", {}),
        plotly_js=get_plotlyjs(),
    )


def _write_cost_model(run_dir: Path, records: Sequence[RequestRecord], meta: dict[str, Any]) -> None:
    """``cost_model.json``: the run's cost model fitted from its main-job traces on the verify surface
    measured at its start (specledger.predict)."""
    from specledger.predict.check import usable
    from specledger.predict.costmodel import fit_cost_model
    from specledger.predict.rundata import COST_NAME

    solo = usable(main_records(records))
    if solo:
        surface, _ = run_forecast_inputs(solo, meta)
        fit_cost_model(solo, source=f"fitted from {run_dir.name}/{TRACE_NAME}",
                       surface=surface).save(run_dir / COST_NAME)


def build_report(
    run_dir: str | Path, slo: SLO | str | Path | None = None, n_resamples: int = 1000, seed: int = 0,
    simulate_loads: Sequence[int] | None = None,
) -> tuple[dict[str, Any], Path]:
    """Rebuild ``summary.json`` and ``report.html`` in ``run_dir`` from its traces; returns (summary, html path).
    ``simulate_loads``: as :func:`summarize` (None: the run's own)."""
    run_dir = Path(run_dir)
    slo_obj = slo if isinstance(slo, SLO) else load_slo(slo)
    records, meta = load_run(run_dir)
    summary = summarize(records, meta, slo_obj, n_resamples=n_resamples, seed=seed,
                        experiments=load_experiments(run_dir), simulate_loads=simulate_loads)
    summary["run_dir"] = str(run_dir)
    html = render_html(summary, title=str(meta.get("name") or run_dir.name))
    write_json_atomic(run_dir / SUMMARY_NAME, summary)
    _write_cost_model(run_dir, records, meta)
    html_path = run_dir / HTML_NAME
    write_text_atomic(html_path, html)
    return summary, html_path


__all__ = ["build_report", "summarize", "render_html", "load_run", "load_experiments", "main_records"]
