"""The cell timeline as a bqplot figure, for kernels where widgets render.

The static SVG in the report (:mod:`jupyter_gpumem.report.svg`) draws the same chart with the
same colours; this module adds only what bqplot needs. bqplot draws its own legend inside the
plot area, over the curves, and in the marks' opacity (the phase bands' faded); so the figure's
legend is HTML under it instead, in the theme's text colour with solid swatches.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
from bqplot import Axis, Figure, Label, LinearScale, Lines, Scatter

from jupyter_gpumem.analysis.timeline import PhaseBand, Timeline
from jupyter_gpumem.report.svg import (
    BAND_OPACITY,
    FIGURE_HEADROOM,
    LEADER_TOP,
    LEGEND_TEXT,
    PHASE_COLORS,
    SERIES_COLORS,
    _align,
    _by_phase,
    _end_s,
    _peak_text,
    _series,
    _top_bytes,
    _unit,
)

__all__ = ["TimelineFigure", "legend_html", "timeline_figure"]

MARGIN_LEFT = 56  # px: the y axis and its label; the HTML legend starts where the plot does


# -- bqplot -------------------------------------------------------------------------------
def _band_outline(bands: Sequence[PhaseBand], top: float) -> tuple[list[float], list[float]]:
    """One line that rises to ``top`` over each band and rests at 0 between them."""
    x: list[float] = []
    y: list[float] = []
    for band in bands:
        x += [band.start_s, band.start_s, band.end_s, band.end_s]
        y += [0.0, top, top, 0.0]
    return x, y


def legend_html(series: Sequence[str], phases: Sequence[str]) -> str:
    """The figure's legend: a line per series (reserved dashed), a solid square per phase."""
    esc = html.escape
    item = '<span style="display:inline-block;margin:0 .9em .2em 0;white-space:nowrap">'
    swatch = "display:inline-block;margin-right:.35em;vertical-align:"
    items = [
        f'{item}<span style="{swatch}.25em;width:1.4em;border-top:2px '
        f'{"dashed" if s == "reserved" else "solid"} {SERIES_COLORS[s]}"></span>{esc(s)}</span>'
        for s in series
    ]
    items += [
        f'{item}<span style="{swatch}-.05em;width:.8em;height:.8em;'
        f'background:{PHASE_COLORS[p]}"></span>{esc(p)}</span>'
        for p in phases
    ]
    return (
        f'<div class="jp-gpumem-legend" style="color:{LEGEND_TEXT};'
        f'font-size:var(--jp-ui-font-size1,13px);padding-left:{MARGIN_LEFT}px">{"".join(items)}</div>'
    )


class TimelineFigure(Figure):
    """The timeline's bqplot Figure, displayed with its HTML legend under it.

    ``legend`` is the legend's widget and ``widget`` the two in a VBox, which is what
    ``display(figure)`` shows; place ``widget`` (not the figure) inside other layouts.
    """

    def __init__(self, *, legend: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.legend = widgets.HTML(legend)
        self.widget = widgets.VBox([self, self.legend], layout=widgets.Layout(width="100%"))

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


def timeline_figure(tl: Timeline, *, title: str = "") -> TimelineFigure:
    """Allocated and reserved memory over the cell, phase bands and the peak, as bqplot."""
    unit, scale = _unit(_top_bytes(tl))
    top = _top_bytes(tl) * FIGURE_HEADROOM / scale or 1.0
    xs = LinearScale(min=0.0, max=_end_s(tl) or 1.0)
    ys = LinearScale(min=0.0, max=top)
    scales = {"x": xs, "y": ys}
    marks: list[object] = []
    phases = _by_phase(tl.bands)
    for phase, bands in phases.items():
        x, y = _band_outline(bands, top)
        color = PHASE_COLORS[phase]
        marks.append(
            Lines(
                x=x,
                y=y,
                scales=scales,
                colors=[color],
                fill="bottom",
                fill_colors=[color],
                fill_opacities=[BAND_OPACITY],
                opacities=[0.5],
                stroke_width=1,
                labels=[phase],
            )
        )
    t = list(tl.t_s)
    drawn = _series(tl)
    for series, values in drawn:
        style = "dashed" if series == "reserved" else "solid"
        marks.append(
            Lines(
                x=t,
                y=[v / scale for v in values],
                scales=scales,
                colors=[SERIES_COLORS[series]],
                line_style=style,
                stroke_width=2,
                labels=[series],
            )
        )
    if t:
        peak = tl.peak_bytes / scale
        color = SERIES_COLORS["peak"]
        marks.append(
            Lines(
                x=[tl.peak_t_s, tl.peak_t_s],
                y=[peak, LEADER_TOP * top],
                scales=scales,
                colors=[color],
                line_style="dotted",
                stroke_width=1,
                labels=["peak"],
            )
        )
        marks.append(
            Scatter(
                x=[tl.peak_t_s],
                y=[peak],
                scales=scales,
                colors=[color],
                default_size=48,
            )
        )
        marks.append(
            Label(
                x=[tl.peak_t_s],
                y=[top],
                scales=scales,
                text=[_peak_text(tl)],
                colors=[color],
                default_size=12,
                y_offset=13,  # its baseline just under the top edge, above every curve
                align=_align(tl.peak_t_s / (_end_s(tl) or 1.0)),
            )
        )
    axes = [
        Axis(scale=xs, side="bottom", label="time (s)", tick_format=".3~g", num_ticks=6),
        Axis(scale=ys, side="left", label=f"memory ({unit})", tick_format=".3~g"),
    ]
    shown = dict(drawn)
    return TimelineFigure(
        legend=legend_html([s for s in ("allocated", "reserved") if s in shown], list(phases)),
        marks=marks,
        axes=axes,
        title=title,
        animation_duration=0,
        fig_margin={"top": 24 if title else 10, "bottom": 40, "left": MARGIN_LEFT, "right": 12},
        layout=widgets.Layout(height="220px", width="100%"),
    )
