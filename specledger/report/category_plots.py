"""The small figures of one category's section: a handful of series each, from ``summary.json`` only.

- S vs γ: one line per drafter (measured, with the decisions' interval over its n prompts as bars: the same
  figure the verdicts and tables show), dotted the forecast model's curve (in sample; the self-check holds each γ
  out of the same model);
- S vs load (the crossover): one line per setting, solid over measured loads, dashed with open markers
  over simulated ones, the S = 1 line marking where speculation stops paying, and each change of the decision
  marked: a band over the measured loads around it, a dotted line where the engine configs switch;
- E[L] vs γ: one line per drafter;
- the round-time split: per setting the mean full-round time as draft + verify + other, its break-even
  budget T0·E[L] as a tick (a bar above its tick is a slow-down);
- conditional acceptance a_j by position: one line per setting.

Colours follow the drafter (the same drafter has the same colour in every section). The figures are plain
plotly.js JSON (``{"data": [...], "layout": {...}}``), not ``plotly.graph_objects``: validating and
templating a graph object costs ~40–80 ms a figure, and a run has five per category.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from specledger.engine.drafters.catalog import is_plain
from specledger.records import setting_label
from specledger.report.plotly_json import (
    Annotation,
    Axis,
    Config,
    ErrorBars,
    Figure,
    Layout,
    Shape,
    Trace,
)
from specledger.report.summary_model import Summary
from specledger.report.summary_rows import Interval, SettingRow
from specledger.report.view import CrossoverPoint, crossover_points, slug

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
PLAIN = "#7f7f7f"
#: marker symbols by the setting's rank of γ within its drafter (γ=2 circle, γ=4 square, ...)
SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "star"]

_AXIS: Axis = {"gridcolor": "#ebebeb", "linecolor": "#aaaaaa", "showline": True, "zeroline": False,
                         "automargin": True, "title": {"font": {"size": 11}, "standoff": 6}}
SMALL: Layout = {
    "paper_bgcolor": "white",
    "plot_bgcolor": "white",
    "height": 330,
    "margin": {"l": 50, "r": 12, "t": 32, "b": 10},
    "title": {"font": {"size": 13}, "x": 0.01, "xanchor": "left", "y": 0.985, "yanchor": "top"},
    "legend": {"font": {"size": 10}, "orientation": "h", "yanchor": "top", "y": -0.22, "x": 0, "xanchor": "left",
               "traceorder": "normal"},
    "font": {"size": 11, "family": "-apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif", "color": "#333"},
    "hoverlabel": {"font": {"size": 11}},
    "hovermode": "closest",
}
CONFIG: Config = {"displaylogo": False, "responsive": True, "displayModeBar": False}


def drafter_colours(summary: Summary) -> dict[str, str]:
    """Drafter -> colour, in the order drafters first appear among the run's scenarios."""
    names = dict.fromkeys(s.drafter for s in summary.scenarios)
    names.update(dict.fromkeys(s.drafter for s in summary.load_scenarios))
    return {d: PALETTE[i % len(PALETTE)] for i, d in enumerate(names)}


def _figure(data: list[Trace], title: str, x_title: str, y_title: str, xaxis: Axis | None = None,
            yaxis: Axis | None = None, shapes: Sequence[Shape] = (), annotations: Sequence[Annotation] = (),
            barmode: str | None = None) -> Figure:
    layout: Layout = {**SMALL, "title": {**SMALL["title"], "text": title},
                      "xaxis": {**_AXIS, "title": {**_AXIS["title"], "text": x_title}, **(xaxis or {})},
                      "yaxis": {**_AXIS, "title": {**_AXIS["title"], "text": y_title}, **(yaxis or {})},
                      "shapes": list(shapes), "annotations": list(annotations)}
    if barmode is not None:
        layout["barmode"] = barmode
    return {"data": data, "layout": layout}


def _unity(right: bool = True) -> tuple[Shape, Annotation]:
    """The S = 1 line (plain decoding's speed) and its label."""
    line: Shape = {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": 1, "y1": 1,
                   "line": {"dash": "dash", "color": PLAIN, "width": 1}}
    label: Annotation = {"xref": "paper", "x": 1 if right else 0, "xanchor": "right" if right else "left",
                         "yref": "y", "y": 1, "yanchor": "top", "text": "S = 1 (plain)", "showarrow": False,
                         "font": {"size": 10, "color": PLAIN}}
    return line, label


def _chains(summary: Summary, key: tuple[str, float]) -> dict[str, list[SettingRow]]:
    """Drafter -> its solo chain scenarios of ``key`` (integer γ, no tree), sorted by γ."""
    out: dict[str, list[SettingRow]] = {}
    for s in summary.scenarios:
        g = s.gamma
        if s.key == key and isinstance(g, int) and not isinstance(g, bool) and not s.tree_budget:
            out.setdefault(s.drafter, []).append(s)
    return {d: sorted(v, key=lambda s: int(s.gamma)) for d, v in out.items()}


def _error_bars(cis: Sequence[Interval], y: Sequence[float]) -> ErrorBars:
    """Asymmetric error bars from each point's interval (0 where a bound is missing)."""
    return {"type": "data", "symmetric": False, "thickness": 1, "width": 3,
            "array": [(c[1] - v) if c[1] is not None else 0 for c, v in zip(cis, y)],
            "arrayminus": [(v - c[0]) if c[0] is not None else 0 for c, v in zip(cis, y)]}


def _interval_hover(cis: Sequence[Interval], ns: Sequence[int | None]) -> list[str | int | None]:
    """Per point, what the hover says of its interval and its n prompts: "[1.30–2.24], n = 8 prompts" ("no
    interval" where it is unbounded), so a point without a bar is never read as an exact one."""
    out: list[str | int | None] = []
    for (lo, hi), n in zip(cis, ns):
        iv = f"[{lo:.2f}–{hi:.2f}]" if lo is not None and hi is not None else "no interval"
        out.append(f"{iv}, n = {n} prompts" if n else iv)
    return out


def speedup_vs_gamma(summary: Summary, key: tuple[str, float], colours: dict[str, str]) -> Figure | None:
    """Measured S per γ, one line per drafter with the decisions' interval (``customdata``: the interval and its n
    of prompts, as the hover says); dotted: the forecast model's S(γ), in sample on the prompts measured with plain,
    over the measured γ and two past them (and the predicted best γ)."""
    from specledger.report.view import ci_level

    chains = {d: [s for s in rows if s.speedup is not None] for d, rows in _chains(summary, key).items()}
    chains = {d: rows for d, rows in chains.items() if rows}
    if not chains:
        return None
    data: list[Trace] = []
    for drafter, rows in chains.items():
        y = [float(s.speedup or 0.0) for s in rows]
        cis = [s.speedup_ci for s in rows]
        data.append({"type": "scatter", "x": [s.gamma for s in rows], "y": list(y), "mode": "lines+markers",
                     "name": drafter, "legendgroup": drafter, "line": {"color": colours.get(drafter)},
                     "error_y": _error_bars(cis, y),
                     "customdata": _interval_hover(cis, [s.paired_prompts for s in rows]),
                     "hovertemplate": f"{drafter} γ=%{{x}}: S %{{y:.3f}} %{{customdata}}<extra></extra>"})
    for opt in summary.optimal_gamma:
        d = opt.drafter
        if (opt.category, float(opt.temperature)) != key or d not in chains or not opt.curve:
            continue
        best = opt.predicted_best_gamma
        top = max(max(int(s.gamma) for s in chains[d]) + 2, best if isinstance(best, int) else 0)
        curve = [p for p in opt.curve if p.speedup is not None and p.gamma <= top]
        on = f", {opt.prompts} prompts" if opt.prompts else ""
        data.append({"type": "scatter", "x": [p.gamma for p in curve], "y": [p.speedup for p in curve],
                     "mode": "lines", "line": {"dash": "dot", "color": colours.get(d), "width": 1},
                     "name": f"{d} forecast (in sample{on})", "legendgroup": d, "showlegend": False,
                     "hovertemplate": f"{d} forecast model, in sample{on}, γ=%{{x}}: S %{{y:.3f}}<extra></extra>"})
    line, label = _unity()
    level = ci_level(summary.slo)
    return _figure(data, f"S vs γ ({level} % CI over n prompts; dotted: forecast, in sample)", "γ", "speed-up S",
                   xaxis={"dtick": 1}, shapes=[line], annotations=[label])


def el_vs_gamma(summary: Summary, key: tuple[str, float], colours: dict[str, str]) -> Figure | None:
    """E[L], tokens committed per full round, per γ: one line per drafter."""
    chains = {d: [s for s in rows if s.rounds.el_full is not None] for d, rows in _chains(summary, key).items()}
    data: list[Trace] = [
        {"type": "scatter", "x": [s.gamma for s in rows], "y": [s.rounds.el_full for s in rows],
         "mode": "lines+markers", "name": drafter, "line": {"color": colours.get(drafter)},
         "hovertemplate": f"{drafter} γ=%{{x}}: E[L] %{{y:.2f}}<extra></extra>"}
        for drafter, rows in chains.items() if rows]
    return _figure(data, "E[L]: tokens per round vs γ", "γ", "E[L]", xaxis={"dtick": 1}) if data else None


def _setting_name(s: SettingRow) -> str:
    return setting_label(s.drafter, s.gamma)


def round_split(summary: Summary, key: tuple[str, float], colours: dict[str, str]) -> Figure | None:
    """Mean full-round time per setting, stacked draft / verify / other, and the tick T0·E[L] (plain: T0)."""
    rows = [b for b in summary.baselines if b.key == key]
    rows += [s for s in summary.scenarios if s.key == key and not s.tree_budget]
    rows = [r for r in rows if r.rounds.t_verify_ms is not None]
    if all(is_plain(r.drafter) for r in rows):
        return None
    names: list[str | float | None] = [_setting_name(r) for r in rows]
    times = {"draft": [r.rounds.t_draft_ms for r in rows], "verify": [r.rounds.t_verify_ms for r in rows],
             "other": [r.rounds.t_other_ms for r in rows]}
    data: list[Trace] = [
        {"type": "bar", "x": names, "y": [t or 0.0 for t in times[part]], "name": part,
         "marker": {"color": colour}, "hovertemplate": f"%{{x}}: {part} %{{y:.2f}} ms<extra></extra>"}
        for part, colour in (("draft", "#f4a261"), ("verify", "#457b9d"), ("other", "#a8dadc"))]
    budget: list[float | None] = []
    for r in rows:
        t0, el = r.t0_ms, r.rounds.el_full
        plain = is_plain(r.drafter)
        budget.append(t0 if plain else (t0 * el if t0 is not None and el is not None else None))
    data.append({"type": "scatter", "x": names, "y": budget, "mode": "markers", "name": "T0·E[L]",
                 "marker": {"symbol": "line-ew-open", "size": 22, "color": "black", "line": {"width": 2}},
                 "hovertemplate": "%{x}: break-even %{y:.2f} ms<extra></extra>"})
    return _figure(data, "Round time: draft / verify / other (tick: T0·E[L])", "", "ms per round", barmode="stack")


def acceptance(summary: Summary, key: tuple[str, float], colours: dict[str, str]) -> Figure | None:
    """Conditional acceptance a_j = Pr(K ≥ j | K ≥ j−1) per position, one line per setting."""
    data: list[Trace] = []
    for drafter, rows in _chains(summary, key).items():
        for i, s in enumerate(rows):
            chain = [c for c in s.rounds.conditional_acceptance if c.a is not None]
            if chain:
                data.append({"type": "scatter", "x": [c.position for c in chain], "y": [c.a for c in chain],
                             "mode": "lines+markers", "name": _setting_name(s), "line": {"color": colours.get(drafter)},
                             "marker": {"symbol": SYMBOLS[i % len(SYMBOLS)]},
                             "customdata": [c.at_risk for c in chain],
                             "hovertemplate": f"{_setting_name(s)} j=%{{x}}: a=%{{y:.3f}} (n=%{{customdata}})"
                                              "<extra></extra>"})
    if not data:
        return None
    return _figure(data, "Acceptance a_j by position", "position j", "a_j", yaxis={"range": [0, 1.05]},
                   xaxis={"dtick": 1})


def _load_traces(name: str, pts: Sequence[CrossoverPoint], symbol: str, colour: str | None) -> list[Trace]:
    """One setting's S over the loads: solid over the measured ones, dashed (open markers) over the simulated ones
    from the last measured point on."""
    real = [p for p in pts if not p["simulated"]]
    sim = [p for p in pts if p["simulated"]]
    out: list[Trace] = []
    for part, dash, show in ((real, "solid", True), ((real[-1:] + sim) if sim else [], "dash", not real)):
        if not part:
            continue
        y = [p["speedup"] for p in part]
        cis = [p["ci"] for p in part]
        out.append({
            "type": "scatter", "x": [p["load"] for p in part], "y": list(y), "mode": "lines+markers", "name": name,
            "legendgroup": name, "showlegend": show, "line": {"color": colour, "dash": dash},
            "marker": {"symbol": [f"{symbol}-open" if p["simulated"] else symbol for p in part], "size": 8},
            "error_y": _error_bars(cis, y),
            "customdata": [("simulated, the simulator's interval " if p["simulated"] else "measured ") + str(h)
                           for p, h in zip(part, _interval_hover(cis, [p["n"] for p in part]))],
            "hovertemplate": f"{name} at load %{{x}}: S %{{y:.3f}} (%{{customdata}})<extra></extra>"})
    return out


def crossover(summary: Summary, key: tuple[str, float], colours: dict[str, str]) -> Figure | None:
    """S vs load per setting: solid over measured loads, dashed (open markers) over simulated ones, the
    dashed part starting at the last measured point; None when the category was decided at one load only."""
    from specledger.report.view import ci_level

    curves = crossover_points(summary, key)
    loads = sorted({p["load"] for pts in curves.values() for p in pts})
    if len(loads) < 2:
        return None
    data: list[Trace] = []
    rank: dict[str, int] = {}
    for name, pts in curves.items():
        drafter = name.split(" γ=")[0]
        symbol = SYMBOLS[rank.setdefault(drafter, 0) % len(SYMBOLS)]
        rank[drafter] += 1
        data += _load_traces(name, pts, symbol, colours.get(drafter))
    line, label = _unity(right=False)
    shapes, notes = [line], [label]
    sim_loads = sorted({p["load"] for pts in curves.values() for p in pts if p["simulated"]})
    if sim_loads:  # the border halfway (on the log axis) between the last measured and first simulated load
        below = [x for x in loads if x < sim_loads[0]]
        at = math.sqrt(below[-1] * sim_loads[0]) if below else sim_loads[0]
        # on a log axis a shape takes the load itself, an annotation its log10
        shapes.append({"type": "line", "x0": at, "x1": at, "xref": "x", "y0": 0, "y1": 1, "yref": "paper",
                       "line": {"dash": "dot", "color": PLAIN, "width": 1}})
        notes.append({"x": math.log10(at), "xref": "x", "y": 1, "yref": "paper", "text": "simulated →",
                      "showarrow": False, "xanchor": "left", "yanchor": "top", "font": {"size": 10, "color": PLAIN}})
    marks, labels = crossover_marks(summary, key)
    level = ci_level(summary.slo)
    return _figure(data, f"S vs load ({level} % CI; dashed, open: simulated)", "load (concurrent requests)",
                   "speed-up S",
                   xaxis={"type": "log", "tickvals": list(loads), "ticktext": [str(x) for x in loads]},
                   shapes=shapes + marks, annotations=notes + labels)


def crossover_marks(summary: Summary, key: tuple[str, float]) -> tuple[list[Shape], list[Annotation]]:
    """(shapes, annotations) marking where the category's decision changes along the load
    (:func:`specledger.gates.schedule.switches`): a band over the bracket of measured loads around each change,
    labelled "crossover a–b" (or "... not located within 2×"), and a dotted line at the batch size where the
    engine configs switch (just above a)."""
    from specledger.gates.schedule import switches
    from specledger.load_bisect import is_located

    cells = sorted((v for v in summary.verdicts if v.key == key), key=lambda v: v.load_or_solo)
    shapes: list[Shape] = []
    notes: list[Annotation] = []
    for a, b in switches(cells):
        shapes.append({"type": "rect", "x0": a, "x1": b, "xref": "x", "y0": 0, "y1": 1, "yref": "paper",
                       "fillcolor": "#d62728", "opacity": 0.08, "line": {"width": 0}, "layer": "below"})
        shapes.append({"type": "line", "x0": a + 1, "x1": a + 1, "xref": "x", "y0": 0, "y1": 1, "yref": "paper",
                       "line": {"dash": "dot", "color": "#d62728", "width": 1}})
        text = f"crossover {a}–{b}" + ("" if is_located(a, b) else " (not located within 2×)")
        notes.append({"x": math.log10(math.sqrt(a * b)), "xref": "x", "y": 0, "yref": "paper", "text": text,
                      "showarrow": False, "xanchor": "center", "yanchor": "bottom",
                      "font": {"size": 10, "color": "#d62728"}})
    return shapes, notes


#: the section's figures, in the order shown: (id suffix, builder)
CATEGORY_FIGURES = (("speedup", speedup_vs_gamma), ("crossover", crossover), ("el", el_vs_gamma),
                    ("rounds", round_split), ("acceptance", acceptance))


def figure_html(div_id: str, fig: Figure, config: Config | None = None) -> str:
    """A ``<div>`` and the inline script that draws ``fig`` into it (plotly.js loaded once by the page);
    ``</`` is escaped so no string in the data can close the script."""
    parts: tuple[object, ...] = (fig["data"], fig["layout"], config or CONFIG)
    payload = ", ".join(json.dumps(x, ensure_ascii=False, allow_nan=False).replace("</", "<\\/") for x in parts)
    height = fig["layout"].get("height", 330)
    return (f'<div id="{div_id}" class="plotly-graph-div" style="height:{height}px; width:100%;"></div>\n'
            f'<script>if (window.Plotly) Plotly.newPlot("{div_id}", {payload});</script>')


def category_figures(summary: Summary) -> dict[str, Figure]:
    """``plot-<category>-T<t>-<figure>`` -> its figure JSON, for every (category, temperature) with a
    verdict and every figure that has data."""
    colours = drafter_colours(summary)
    out = {}
    for key in dict.fromkeys(v.key for v in summary.verdicts):
        for suffix, build in CATEGORY_FIGURES:
            fig = build(summary, key, colours)
            if fig is not None:
                out[f"plot-{slug(key)}-{suffix}"] = fig
    return out


def category_figure_divs(summary: Summary) -> dict[str, str]:
    """:func:`category_figures` as HTML (:func:`figure_html`)."""
    return {div_id: figure_html(div_id, fig) for div_id, fig in category_figures(summary).items()}


__all__ = ["CATEGORY_FIGURES", "acceptance", "category_figure_divs", "category_figures", "crossover",
           "crossover_marks", "el_vs_gamma", "figure_html", "round_split", "speedup_vs_gamma"]
