"""A ``generate`` map as a chart: one square per batch size and total context, coloured by
whether it fits, and the frontier of the longest context that fits at each batch.

`cells` and `frontier_line` are pure functions of the map, tested without a browser;
`GenerateChart` draws them with bqplot under a one-line title, over an HTML legend. Colours
follow JupyterLab's theme (its success and error colours, as the sidebar's status and the
tables' rows over budget use them), so the chart reads in the light and the dark theme alike.

The map is read through `GenerateGrid`, what `GenerateMap` offers: `GenerateMap.chart()`
imports this module, so this one names no type of the map's module, not even for type hints.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import ipywidgets as widgets
from bqplot import Axis, Figure, Lines, LogScale, Scatter, Tooltip

from jupyter_gpumem.units import format_bytes

if TYPE_CHECKING:
    from jupyter_gpumem.tuner.estimation.estimate import Estimate

__all__ = ["COLORS", "Cell", "GenerateChart", "GenerateGrid", "cells", "frontier_line", "title"]

COLORS = {
    "fits": "var(--jp-success-color1, #388e3c)",
    "over": "var(--jp-error-color1, #d32f2f)",
    "unknown": "#9c9c9c",  # as the tuner's charts draw what they cannot name
    "frontier": "var(--jp-ui-font-color1, #212121)",  # the theme's text colour: black or white
}
LEFT_OUT_OPACITY = 0.4  # over, by a smaller cell that is over: paler than one estimated over
PITCH_X, PITCH_Y = 80, 48  # px between neighbouring contexts and batch sizes
MARGIN = {"top": 12, "bottom": 48, "left": 60, "right": 20}
TITLE_STYLE = "color:var(--jp-ui-font-color1);font-weight:600;padding-left:8px;white-space:nowrap"


class GenerateGrid(Protocol):
    """What the chart reads of a `GenerateMap`."""

    @property
    def batch_sizes(self) -> tuple[int, ...]: ...
    @property
    def contexts(self) -> tuple[int, ...]: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def estimates(self) -> tuple[tuple[Estimate | None, ...], ...]: ...
    @property
    def budget_bytes(self) -> int | None: ...
    @property
    def card(self) -> str | None: ...
    def fits(self, i: int, j: int) -> bool | None: ...
    def frontier(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Cell:
    """One square: its batch and context, its state and the tooltip's words about it."""

    batch: int
    context: int
    state: str  # "fits", "over", "left_out" (a smaller cell is over) or "unknown" (no estimate)
    text: str


def _estimate_text(est: Estimate, peak_bytes: int, fits: bool | None) -> str:
    """``fits: peak 19.3 MiB in prefill, of which KV cache 0 B``: the cache at the peak."""
    kv = (est.breakdown or {}).get("kv_cache")
    parts = [f"peak {format_bytes(peak_bytes)}" + (f" in {est.phase}" if est.phase else "")]
    if kv is not None:
        parts.append(f"of which KV cache {format_bytes(kv)}")
    verdict = "not judged" if fits is None else "fits" if fits else "does not fit"
    return f"{verdict}: {', '.join(parts)}"


def cells(found: GenerateGrid) -> list[Cell]:
    """Every cell of the map, batch by batch, each context in turn."""
    out = []
    for i, batch in enumerate(found.batch_sizes):
        for j, context in enumerate(found.contexts):
            est, fits = found.estimates[i][j], found.fits(i, j)
            if est is None:
                state = "left_out" if fits is False else "unknown"
                text = (
                    "does not fit: not estimated, as a smaller batch or context does not fit"
                    if fits is False
                    else "not estimated"
                )
            elif est.peak_bytes is None:
                state, text = "unknown", f"no estimate: {est.reason or 'unknown reason'}"
            else:
                state = "unknown" if fits is None else "fits" if fits else "over"
                text = _estimate_text(est, est.peak_bytes, fits)
            out.append(Cell(batch, context, state, text))
    return out


def frontier_line(found: GenerateGrid) -> list[tuple[int, int]]:
    """The frontier as (context, batch) corners of a step line: through the longest fitting
    context of each batch that fits at all, along its batch to the next one's, then up to it.
    A larger batch never fits a longer context, so the steps only go back as they go up."""
    points = [(c, b) for c, b in zip(found.frontier(), found.batch_sizes, strict=True) if c]
    line: list[tuple[int, int]] = []
    for k, (context, batch) in enumerate(points):
        line.append((context, batch))
        if k + 1 < len(points) and points[k + 1][0] != context:
            line.append((points[k + 1][0], batch))
    return line


def title(found: GenerateGrid) -> str:
    """The chart's one line: the new tokens and what the peaks are judged against."""
    against = (
        f"within {format_bytes(found.budget_bytes)} allocated"
        if found.budget_bytes is not None
        else f"on {found.card}"
    )
    return f"generate, {found.max_new_tokens} new tokens: what fits {against}"


def _smallest_step(values: Sequence[int]) -> float | None:
    """The fewest doublings between neighbouring values; None for a single value."""
    steps = [math.log2(b / a) for a, b in itertools.pairwise(sorted(set(values)))]
    return min(steps, default=None)


def _padded(values: Sequence[int]) -> tuple[float, float]:
    """A log scale's ends half a step past the outermost values, so no square is cut."""
    half = 2 ** ((_smallest_step(values) or 1.0) / 2)
    return min(values) / half, max(values) * half


def _steps(values: Sequence[int]) -> int:
    """How many pitches a log axis spans: one per value where they lie evenly."""
    step = _smallest_step(values)
    return 1 if step is None else round(math.log2(max(values) / min(values)) / step) + 1


def _swatch(style: str, text: str) -> str:
    return (
        '<span style="display:inline-block;margin:0 .9em .2em 0;white-space:nowrap">'
        f'<span style="display:inline-block;vertical-align:-.05em;margin-right:.3em;{style}">'
        f"</span>{html.escape(text)}</span>"
    )


def legend_html(found: GenerateGrid, shown: Sequence[Cell]) -> str:
    """What each colour and the line mean; states the map has, in the page's text colour."""
    square = "width:.75em;height:.75em"
    states = {c.state for c in shown}
    items = [_swatch(f"{square};background:{COLORS['fits']}", "fits")]
    items.append(_swatch(f"{square};background:{COLORS['over']}", "does not fit"))
    if "left_out" in states:
        pale = f"{square};background:{COLORS['over']};opacity:{LEFT_OUT_OPACITY}"
        items.append(_swatch(pale, "does not fit (left out: a smaller one does not)"))
    if "unknown" in states:
        items.append(_swatch(f"{square};background:{COLORS['unknown']}", "no estimate"))
    if any(found.frontier()):
        line = (
            f"width:1.4em;height:0;vertical-align:.25em;border-top:2px solid {COLORS['frontier']}"
        )
        items.append(_swatch(line, "frontier: the longest context that fits at each batch"))
    else:
        items.append(_swatch("", "nothing fits, not even the smallest batch and context"))
    return f'<div class="jp-gpumem-generate-legend" style="color:inherit;padding-left:8px">{"".join(items)}</div>'  # fmt: skip


class GenerateChart:
    """A `GenerateMap` drawn: context across, batch size up, both on log scales; ``widget``
    holds the title, the figure and its legend."""

    def __init__(self, found: GenerateGrid) -> None:
        self.found = found
        self.cells = cells(found)
        self.line = frontier_line(found)
        batches, contexts = list(found.batch_sizes), list(found.contexts)
        self.x = LogScale(min=_padded(contexts)[0], max=_padded(contexts)[1])
        self.y = LogScale(min=_padded(batches)[0], max=_padded(batches)[1])
        scales = {"x": self.x, "y": self.y}
        width = MARGIN["left"] + MARGIN["right"] + PITCH_X * _steps(contexts)
        height = MARGIN["top"] + MARGIN["bottom"] + PITCH_Y * _steps(batches)
        side = 0.62 * min(PITCH_X, PITCH_Y)  # px: a square's side, with room between squares
        self.squares = Scatter(
            x=[c.context for c in self.cells],
            y=[c.batch for c in self.cells],
            names=[c.text for c in self.cells],
            display_names=False,
            names_unique=False,
            marker="square",
            default_size=round(side * side),
            stroke_width=0,
            colors=[COLORS["over" if c.state == "left_out" else c.state] for c in self.cells],
            opacities=[LEFT_OUT_OPACITY if c.state == "left_out" else 1.0 for c in self.cells],
            scales=scales,
            tooltip=Tooltip(
                fields=["y", "x", "name"], labels=["batch", "context", "estimate"],
                formats=["d", "d", ""],
            ),
            hovered_style={"stroke": COLORS["frontier"], "stroke-width": 2},
        )  # fmt: skip
        self.frontier = Lines(
            x=[c for c, _ in self.line],
            y=[b for _, b in self.line],
            scales=scales,
            colors=[COLORS["frontier"]],
            stroke_width=2.5,
        )
        frontier = [(c, b) for c, b in zip(found.frontier(), batches, strict=True) if c]
        self.frontier_points = Scatter(
            x=[c for c, _ in frontier],
            y=[b for _, b in frontier],
            scales=scales,
            colors=[COLORS["frontier"]],
            default_size=36,
            stroke_width=0,
        )
        self.x_axis = Axis(
            scale=self.x,
            side="bottom",
            tick_values=contexts,
            tick_format="d",
            grid_lines="none",
            label=f"total context: prompt + {found.max_new_tokens} new tokens",
        )
        self.y_axis = Axis(
            scale=self.y,
            side="left",
            tick_values=batches,
            tick_format="d",
            grid_lines="none",
            label="batch size",
        )
        self.figure = Figure(
            marks=[self.squares, self.frontier, self.frontier_points],
            axes=[self.x_axis, self.y_axis],
            animation_duration=0,
            fig_margin=MARGIN,
            layout=widgets.Layout(width=f"{width}px", height=f"{height}px"),
        )
        self.title = widgets.HTML(f'<div style="{TITLE_STYLE}">{html.escape(title(found))}</div>')
        self.legend = widgets.HTML(legend_html(found, self.cells))
        self.widget = widgets.VBox([self.title, self.figure, self.legend])
