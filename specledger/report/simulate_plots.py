"""Figures of ``simulate.json`` (``specledger simulate --out RUN_DIR``): simulated curves, labelled as such."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from specledger.report.plotly_json import Layout

LAYOUT: Layout = {"template": "plotly_white", "height": 380, "margin": {"l": 60, "r": 20, "t": 50, "b": 50}}


def _load_key(points: list[dict]) -> str | None:
    for key in ("concurrency", "rate"):
        if any(key in p for p in points):
            return key
    return None


def _curves(sim: dict, value: Any, title: str, y_title: str, unity: bool = False) -> go.Figure | None:
    points = sim.get("points") or []
    key = _load_key(points)
    if key is None:
        return None
    fig = go.Figure()
    for setting in dict.fromkeys(p["setting"] for p in points):
        pts = sorted((p for p in points if p["setting"] == setting and key in p), key=lambda p: p[key])
        fig.add_trace(go.Scatter(x=[p[key] for p in pts], y=[value(p) for p in pts], mode="lines+markers",
                                 name=setting, line={"dash": "dash" if setting == "plain" else "solid"}))
    if unity:
        fig.add_hline(y=1.0, line_dash="dash", line_color="grey", annotation_text="plain")
    fig.update_layout(title=f"{title} (simulated)", xaxis_title=key, yaxis_title=y_title, **LAYOUT)
    if key == "concurrency":
        fig.update_xaxes(type="log")
    return fig


def simulate_throughput(sim: dict) -> go.Figure | None:
    return _curves(sim, lambda p: p["throughput_tok_s"], "Throughput vs load", "tokens/s")


def simulate_speedup(sim: dict) -> go.Figure | None:
    return _curves(sim, lambda p: p.get("speedup"), "Speed-up over plain at the same load", "× plain", unity=True)


def simulate_tails(sim: dict) -> go.Figure | None:
    return _curves(sim, lambda p: p.get("itl_p99_ms"), "Chunk ITL P99 vs load", "ms")


def simulate_crossover_map(sim: dict) -> go.Figure | None:
    """Heatmap over context x concurrency of the best setting's speed-up (1 where plain is best)."""
    cells = sim.get("crossover_map") or []
    if not cells:
        return None
    ctxs = sorted({c["context"] for c in cells})
    concs = sorted({c["concurrency"] for c in cells})
    by = {(c["context"], c["concurrency"]): c for c in cells}
    z, text = [], []
    for ctx in ctxs:
        row, labels = [], []
        for c in concs:
            cell = by.get((ctx, c))
            best = cell["best"] if cell else None
            row.append(max(cell["speedup"].values(), default=1.0) if cell and best != "plain" else 1.0)
            labels.append(f"γ={best}" if best not in (None, "plain") else "plain")
        z.append(row)
        text.append(labels)
    fig = go.Figure(go.Heatmap(z=z, x=[str(c) for c in concs], y=[str(x) for x in ctxs], text=text,
                               texttemplate="%{text}<br>%{z:.2f}×", colorscale="RdYlGn", zmid=1.0,
                               colorbar={"title": "best speed-up"}))
    fig.update_layout(title="Crossover map: best setting over context × concurrency (simulated)",
                      xaxis_title="concurrency", yaxis_title="context (tokens)", **LAYOUT)
    return fig


def simulate_capacity(sim: dict) -> go.Figure | None:
    rows = sim.get("capacity_plan") or []
    if not rows:
        return None
    fig = go.Figure()
    for setting in dict.fromkeys(r["setting"] for r in rows):
        rs = [r for r in rows if r["setting"] == setting]
        fig.add_trace(go.Bar(x=[str(r["rate"]) for r in rs], y=[r["replicas"] for r in rs], name=setting))
    fig.update_layout(title=f"Replicas needed ({rows[0]['slo']}; simulated)", xaxis_title="request rate (req/s)",
                      yaxis_title="replicas", barmode="group", **LAYOUT)
    return fig


SIMULATE_FIGURES = {
    "plot-simulate-throughput": ("simulate", simulate_throughput),
    "plot-simulate-speedup": ("simulate", simulate_speedup),
    "plot-simulate-itl": ("simulate", simulate_tails),
    "plot-simulate-crossover-map": ("simulate", simulate_crossover_map),
    "plot-simulate-capacity": ("simulate", simulate_capacity),
}
