"""plotly.js figure JSON as types: the keys :mod:`specledger.report.category_plots` and
:mod:`specledger.report.simulate_plots` set (plotly.js reads many more; a figure is handed to ``Plotly.newPlot``
as it is). Every type is a ``total=False`` TypedDict: plotly.js takes its default for a key left out."""

from __future__ import annotations

from typing import TypedDict

#: an axis value: a number (γ, load), or a category's name (a setting on a bar axis)
AxisValue = float | str | None


class Font(TypedDict, total=False):
    """A text's font."""

    size: int  # px
    color: str  # CSS colour
    family: str  # CSS font stack


class Title(TypedDict, total=False):
    """A figure's or an axis's title."""

    text: str
    font: Font
    standoff: int  # px between an axis title and its tick labels
    x: float  # paper coordinates
    xanchor: str
    y: float
    yanchor: str


class Line(TypedDict, total=False):
    """A trace's or a shape's line."""

    color: str | None  # CSS colour (None: plotly's own)
    dash: str  # "solid", "dash", "dot"
    width: float  # px


class Marker(TypedDict, total=False):
    """A trace's markers."""

    color: str
    symbol: str | list[str]  # one for all points, or one per point ("circle", "square-open", ...)
    size: int  # px
    line: Line  # the marker's outline


class ErrorBars(TypedDict, total=False):
    """Asymmetric error bars: ``array`` above each point, ``arrayminus`` below (data units)."""

    type: str  # "data": the arrays are distances in data units
    symmetric: bool
    thickness: float  # px
    width: float  # px, the caps
    array: list[float]
    arrayminus: list[float]


class Trace(TypedDict, total=False):
    """One series: a line of points, markers or bars."""

    type: str  # "scatter" or "bar"
    x: list[AxisValue]
    y: list[float | None]
    mode: str  # "lines", "markers", "lines+markers"
    name: str  # the legend's entry
    legendgroup: str  # traces toggled together from the legend
    showlegend: bool
    line: Line
    marker: Marker
    error_y: ErrorBars
    customdata: list[str | int | None]  # per point, what the hover template shows as %{customdata}
    hovertemplate: str


class Axis(TypedDict, total=False):
    """An axis."""

    title: Title
    type: str  # "linear" (default) or "log"
    dtick: float  # step between ticks
    tickvals: list[float]
    ticktext: list[str]
    range: list[float]
    gridcolor: str
    linecolor: str
    showline: bool
    zeroline: bool
    automargin: bool


class Shape(TypedDict, total=False):
    """A line or a band drawn over the plot (``xref``/``yref``: "x"/"y" data, "paper" the plot's [0, 1])."""

    type: str  # "line" or "rect"
    xref: str
    x0: float
    x1: float
    yref: str
    y0: float
    y1: float
    line: Line
    fillcolor: str
    opacity: float
    layer: str  # "below": under the traces


class Annotation(TypedDict, total=False):
    """A text placed on the plot (on a log axis, ``x`` is the value's log10)."""

    text: str
    xref: str
    x: float
    xanchor: str
    yref: str
    y: float
    yanchor: str
    showarrow: bool
    font: Font


class Margin(TypedDict, total=False):
    """The plot's margins (px)."""

    l: int  # noqa: E741  (plotly.js's own key)
    r: int
    t: int
    b: int


class Legend(TypedDict, total=False):
    """Where the legend sits and how it reads."""

    font: Font
    orientation: str  # "h": one row under the plot
    x: float
    xanchor: str
    y: float
    yanchor: str
    traceorder: str


class HoverLabel(TypedDict, total=False):
    """The hover box."""

    font: Font


class Layout(TypedDict, total=False):
    """A figure's layout."""

    template: str  # plotly's named theme (plotly.py figures)
    paper_bgcolor: str
    plot_bgcolor: str
    height: int  # px
    margin: Margin
    title: Title
    legend: Legend
    font: Font
    hoverlabel: HoverLabel
    hovermode: str
    xaxis: Axis
    yaxis: Axis
    shapes: list[Shape]
    annotations: list[Annotation]
    barmode: str  # "stack": bars of one x on top of each other


class Figure(TypedDict):
    """A plotly.js figure: what ``Plotly.newPlot(div, data, layout)`` draws."""

    data: list[Trace]
    layout: Layout


class Config(TypedDict, total=False):
    """``Plotly.newPlot``'s config: the page's controls around a figure."""

    displaylogo: bool
    responsive: bool
    displayModeBar: bool


__all__ = ["Annotation", "Axis", "AxisValue", "Config", "ErrorBars", "Figure", "Font", "HoverLabel", "Layout",
           "Legend", "Line", "Margin", "Marker", "Shape", "Title", "Trace"]
