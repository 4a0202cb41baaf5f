"""The cell timeline as a bqplot figure, for kernels where widgets render.

The static SVG in the report (:mod:`jupyter_gpumem.timeline_svg`) draws the same chart with the
same colours; this module adds only what bqplot needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
from bqplot import Axis, Figure, Label, LinearScale, Lines, Scatter

from jupyter_gpumem.analysis.timeline import PhaseBand, Timeline
from jupyter_gpumem.timeline_svg import (
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

__all__ = ["timeline_figure"]


# -- bqplot -------------------------------------------------------------------------------
def _band_outline(bands: Sequence[PhaseBand], top: float) -> tuple[list[float], list[float]]:
    """One line that rises to ``top`` over each band and rests at 0 between them."""
    x: list[float] = []
    y: list[float] = []
    for band in bands:
        x += [band.start_s, band.start_s, band.end_s, band.end_s]
        y += [0.0, top, top, 0.0]
    return x, y


def timeline_figure(tl: Timeline, *, title: str = "") -> Figure:
    """Allocated and reserved memory over the cell, phase bands and the peak, as bqplot."""
    unit, scale = _unit(_top_bytes(tl))
    top = _top_bytes(tl) * FIGURE_HEADROOM / scale or 1.0
    xs = LinearScale(min=0.0, max=_end_s(tl) or 1.0)
    ys = LinearScale(min=0.0, max=top)
    scales = {"x": xs, "y": ys}
    marks: list[object] = []
    for phase, bands in _by_phase(tl.bands).items():
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
                display_legend=True,
            )
        )
    t = list(tl.t_s)
    for series, values in _series(tl):
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
                display_legend=True,
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
    return Figure(
        marks=marks,
        axes=axes,
        title=title,
        legend_location="top-left",
        legend_text={"fill": LEGEND_TEXT},
        animation_duration=0,
        fig_margin={"top": 24 if title else 10, "bottom": 40, "left": 56, "right": 12},
        layout=widgets.Layout(height="220px", width="100%"),
    )
