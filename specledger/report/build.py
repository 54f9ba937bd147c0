"""Render a run's summary: ``report.html``, self-contained, every figure drawn from ``summary.json``.

Nothing is computed here: :func:`specledger.report.summary.summarize_run` decides every figure (a pure
function of ``traces.jsonl``, ``run.json`` and the SLO); this module draws them and writes the
files, atomically (:class:`specledger.rundir.RunDir`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specledger.gates import GATES, NOT_ASSESSED, SLO, load_slo
from specledger.report.summary import summarize_run
from specledger.rundir import COST_MODEL_JSON, HTML_NAME, SUMMARY_NAME, RunDir


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
    """The self-contained report page: plotly.js inlined once, every figure drawn from ``summary``.

    Layout: the answer first (one row per category at its leading load, :func:`specledger.report.view.answer_rows`,
    and the one setting for all the traffic, :func:`~specledger.report.view.mix_rows`; then the schedule, its
    engine configs folded), one section per category (its verdicts at every load and its own small figures,
    :mod:`specledger.report.category_plots`), then every detail table collapsed in a ``<details>``, then the side
    experiments."""
    import jinja2
    from plotly.offline import get_plotlyjs

    from specledger.report.category_plots import CATEGORY_FIGURES, category_figure_divs
    from specledger.report.plots import experiment_figure_divs, figure_divs
    from specledger.report.summary_model import Summary
    from specledger.report.view import (
        SIMULATED_INTERVAL,
        answer_rows,
        category_sections,
        ci_level,
        ci_name,
        mix_rows,
        snippets,
    )

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("specledger.report", "."),
        autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
        undefined=jinja2.ChainableUndefined,
    )
    template = env.get_template("template.html.j2")
    meta = summary.get("meta", {})
    meta_line = [
        (k, meta[k])
        for k in ("dtype", "machine", "started")
        if isinstance(meta.get(k), (str, int, float))
    ]
    doc = Summary.read(summary)  # the figures the view picks, typed; the detail tables draw the JSON as it is
    answer = answer_rows(doc)
    dtype, bw = str(meta.get("dtype") or ""), meta.get("bandwidth") or {}
    weights_note = ("target weights: the GGUF file's own quantized blocks (" + dtype + "), as a CPU user deploys "
                    "it (llama.cpp runs the file as it is); every speed-up is against plain decoding of this same "
                    "quantized target" if dtype.startswith("gguf") else f"target weights: {dtype}" if dtype else "")
    if bw.get("bandwidth"):
        weights_note += f"{'. ' if weights_note else ''}Plain decode: {bw['bandwidth']}"
    machine = meta.get("machine")  # a dict for runs; a line of text for probes
    kern = machine.get("kernels") if isinstance(machine, dict) else None
    if isinstance(kern, dict):  # which CPU kernels ran (engine/kernels.describe): native, or torch's fallback
        ran = f"native ({kern.get('path')})" if kern.get("native") else f"torch fallback ({kern.get('status')})"
        weights_note += f"{'. ' if weights_note else ''}CPU kernels: {ran}"
    return template.render(
        title=title or str(meta.get("name", "run")),
        model=meta.get("model") if isinstance(meta.get("model"), str) else "",
        generated=summary["generated"],
        meta_line=meta_line,
        weights_note=weights_note,
        disturbance=summary.get("disturbance") or {},
        slo=summary["slo"],
        loads=summary.get("loads") or [],
        simulated_loads=summary.get("simulated_loads") or [],
        multi_t=len({float(v.temperature) for v in doc.verdicts}) > 1,
        answer=answer,
        mix=mix_rows(doc),
        answer_loads=sorted({r["load"] for r in answer}),
        ci_level=ci_level(doc.slo),
        ci_name=ci_name(doc.slo),
        simulated_interval=SIMULATED_INTERVAL,
        sections=category_sections(doc),
        race=summary.get("race"),
        snippets=snippets,
        solo_load=doc.solo_load,
        category_figures=[f"plot-%s-{suffix}" for suffix, _ in CATEGORY_FIGURES],
        schedules=doc.schedules,
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
        plots={**figure_divs(summary), **category_figure_divs(doc), **experiment_figure_divs(summary)},
        experiments=summary.get("experiments", {}),
        plotly_js=get_plotlyjs(),
    )


def build_report(
    run_dir: str | Path, slo: SLO | str | Path | None = None, n_resamples: int = 1000, seed: int = 0,
    simulate_loads: Sequence[int] | None = None,
) -> tuple[dict[str, Any], Path]:
    """Rebuild ``summary.json``, ``cost_model.json`` and ``report.html`` in ``run_dir`` from its traces
    (:func:`specledger.report.summary.summarize_run`; ``simulate_loads``: as there, None = the run's own);
    returns (summary, html path)."""
    run = RunDir(run_dir)
    summary, cost = summarize_run(run, slo if isinstance(slo, SLO) else load_slo(slo), n_resamples, seed,
                                  simulate_loads=simulate_loads)
    run.write(SUMMARY_NAME, summary)  # first: a report that cannot be drawn loses no figure
    if cost is not None:
        cost.save(run.file(COST_MODEL_JSON))
    html = render_html(summary, title=str(summary["meta"].get("name") or run.name))
    return summary, run.write_text(HTML_NAME, html)


__all__ = ["build_report", "render_html"]
