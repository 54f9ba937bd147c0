"""Build ``summary.json`` and a self-contained ``report.html`` from a run directory.

Nothing is re-run: the report is a pure function of ``traces.jsonl`` (+ ``run.json``) and the SLO.
Both files are written atomically (temp file in the same directory, then ``os.replace``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specledger.analysis.run import analyze_run, clean
from specledger.analysis.scenario import baseline_key, group_scenarios
from specledger.engine.trace import RequestRecord, read_records
from specledger.errors import SpecLedgerError
from specledger.gates import GATES, NOT_ASSESSED, SLO, evaluate_gates, load_slo, verdicts

SUMMARY_NAME = "summary.json"
HTML_NAME = "report.html"
SCHEMA = "specledger.summary/1"
EXPERIMENT_KEY = "experiment"  # RequestRecord.extra key set by side experiments (specledger sweep)
EXPERIMENT_FILES = {"quantization": "quantization.json", "policies": "policies.json", "serving": "serving.json"}
ENDPOINT_FILES = ("probe.json", "vllm_bench.json")  # endpoint figures (specledger probe / import-vllm-bench)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a report is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_run(run_dir: str | Path) -> tuple[list[RequestRecord], dict[str, Any]]:
    """Records of ``run_dir/traces.jsonl`` and the ``run.json`` metadata ({} when absent)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SpecLedgerError(f"run directory not found: {run_dir}; pass the folder that holds traces.jsonl")
    trace = run_dir / "traces.jsonl"
    endpoint_only = any((run_dir / name).is_file() for name in ENDPOINT_FILES)
    if not trace.is_file() and not endpoint_only:
        raise SpecLedgerError(
            f"no traces.jsonl in {run_dir}; run `specledger run` first or point at a run folder"
        )
    records = list(read_records(trace)) if trace.is_file() else []
    if not records and not endpoint_only:
        raise SpecLedgerError(f"{trace} holds no complete request; run more requests before reporting")
    meta: dict[str, Any] = {}
    meta_path = run_dir / "run.json"
    if meta_path.is_file():
        try:
            loaded = json.loads(meta_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise SpecLedgerError(f"{meta_path} is not valid JSON ({exc}); fix or delete it") from None
        if not isinstance(loaded, dict):
            raise SpecLedgerError(f"{meta_path} must hold a JSON object")
        meta = loaded
    return records, meta


def main_records(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The records of the main job: side-experiment records (``extra["experiment"]`` set, e.g. the
    four-way's int8 target or a second plain baseline of the same prompt) would pair wrongly with
    the main baselines, so they are analysed only by their own experiment (its JSON file)."""
    return [r for r in records if not r.extra.get(EXPERIMENT_KEY)]


def load_experiments(run_dir: str | Path) -> dict[str, Any]:
    """The side-experiment results present in ``run_dir`` (``quantization.json``, ``policies.json``,
    ``serving.json``), and the endpoint figures of ``probe.json`` / ``vllm_bench.json``."""
    out: dict[str, Any] = {}
    for name, filename in EXPERIMENT_FILES.items():
        path = Path(run_dir) / filename
        if not path.is_file():
            continue
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise SpecLedgerError(f"{path} is not valid JSON ({exc}); re-run `specledger sweep` or delete it") from None
        if isinstance(loaded, dict):
            out[name] = loaded
    from specledger.probe.records import endpoint_experiments

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
) -> dict[str, Any]:
    """Every figure of the report as one JSON-ready dict: analysis + gates + verdicts, plus the
    side experiments' results (``experiments``) as they are. Side-experiment records are left out
    of the main analysis (:func:`main_records`)."""
    meta = dict(meta or {})
    slo = slo or SLO()
    all_records = list(records)
    records = main_records(all_records)
    analysis = analyze_run(records, n_resamples=n_resamples, seed=seed)
    groups = group_scenarios(records)
    by_label = {k.label: k for k in groups}
    run_memory = _run_memory(meta)
    for s in analysis["scenarios"]:
        key = by_label[s["label"]]
        if s.get("memory_bytes") is None and run_memory is not None:
            s["memory_bytes"] = run_memory
        gates = evaluate_gates(s, groups[key], groups.get(baseline_key(key), []), slo)
        s["gates"] = {name: gates[name].to_dict() for name in GATES}
    return clean(
        {
            "schema": SCHEMA,
            "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "meta": meta,
            "slo": slo.to_dict(),
            "requests": len(records),
            "experiment_requests": len(all_records) - len(records),
            "experiments": dict(experiments or {}),
            "verdicts": verdicts(analysis["scenarios"], slo),
            **analysis,
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
        unpaired=summary["unpaired"],
        scenarios=summary["scenarios"],
        baselines=summary["baselines"],
        cost_models=summary["cost_models"],
        optimal_gamma=summary["optimal_gamma"],
        gate_names=GATES,
        status_class={"pass": "pass", "fail": "fail", NOT_ASSESSED: "na"},
        fmt=_fmt,
        fmt_bytes=_fmt_bytes,
        plots={**figure_divs(summary), **experiment_figure_divs(summary)},
        experiments=summary.get("experiments", {}),
        plotly_js=get_plotlyjs(),
    )


def build_report(
    run_dir: str | Path, slo: SLO | str | Path | None = None, n_resamples: int = 1000, seed: int = 0
) -> tuple[dict[str, Any], Path]:
    """Rebuild ``summary.json`` and ``report.html`` in ``run_dir`` from its traces; returns (summary, html path)."""
    run_dir = Path(run_dir)
    slo_obj = slo if isinstance(slo, SLO) else load_slo(slo)
    records, meta = load_run(run_dir)
    summary = summarize(records, meta, slo_obj, n_resamples=n_resamples, seed=seed,
                        experiments=load_experiments(run_dir))
    summary["run_dir"] = str(run_dir)
    html = render_html(summary, title=str(meta.get("name") or run_dir.name))
    atomic_write_text(
        run_dir / SUMMARY_NAME, json.dumps(summary, indent=2, ensure_ascii=False, allow_nan=False)
    )
    html_path = run_dir / HTML_NAME
    atomic_write_text(html_path, html)
    return summary, html_path


__all__ = ["build_report", "summarize", "render_html", "load_run", "atomic_write_text", "load_experiments",
           "main_records"]
