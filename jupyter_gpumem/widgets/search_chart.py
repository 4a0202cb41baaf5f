"""What ``Trial.search`` found, drawn as the articles draw it: memory saved against step-time cost.

One filled point per candidate on the search's Pareto front (its composed figures), a dashed
line at the memory that must be saved to fit the budget, the winner marked where its own
estimate puts it and, once ``Search.verify()`` ran, the measured winner outlined. Both axes are
against the baseline, the search's ``Config()`` candidate: its composed peak and its measured
step. Each step-time cost is the search's own :class:`~jupyter_gpumem.tuner.step_change.StepChange`
(``front_changes``, ``predicted_change``, ``measured_change``), so the chart, its tooltip and
the legend give the figure the reasoning gives; a cost within noise stands at 0, its name
saying so. Where step times are unknown (a model on the meta device), points stand at their
number of changes from the baseline, and the title says so.

`search_marks` is a pure function of the search, tested without a browser; `SearchChart` draws
it with bqplot over an HTML legend. Colours follow JupyterLab's theme where the theme has one
(its text, muted text and success colours). Units are spelled through `jupyter_gpumem.units`;
all text reaching HTML is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import ipywidgets as widgets
from bqplot import Axis, Figure, LinearScale, Lines, Scatter, Tooltip

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.step_change import WITHIN_NOISE, StepChange
from jupyter_gpumem.units import format_bytes, format_seconds
from jupyter_gpumem.widgets.chart_labels import chart_label, cut
from jupyter_gpumem.widgets.tuner_charts import TITLE_STYLE, padded_range

if TYPE_CHECKING:
    from jupyter_gpumem.tuner.planning.joint import Search

__all__ = [
    "COLORS",
    "SearchChart",
    "SearchMarks",
    "SearchPoint",
    "changes",
    "reasoning_html",
    "search_marks",
]

COLORS = {
    "candidate": "#4e79a7",  # as the tuner's other charts draw a configuration
    "winner": "var(--jp-success-color1, #388e3c)",
    "baseline": "var(--jp-ui-font-color1, #212121)",  # the theme's text colour
    "budget": "var(--jp-ui-font-color2, #616161)",
}
COST_AXIS = "step-time cost (%)"
CHANGES_AXIS = "changes from the baseline"
# text lines as a paragraph's, not at the widgets' 28 px row height; a gap between items
LINES = "line-height:1.4;display:flex;flex-direction:column;gap:.3em"


def changes(config: Config) -> int:
    """How many techniques ``config`` changes from the baseline (GPUs are not one)."""
    return sum(
        (
            config.checkpoint is not None,
            config.precision is not None,
            config.optimizer is not None,
            config.accumulate > 1,
            config.offload is not None,
        )
    )


def point_label(config: Config, blocks: Sequence[str] = ()) -> str:
    """``config`` named for a chart's tooltip: `chart_label` with its micro-batches."""
    label = chart_label(replace(config, accumulate=1), blocks)
    if config.accumulate == 1:
        return label
    micro = f"accumulate {config.accumulate}"
    return micro if label == "baseline" else cut(f"{label} · {micro}", 48)


@dataclass(frozen=True)
class SearchPoint:
    """One candidate where the chart puts it: x is its step-time cost in % (0 within noise;
    or its number of changes), y the memory it saves in %, both against the baseline."""

    config: Config
    label: str
    x: float
    y: float
    peak_bytes: int
    step_s: float | None
    change: StepChange | None = None  # the search's, which x draws


@dataclass(frozen=True)
class SearchMarks:
    """Everything the chart draws; ``front`` empty where the baseline has no estimate."""

    title: str
    by_changes: bool  # step times unknown: x is the number of changes
    front: tuple[SearchPoint, ...]  # estimated: filled
    winner: SearchPoint | None  # at its own estimate
    measured: SearchPoint | None  # the winner measured: outlined
    budget_saved_pct: float | None  # the memory that must be saved to fit the budget
    budget_bytes: int
    baseline_peak_bytes: int | None
    baseline_step_s: float | None
    candidates: int


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole


def search_marks(found: Search, blocks: Sequence[str] = ()) -> SearchMarks:
    """Where each mark of ``found`` goes."""
    base_peak, base_step = found.baseline_peak_bytes, found.baseline_step_s
    winner_step = found.predicted_step_s if found.config is not None else 0.0
    by_changes = (
        base_step is None
        or base_step <= 0
        or winner_step is None
        or any(step is None for _, _, step in found.front)
    )
    kind = f"{len(found.front)} of {found.candidates} candidates on the front"
    title = (
        f"memory saved vs number of changes (step times unknown): {kind}"
        if by_changes
        else f"memory saved vs step-time cost: {kind}"
    )
    if base_peak is None or base_peak <= 0:
        return SearchMarks(
            "nothing to draw: the baseline could not be estimated", by_changes, (), None, None,
            None, found.budget_bytes, None, base_step, found.candidates,
        )  # fmt: skip

    def at(config: Config, peak: int, step: float | None, change: StepChange | None) -> SearchPoint:
        label = point_label(config, blocks)
        if by_changes or change is None:
            x = float(changes(config))
        else:
            x = 0.0 if change.within_noise else change.pct
            label += f" (step time {WITHIN_NOISE})" if change.within_noise else ""
        y = _pct(base_peak - peak, base_peak)
        return SearchPoint(config, label, x, y, peak, step, change)

    known = found.front_changes or (None,) * len(found.front)
    front = tuple(
        at(c, peak, step, change)
        for (c, peak, step), change in zip(found.front, known, strict=True)
    )
    winner = measured = None
    estimated = found.estimate.peak_bytes if found.estimate is not None else None
    if found.config is not None and estimated is not None:
        winner = at(found.config, estimated, found.predicted_step_s, found.predicted_change)
        result = found.result
        if result is not None and result.status == "ok" and result.peak_allocated_bytes:
            step = result.step_s
            change = found.measured_change
            measured = at(found.config, result.peak_allocated_bytes, step, change)
            if step is None or change is None:  # no time measured: beside the estimate
                measured = replace(measured, x=winner.x)
    return SearchMarks(
        title, by_changes, front, winner, measured,
        _pct(base_peak - found.budget_bytes, base_peak), found.budget_bytes, base_peak,
        base_step, found.candidates,
    )  # fmt: skip


def _swatch(style: str, text: str) -> str:
    return (
        '<span style="display:inline-block;margin:0 .9em .2em 0;white-space:nowrap">'
        f'<span style="display:inline-block;vertical-align:-.05em;margin-right:.3em;{style}">'
        f"</span>{html.escape(text)}</span>"
    )


def _cost(point: SearchPoint, by_changes: bool) -> str:
    if by_changes or point.change is None:
        return f"{point.x:.0f} change" + ("" if point.x == 1 else "s")
    step = "" if point.step_s is None else f" ({format_seconds(point.step_s)})"
    return f"step time {point.change.figure}{step}"


def legend_html(marks: SearchMarks) -> str:
    """What each mark means, then the winner's figures, in the page's text colour."""
    dot = "width:.7em;height:.7em;border-radius:50%;box-sizing:border-box"
    diamond = f"width:.6em;height:.6em;transform:rotate(45deg);background:{COLORS['winner']}"
    items = [
        _swatch(f"{dot};background:{COLORS['candidate']}", "estimated (composed): the front"),
        _swatch(diamond, "winner (its own estimate)"),
    ]
    if marks.measured is not None:
        items.append(_swatch(f"{dot};border:2px solid {COLORS['winner']}", "winner measured"))
    items.append(_swatch(f"{dot};border:1px solid {COLORS['baseline']}", "baseline"))
    if marks.budget_saved_pct is not None:
        line = f"width:1.4em;height:0;border-top:2px dashed {COLORS['budget']};vertical-align:.25em"
        need = max(marks.budget_saved_pct, 0.0)
        items.append(
            _swatch(line, f"budget {format_bytes(marks.budget_bytes)}: save {need:.0f}% or more")
        )
    lines = [f'<div class="jp-gpumem-search-legend">{"".join(items)}</div>']
    if marks.winner is not None:
        w = marks.winner
        said = (
            f"Winner: {w.config}: estimated {format_bytes(w.peak_bytes)} "
            f"(saves {w.y:.0f}%), {_cost(w, marks.by_changes)}"
        )
        if marks.measured is not None:
            m = marks.measured
            said += f"; measured {format_bytes(m.peak_bytes)} (saves {m.y:.0f}%)"
            said += "" if marks.by_changes or m.change is None else f", {_cost(m, False)}"
        lines.append(f'<div class="jp-gpumem-search-winner">{html.escape(said)}.</div>')
    elif marks.front:
        lines.append(
            '<div class="jp-gpumem-search-winner">No candidate is estimated within the budget.</div>'
        )
    return f'<div style="color:inherit;padding-left:8px;{LINES}">{"".join(lines)}</div>'


def reasoning_html(found: Search, *, unmeasured: str = "") -> str:
    """The search's reasoning, its first line (what it keeps of the training math) in bold, then
    the winner's measurement (or ``unmeasured``: why there is none) and what to do next: the
    lines of ``found.text()``, and those."""
    lines = [*found.reasoning, *found.verified_lines()]
    if found.result is None and found.config is not None and unmeasured:
        lines.append(unmeasured)
    if found.config is not None:
        lines.append("The panel now shows the winner: press Apply to use it.")
    first, *rest = (html.escape(line) for line in lines)
    body = "".join(f"<div>{line}</div>" for line in rest)
    return (
        f'<div class="jp-gpumem-search-reasoning" style="{LINES}"><div><b>{first}</b></div>'
        f"{body}</div>"
    )


class SearchChart:
    """A `Search` drawn; ``widget`` holds the figure and its legend (empty until `update`)."""

    def __init__(self) -> None:
        self.x, self.y = LinearScale(), LinearScale()
        scales = {"x": self.x, "y": self.y}
        self.tooltip = tooltip = Tooltip(
            fields=["name", "x", "y"],
            labels=["candidate", COST_AXIS, "memory saved (%)"],
            formats=["", ".0f", ".0f"],
        )
        self.budget = Lines(x=[], y=[], scales=scales, colors=[COLORS["budget"]],
                            line_style="dashed", stroke_width=2)  # fmt: skip
        self.points = Scatter(x=[], y=[], names=[], display_names=False, names_unique=False,
                              scales=scales, colors=[COLORS["candidate"]], default_size=48,
                              stroke_width=0, tooltip=tooltip)  # fmt: skip
        self.baseline = Scatter(x=[], y=[], names=[], display_names=True, scales=scales,
                                colors=[COLORS["baseline"]], fill=False, default_size=48,
                                stroke_width=1)  # fmt: skip
        # the winner's name up and to the right, off the measured ring around it
        self.winner = Scatter(x=[], y=[], names=[], display_names=True, names_unique=False,
                              scales=scales, colors=[COLORS["winner"]], marker="diamond",
                              default_size=110, stroke_width=0, tooltip=tooltip,
                              label_display_horizontal_offset=12,
                              label_display_vertical_offset=12)  # fmt: skip
        self.measured = Scatter(x=[], y=[], names=[], display_names=False, names_unique=False,
                                scales=scales, colors=[COLORS["winner"]], fill=False,
                                default_size=150, stroke_width=2, tooltip=tooltip)  # fmt: skip
        self.x_axis = Axis(scale=self.x, side="bottom", label=COST_AXIS, tick_format=".3~g")
        self.y_axis = Axis(scale=self.y, side="left", label="memory saved (%)",
                           tick_format=".3~g")  # fmt: skip
        self.figure = Figure(
            # the measured ring over the winner's diamond, where they meet
            marks=[self.budget, self.points, self.baseline, self.winner, self.measured],
            axes=[self.x_axis, self.y_axis],
            title="memory saved vs step-time cost",
            title_style=TITLE_STYLE,
            animation_duration=0,
            fig_margin={"top": 30, "bottom": 40, "left": 56, "right": 24},
            layout=widgets.Layout(height="340px", width="100%"),
        )
        self.legend = widgets.HTML()
        self.marks: SearchMarks | None = None
        self.widget = widgets.VBox(layout=widgets.Layout(width="55%", min_width="360px"))

    def update(self, found: Search, blocks: Sequence[str] = ()) -> SearchMarks:
        """Draw ``found`` (and its measured winner, once verified); returns what was drawn."""
        marks = self.marks = search_marks(found, blocks)
        drawn = [p for p in (marks.winner, marks.measured) if p is not None]
        xs = [p.x for p in (*marks.front, *drawn)]
        ys = [p.y for p in (*marks.front, *drawn)]
        ys += [] if marks.budget_saved_pct is None else [marks.budget_saved_pct]
        # room on the right for the winner's name ("winner": about 7% of the span)
        self.x.min, self.x.max = padded_range(xs, low=0.08, high=0.16)
        self.y.min, self.y.max = padded_range(ys, low=0.1, high=0.15)
        for mark, points in (
            (self.points, marks.front),
            (self.winner, (marks.winner,) if marks.winner else ()),
            (self.measured, (marks.measured,) if marks.measured else ()),
        ):
            with mark.hold_sync():
                mark.x = [p.x for p in points]
                mark.y = [p.y for p in points]
                mark.names = [p.label for p in points]
        self.winner.names = ["winner"] * len(self.winner.x)
        with self.baseline.hold_sync():
            self.baseline.x, self.baseline.y = ([0.0], [0.0]) if marks.front else ([], [])
            self.baseline.names = ["baseline"] if marks.front else []
        shown = marks.budget_saved_pct is not None and bool(marks.front)
        with self.budget.hold_sync():
            self.budget.x = [self.x.min, self.x.max] if shown else []
            self.budget.y = [marks.budget_saved_pct] * 2 if shown else []
        self.x_axis.label = CHANGES_AXIS if marks.by_changes else COST_AXIS
        self.tooltip.labels = ["candidate", self.x_axis.label, "memory saved (%)"]
        self.x_axis.tick_format = "d" if marks.by_changes else ".3~g"
        self.x_axis.tick_values = (
            list(range(int(max(xs, default=0)) + 1)) if marks.by_changes else None
        )
        self.figure.title = marks.title
        self.legend.value = legend_html(marks)
        self.widget.children = (self.figure, self.legend) if marks.front else (self.legend,)
        return marks
