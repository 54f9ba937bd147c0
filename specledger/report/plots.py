"""Plotly figures of the report, built from the machine-readable summary only (so the HTML shows
exactly what summary.json holds). Each function returns a ``plotly.graph_objects.Figure``: the run-wide
figures (in the report's collapsed details) and the side experiments'; each category's own small figures are
:mod:`specledger.report.category_plots`."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specledger.engine.drafters.catalog import PLAIN
from specledger.records import setting_label
from specledger.report.simulate_plots import SIMULATE_FIGURES

LAYOUT = {
    "template": "plotly_white",
    "height": 420,
    "margin": {"l": 60, "r": 20, "t": 50, "b": 60},
    "legend": {"font": {"size": 10}},
}


def predicted_vs_measured(summary: dict) -> go.Figure:
    """Measured S against the round ledger's T0·E[L]/E[T_round] per setting (the reconciliation's decomposition,
    not a forecast: the forecast model's figures are the S-vs-γ curves and the self-check)."""
    pts = [
        s
        for s in summary["scenarios"]
        if s.get("reconciliation")
        and s["reconciliation"]["predicted_speedup"] is not None
        and s["speedup"] is not None
    ]
    xs = [s["reconciliation"]["predicted_speedup"] for s in pts]
    ys = [s["speedup"] for s in pts]
    fig = go.Figure(
        go.Scatter(
            x=xs,
            y=ys,
            mode="markers",
            text=[s["label"] for s in pts],
            name="scenarios",
            hovertemplate="%{text}<br>round ledger %{x:.3f}<br>measured %{y:.3f}<extra></extra>",
        )
    )
    if xs:
        lo, hi = min(xs + ys) * 0.95, max(xs + ys) * 1.05
        fig.add_trace(
            go.Scatter(
                x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dash", "color": "grey"}, name="y = x"
            )
        )
    fig.update_layout(
        title="Measured S vs the round ledger's T0·E[L]/E[T_round] (full rounds; not the forecast model)",
        xaxis_title="round-ledger S (measured E[L] and round time)",
        yaxis_title="measured S",
        **LAYOUT,
    )
    return fig


def latency_ecdf(summary: dict) -> go.Figure:
    metrics = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl_chunk", "ITL (chunk)"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[m[1] for m in metrics])
    rows = [*summary["baselines"], *summary["scenarios"]]
    for i, row in enumerate(rows):
        for col, (key, _) in enumerate(metrics, 1):
            qs = row["latency"]["ecdf_ms"][key]
            if not qs:
                continue
            probs = [j / (len(qs) - 1) for j in range(len(qs))] if len(qs) > 1 else [1.0]
            fig.add_trace(
                go.Scatter(
                    x=qs,
                    y=probs,
                    mode="lines",
                    name=row["label"],
                    legendgroup=row["label"],
                    showlegend=col == 1,
                    line={"color": _colour(i)},
                ),
                row=1,
                col=col,
            )
    for col in (1, 2, 3):
        fig.update_xaxes(title_text="ms", type="log", row=1, col=col)
    fig.update_yaxes(title_text="fraction ≤ x", row=1, col=1)
    fig.update_layout(title="Latency distributions (ECDF)", **{**LAYOUT, "height": 460})
    return fig


def cost_fit(summary: dict) -> go.Figure:
    """Measured mean T_verify per candidate count n vs the run's cost model at that group's mean context."""
    fig = go.Figure()
    for i, (drafter, pts) in enumerate(summary.get("cost_points", {}).items()):
        model = summary["cost_models"].get(drafter)
        ns = [p["n"] for p in pts]
        fig.add_trace(go.Scatter(x=ns, y=[p["t_verify_ms"] for p in pts], mode="markers",
                                 name=f"{drafter} measured", marker={"color": _colour(i)}))
        if model:
            fig.add_trace(go.Scatter(x=ns, y=[p["fit_verify_ms"] for p in pts], mode="lines",
                                     name=f"{drafter} cost model (R²={_fmt(model['verify']['r2'])})",
                                     line={"color": _colour(i), "dash": "dash"}))
    fig.update_layout(
        title="T_verify vs candidates n: measured means and fitted model (at mean context)",
        xaxis_title="candidates verified n",
        yaxis_title="ms",
        **LAYOUT,
    )
    return fig


_PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]


def _colour(i: int) -> str:
    return _PALETTE[i % len(_PALETTE)]


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


#: the run-wide figures (in the report's collapsed details); the per-category ones: :func:`category_figure_divs`
FIGURES = {
    "plot-predicted-vs-measured": predicted_vs_measured,
    "plot-latency": latency_ecdf,
    "plot-cost-fit": cost_fit,
}


def tree_heatmap(group: dict) -> go.Figure:
    """S over depth (γ) x node budget for one (category, temperature, drafter); budget 0 = the chain."""
    depths = sorted({r["depth"] for r in group["grid"]})
    budgets = sorted({r["tree_budget"] for r in group["grid"]})
    z = [[next((r["speedup"] for r in group["grid"] if r["depth"] == d and r["tree_budget"] == b), None)
          for b in budgets] for d in depths]
    text = [[("" if v is None else f"{v:.2f}") for v in row] for row in z]
    fig = go.Figure(go.Heatmap(z=z, x=[("chain" if b == 0 else f"{b} nodes") for b in budgets],
                               y=[f"depth {d}" for d in depths], text=text, texttemplate="%{text}",
                               colorscale="RdYlGn", zmid=1.0, colorbar={"title": "S"}))
    fig.update_layout(title=f"S over depth × width: {group['category']} T={group['temperature']:g} {group['drafter']}",
                      xaxis_title="node budget per round (width = nodes / depth)", yaxis_title="max depth (γ)",
                      **LAYOUT)
    return fig


def figure_divs(summary: dict) -> dict[str, str]:
    """HTML ``<div>`` (+ its inline newPlot script) per figure id; no plotly.js included."""
    config = {"displaylogo": False, "responsive": True}
    out = {
        div_id: build(summary).to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=config)
        for div_id, build in FIGURES.items()
    }
    for i, group in enumerate(summary.get("trees") or []):
        div_id = f"plot-tree-{i}"
        out[div_id] = tree_heatmap(group).to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                                                  config=config)
    return out


# ----------------------------------------------------------------------------- side experiments (sweep)
def _ci_arrays(rows: list[dict]) -> tuple[list[float], list[float]]:
    """Asymmetric error-bar lengths (above, below) from ``speedup_ci``; 0 where a bound is missing."""
    hi = [r["speedup_ci"][1] - r["speedup"] if r["speedup_ci"][1] is not None else 0 for r in rows]
    lo = [r["speedup"] - r["speedup_ci"][0] if r["speedup_ci"][0] is not None else 0 for r in rows]
    return hi, lo


def policy_speedups(policies: dict) -> go.Figure:
    """Speed-up vs plain with its 95% prompt-bootstrap CI (a side experiment, no decision) per static γ and per
    dynamic policy (one bar each)."""
    fig = go.Figure()
    for i, kind in enumerate(("static", "policy")):
        rows = [r for r in policies["settings"] if r["kind"] == kind and r["speedup"] is not None]
        if not rows:
            continue
        hi, lo = _ci_arrays(rows)
        fig.add_trace(
            go.Bar(
                x=[r["setting"] for r in rows],
                y=[r["speedup"] for r in rows],
                name="static γ" if kind == "static" else "dynamic policy",
                marker_color=_colour(i),
                error_y={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
                customdata=[r["mean_gamma"] for r in rows],
                hovertemplate="%{x}: S=%{y:.3f}, mean γ %{customdata:.2f}<extra></extra>",
            )
        )
    fig.add_hline(y=1.0, line_dash="dash", line_color="grey", annotation_text="plain")
    fig.update_layout(
        title=f"Speed-up vs plain per speculation-length policy ({policies.get('drafter', '')}; 95% bootstrap CI)",
        yaxis_title="speed-up vs plain",
        **LAYOUT,
    )
    return fig


def quantization_speedups(quant: dict) -> go.Figure:
    """Measured speed-ups of the four settings vs fp32 plain, and the product of the two singles."""
    rows = [r for r in quant["settings"] if r["speedup"] is not None]
    hi, lo = _ci_arrays(rows)
    fig = go.Figure(
        go.Bar(
            x=[r["setting"] for r in rows],
            y=[r["speedup"] for r in rows],
            name="measured",
            marker_color=_colour(0),
            error_y={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
        )
    )
    combined_key = f"{quant.get('quant_target', 'int8')}-spec"
    combined = next((r["setting"] for r in rows if r["key"] == combined_key), None)
    product = quant.get("four_way", {}).get("product_of_single_speedups")
    if combined is not None and product is not None:
        fig.add_trace(
            go.Scatter(
                x=[combined],
                y=[product],
                mode="markers",
                marker={"symbol": "line-ew-open", "size": 40, "color": "black"},
                name="product of single speed-ups (reference)",
            )
        )
    fig.add_hline(y=1.0, line_dash="dash", line_color="grey", annotation_text="fp32 plain")
    fig.update_layout(title="Quantization four-way: speed-up vs fp32 plain (95% bootstrap CI)",
                      yaxis_title="speed-up", **LAYOUT)
    return fig


def _serving_label(p: dict) -> str:
    name = p.get("setting") or setting_label(p["drafter"], p["gamma"])
    return f"{name} · {p['source']} c={p['concurrency']}" if p.get("source") else name


def _serving_curves(points: list[dict]) -> dict[str, list[dict]]:
    """Points grouped by setting ("plain", "ngram γ=4", ...), plain first, each sorted by load."""
    out: dict[str, list[dict]] = {}
    for p in sorted(points, key=lambda p: (p["drafter"] != PLAIN.name, p["load"])):
        out.setdefault(_serving_label(p), []).append(p)
    return out


def _ci_bars(pts: list[dict], value: Any) -> dict | None:
    """Asymmetric error bars from each point's ``speedup_ci`` (None when no point has one)."""
    if not any(p.get("speedup_ci") for p in pts):
        return None
    ys = [value(p) for p in pts]
    return {"type": "data", "symmetric": False,
            "array": [(p["speedup_ci"][1] - y) if p.get("speedup_ci") and y is not None else 0
                      for p, y in zip(pts, ys)],
            "arrayminus": [(y - p["speedup_ci"][0]) if p.get("speedup_ci") and y is not None else 0
                           for p, y in zip(pts, ys)]}


def _serving_vs_load(points: list[dict], value: Any, title: str, x_title: str, y_title: str,
                     plain: bool = True, unity: bool = False, log_x: bool = True, ci: bool = False
                     ) -> go.Figure | None:
    """One line per setting of ``value(point)`` against the load (``ci``: with the speed-up's 95%
    interval as error bars); None when there are no points."""
    if not points:
        return None
    fig = go.Figure()
    for i, (name, pts) in enumerate(_serving_curves(points).items()):
        if name.split(" · ")[0] == "plain" and not plain:
            continue
        fig.add_trace(
            go.Scatter(
                x=[p["load"] for p in pts],
                y=[value(p) for p in pts],
                mode="lines+markers",
                name=name,
                line={"color": _colour(i), "dash": "dash" if name == "plain" else "solid"},
                error_y=_ci_bars(pts, value) if ci else None,
            )
        )
    if unity:
        fig.add_hline(y=1.0, line_dash="dash", line_color="grey", annotation_text="plain")
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, **LAYOUT)
    if log_x:
        fig.update_xaxes(type="log")
    return fig


def _p(key: str, q: str) -> Any:
    return lambda p: (p.get(key) or {}).get(q)


def serving_throughput(serving: dict) -> go.Figure | None:
    return _serving_vs_load(serving.get("concurrency", []), lambda p: p["throughput_tok_s"],
                            "Throughput vs concurrency (output tokens/s of successful requests)",
                            "concurrency (requests in flight)", "tokens/s")


def serving_speedup(serving: dict) -> go.Figure | None:
    return _serving_vs_load(serving.get("concurrency", []), lambda p: p["speedup"],
                            "Speed-up vs plain at the same concurrency (below the dashed line: speculation costs)",
                            "concurrency (requests in flight)", "throughput ÷ plain's", plain=False, unity=True,
                            ci=True)


def serving_tpot(serving: dict) -> go.Figure | None:
    return _serving_vs_load(serving.get("concurrency", []), _p("tpot_ms", "p50"),
                            "TPOT P50 vs concurrency", "concurrency (requests in flight)", "ms per output token")


def serving_chunk_itl(serving: dict) -> go.Figure | None:
    return _serving_vs_load(serving.get("concurrency", []), _p("itl_chunk_ms", "p99"),
                            "Chunk-level ITL P99 vs concurrency (the gap a streaming client sees)",
                            "concurrency (requests in flight)", "ms between chunks")


def serving_context(serving: dict) -> go.Figure | None:
    return _serving_vs_load(serving.get("context", []), lambda p: p["speedup"],
                            "Speed-up vs context length (per long-input source and concurrency)",
                            "context length (tokens)", "throughput ÷ plain's", plain=False, unity=True, ci=True)


def serving_rate(serving: dict) -> go.Figure | None:
    return _serving_vs_load(serving.get("rate", []), lambda p: p["speedup"],
                            "Speed-up vs Poisson arrival rate", "arrival rate (requests/s)",
                            "throughput ÷ plain's", plain=False, unity=True)


EXPERIMENT_FIGURES = {
    "plot-quantization": ("quantization", quantization_speedups),
    "plot-policies": ("policies", policy_speedups),
    "plot-serving-throughput": ("serving", serving_throughput),
    "plot-serving-speedup": ("serving", serving_speedup),
    "plot-serving-tpot": ("serving", serving_tpot),
    "plot-serving-itl": ("serving", serving_chunk_itl),
    "plot-serving-context": ("serving", serving_context),
    "plot-serving-rate": ("serving", serving_rate),
    **SIMULATE_FIGURES,
}


def experiment_figure_divs(summary: dict) -> dict[str, str]:
    """Figures of the side experiments present in ``summary["experiments"]`` (none when absent, and
    none for a builder that has no data, e.g. the context curve of a sweep without --contexts)."""
    config = {"displaylogo": False, "responsive": True}
    experiments = summary.get("experiments") or {}
    divs = {}
    for div_id, (name, build) in EXPERIMENT_FIGURES.items():
        fig = build(experiments[name]) if name in experiments else None
        if fig is not None:
            divs[div_id] = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=config)
    return divs
