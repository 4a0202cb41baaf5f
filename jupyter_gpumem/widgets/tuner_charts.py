"""The technique tuner's results without behaviour: the table and the charts.

The form is `jupyter_gpumem.widgets.tuner_panel`, what "Fit to budget" chose
`jupyter_gpumem.widgets.plan_view`, the per-rank chart of "Will it fit on N GPUs?"
`jupyter_gpumem.widgets.rank_chart`; `jupyter_gpumem.widgets.tuner.Tuner` wires them. A row is
the plain dict that `Tuner.rows` returns: bytes as ints, times in ms, percentages as floats,
``None`` where a number is unknown, ``step_within_noise`` where the step-time change is (the
table then says "within noise", as every rendering of a change does, and the chart draws it
at 0: :mod:`jupyter_gpumem.tuner.step_change`), and ``chart_label``, the configuration's short
name for the charts (`jupyter_gpumem.widgets.chart_labels`; the table keeps the full one).
Units are spelled through `jupyter_gpumem.units`; every piece of text that reaches HTML is
escaped.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as widgets
from bqplot import Axis, Bars, Figure, LinearScale, Lines, OrdinalScale, Scatter

from jupyter_gpumem.tuner.step_change import WITHIN_NOISE, figure
from jupyter_gpumem.units import format_bytes
from jupyter_gpumem.widgets.chart_labels import cut, numbered
from jupyter_gpumem.widgets.rank_chart import COLORS

__all__ = [
    "AS_IS",
    "CATEGORY_COLORS",
    "GPUS_BUTTON",
    "BreakdownChart",
    "TradeoffChart",
    "chart_labels",
    "message_html",
    "rows_html",
    "rows_text",
]

Row = Mapping[str, Any]

# The report's categories in the sidebar's order (labextension categories.ts CATEGORIES).
CATEGORY_COLORS = {
    "parameters": "#4e79a7",
    "gradients": "#f28e2b",
    "optimizer_state": "#e15759",
    "optimizer_scratch": "#ff9d9a",
    "kv_cache": "#d37295",
    "activations": "#59a14f",
    "inputs": "#76b7b2",
    "other": "#b07aa1",
    "temporary": "#edc948",
    "unattributed": "#9c755f",
    "held_before": "#8c8c6c",  # estimates: what the process held before the call
    "library_workspace": "#b6992d",
    "cuda_graph_pool": "#a0cbe8",
    "cache": "#bab0ac",
    "cuda_context": "#79706e",
    "allocator_slack": "#d4a6c8",
    "communication": "#86bcb6",
}
UNKNOWN_COLOR = "#9c9c9c"
GiB, MiB = 2**30, 2**20
MESSAGE_COLORS = {
    "error": "var(--jp-error-color1,#c62828)",
    "warning": "var(--jp-warn-color0,#e65100)",
}

# bqplot's dark theme draws titles in an accent colour; ours follow the theme's text colour.
TITLE_STYLE = {"fill": "var(--jp-ui-font-color1)"}

COLUMNS = (
    "configuration",
    "peak",
    "at the peak",
    "step",
    "Δ peak",
    "Δ step",
    "fits budget",
    "notes",
)
NUMERIC = frozenset({"peak", "step", "Δ peak", "Δ step", "fits budget"})  # never wrapped
WRAP = {"configuration": 28, "at the peak": 26, "notes": 36}  # text: wrapped at these widths
# The "as is" choice of the precision and optimizer dropdowns. Not None: ipywidgets shows a
# dropdown whose value is None as blank.
AS_IS = ""
NBSP = "\u00a0"  # keeps "activations 4.10 GiB" on one line when a cell wraps


def _unit(top_bytes: float) -> tuple[str, int]:
    return ("GiB", GiB) if top_bytes >= GiB else ("MiB", MiB)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:+.0f}%"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"


def _category_label(key: str) -> str:
    return key.replace("_", " ")


def breakdown_summary(breakdown: Mapping[str, int] | None, top: int = 3) -> str:
    """The ``top`` largest categories, largest first: ``activations 4.10 GiB, ...``."""
    if not breakdown:
        return ""
    largest = sorted(((n, k) for k, n in breakdown.items() if n > 0), reverse=True)[:top]
    return ", ".join(f"{_category_label(k)} {format_bytes(n)}" for n, k in largest)


def _step_change(row: Row) -> str:
    pct = row.get("delta_step_pct")
    return "" if pct is None else figure(pct, bool(row.get("step_within_noise")))


def _step_cost(row: Row) -> float:
    """Where a row stands on the step-time axis: its change in %, or 0 within noise."""
    return 0.0 if row.get("step_within_noise") else float(row["delta_step_pct"])


def _fits(row: Row) -> str:
    fits = row.get("fits_budget")
    return "" if fits is None else "yes" if fits else "no"


def _breakdown_cell(breakdown: Mapping[str, int] | None) -> str:
    """`breakdown_summary` with each item unbreakable, so that a cell wraps between items."""
    items = breakdown_summary(breakdown).split(", ")
    return ", ".join(item.replace(" ", NBSP) for item in items if item)


def _cells(row: Row) -> list[str]:
    """One row of the table as text cells, in COLUMNS order."""
    delta_bytes = row.get("delta_peak_bytes")
    delta_peak = ""
    if delta_bytes is not None:
        delta_peak = f"{format_bytes(delta_bytes, signed=True)} {_pct(row.get('delta_peak_pct'))}"
    notes = [] if row.get("status", "ok") == "ok" else [str(row.get("status"))]
    notes += [str(n) for n in (row.get("error"), *row.get("warnings", ())) if n]
    return [
        str(row.get("configuration", "")),
        format_bytes(row.get("peak_bytes")),
        _breakdown_cell(row.get("breakdown")),
        _ms(row.get("step_ms")),
        delta_peak.strip(),
        _step_change(row),
        _fits(row),
        "; ".join(notes),
    ]


def _table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """Column titles and cells, without the columns that are empty in every row."""
    cells = [_cells(r) for r in rows]
    keep = [i for i in range(len(COLUMNS)) if any(line[i] for line in cells)]
    return [COLUMNS[i] for i in keep], [[line[i] for i in keep] for line in cells]


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken between words only."""
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)
    return [line.replace(NBSP, " ") for line in lines] or [""]


def rows_text(rows: Sequence[Row]) -> str:
    """The results as a fixed-width text table (for `print`, logs and executed notebooks).

    Long cells wrap between words onto more lines of their row, so that the table stays
    narrow enough for a notebook's output area.
    """
    columns, cells = _table(rows)
    table: list[list[str]] = [list(columns)]
    for line in cells:
        wrapped = [
            _wrap(c, WRAP[title]) if title in WRAP else [c]
            for title, c in zip(columns, line, strict=True)
        ]
        height = max(len(w) for w in wrapped)
        table.extend([w[i] if i < len(w) else "" for w in wrapped] for i in range(height))
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    out = []
    for line in table:
        shown = [
            c.rjust(w) if title in NUMERIC and title != "fits budget" else c.ljust(w)
            for title, c, w in zip(columns, line, widths, strict=True)
        ]
        out.append("  ".join(shown).rstrip())
    return "\n".join(out)


def rows_html(rows: Sequence[Row]) -> str:
    """The results as a theme-aware HTML table; all text escaped."""
    esc = html.escape
    if not rows:
        return "<p><em>No measurements yet: press Re-run.</em></p>"
    pad = "padding:0 .7em;vertical-align:top;text-align:left"
    nowrap = f"{pad};white-space:nowrap"

    def style(title: str) -> str:
        if title not in NUMERIC:
            return pad
        return f"{nowrap};text-align:{'left' if title == 'fits budget' else 'right'}"

    columns, table = _table(rows)
    head = "".join(f'<th style="{style(c)};white-space:nowrap">{esc(c)}</th>' for c in columns)
    body = []
    for row, cells in zip(rows, table, strict=True):
        over = row.get("fits_budget") is False
        colour = ' style="color:var(--jp-error-color1,#c62828)"' if over else ""
        body.append(
            f"<tr{colour}>"
            + "".join(
                f'<td style="{style(t)}">{esc(c)}</td>' for t, c in zip(columns, cells, strict=True)
            )
            + "</tr>"
        )
    table_style = (
        "font-family:var(--jp-code-font-family,monospace);font-size:var(--jp-code-font-size,12px);"
        "border-collapse:collapse"
    )
    return (
        f'<table class="jp-gpumem-tuner-results" style="{table_style}">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def _categories(rows: Sequence[Row]) -> list[str]:
    """Categories with bytes in any row: known ones in the sidebar's order, unknown ones after."""
    present = {k for r in rows for k, n in (r.get("breakdown") or {}).items() if n}
    known = [k for k in CATEGORY_COLORS if k in present]
    return known + sorted(present - set(known))


def chart_labels(rows: Sequence[Row]) -> list[str]:
    """Each row's name on a chart: its short ``chart_label`` (else its configuration, cut at
    the end), numbered where two come out alike."""
    return numbered([str(r.get("chart_label") or cut(str(r["configuration"]))) for r in rows])


def _swatch(style: str, text: str) -> str:
    return (
        '<span style="display:inline-block;margin:0 .9em .2em 0;white-space:nowrap">'
        f'<span style="display:inline-block;margin-right:.3em;{style}"></span>{text}</span>'
    )


def legend_html(categories: Sequence[str], budget_bytes: int | None = None) -> str:
    """The bar chart's legend: swatches with labels in the page's own text colour, then the
    budget line's dashes where a budget is set."""
    esc = html.escape
    items = [
        _swatch(
            "width:.8em;height:.8em;vertical-align:-.05em;"
            f"background:{CATEGORY_COLORS.get(c, UNKNOWN_COLOR)}",
            esc(_category_label(c)),
        )
        for c in categories
    ]
    if budget_bytes is not None:
        dashes = (
            f"width:1.4em;height:0;border-top:2px dashed {COLORS['budget']};vertical-align:.25em"
        )
        items.append(_swatch(dashes, esc(f"budget {format_bytes(budget_bytes)}")))
    return f'<div class="jp-gpumem-legend" style="color:inherit;padding-left:8px">{"".join(items)}</div>'


def names_html(rows: Sequence[Row]) -> str:
    """The full configuration of each chart label that is shorter than it: ``a = b`` lines."""
    esc = html.escape
    pairs = [
        (short, str(r["configuration"]))
        for short, r in zip(chart_labels(rows), rows, strict=True)
        if short != str(r["configuration"])
    ]
    if not pairs:
        return ""
    lines = "".join(f"<div><b>{esc(a)}</b>: {esc(b)}</div>" for a, b in pairs)
    return (
        '<div class="jp-gpumem-chart-names" style="color:var(--jp-ui-font-color2,#616161);'
        f'padding-left:8px;font-size:var(--jp-ui-font-size0,11px)">{lines}</div>'
    )


class BreakdownChart:
    """Stacked bars, one row per configuration: what the peak of each was made of.

    The bars are horizontal so that configuration names are read level on the left instead
    of running into each other under the bars; they are the rows' short chart labels, so that
    none is cut at its start, with the full ones under the legend. A budget is a dashed line
    across the bars. The legend is HTML under the figure (``widget`` holds both): bqplot draws
    its legend over the plot area, where it covers bars, in a text colour that some themes
    make pale.
    """

    def __init__(self) -> None:
        self.x = OrdinalScale(reverse=True)  # the first configuration on top, as in the table
        self.y = LinearScale(min=0.0)
        self.bars = Bars(
            x=[],
            y=[],
            scales={"x": self.x, "y": self.y},
            type="stacked",
            orientation="horizontal",
            display_legend=False,
            padding=0.3,
        )
        # The bars lie along the figure's x, so the budget's vertical line takes the bars'
        # memory scale as its x and runs the plot's height on a 0..1 scale of its own.
        self.budget = Lines(
            x=[],
            y=[],
            scales={"x": self.y, "y": LinearScale(min=0.0, max=1.0)},
            colors=[COLORS["budget"]],
            line_style="dashed",
            stroke_width=2,
        )
        self.y_axis = Axis(scale=self.y, side="bottom", tick_format=".3~g")  # the memory axis
        self.figure = Figure(
            marks=[self.bars, self.budget],
            axes=[Axis(scale=self.x, side="left", orientation="vertical"), self.y_axis],
            title="breakdown at the peak",
            title_style=TITLE_STYLE,
            animation_duration=0,
            fig_margin=self._margin([]),
            layout=widgets.Layout(height="340px", width="100%"),
        )
        self.legend = widgets.HTML()
        self.names = widgets.HTML()
        self.widget = widgets.VBox(
            [self.figure, self.legend, self.names],
            layout=widgets.Layout(width="50%", min_width="320px"),
        )

    def update(self, rows: Sequence[Row], budget_bytes: int | None = None) -> None:
        shown = [r for r in rows if r.get("breakdown")]
        categories = _categories(shown)
        top = max((sum((r.get("breakdown") or {}).values()) for r in shown), default=0)
        unit, scale = _unit(max(top, budget_bytes or 0))
        with self.bars.hold_sync():
            self.bars.x = chart_labels(shown)
            self.bars.y = [
                [(r.get("breakdown") or {}).get(c, 0) / scale for r in shown] for c in categories
            ]
            self.bars.labels = [_category_label(c) for c in categories]
            self.bars.colors = [CATEGORY_COLORS.get(c, UNKNOWN_COLOR) for c in categories]
        drawn = budget_bytes is not None and bool(shown)
        with self.budget.hold_sync():
            self.budget.x = [budget_bytes / scale] * 2 if drawn and budget_bytes else []
            self.budget.y = [0.0, 1.0] if drawn else []
        end = max(top, budget_bytes or 0) if shown else 0
        self.y.max = end / scale * 1.05 if end else None  # the longest bar ends inside the plot
        self.y_axis.label = f"memory ({unit})"
        self.figure.fig_margin = self._margin(self.bars.x)
        self.legend.value = legend_html(categories, budget_bytes if drawn else None)
        self.names.value = names_html(shown)

    @staticmethod
    def _margin(names: Sequence[str]) -> dict[str, int]:
        """Room on the left for the longest configuration name (about 7 px a character)."""
        left = min(220, max(56, 12 + 7 * max((len(n) for n in names), default=0)))
        return {"top": 30, "bottom": 44, "left": left, "right": 16}


def padded_range(
    values: Sequence[float], *, low: float = 0.12, high: float = 0.12
) -> tuple[float, float]:
    """A scale's (min, max): the values and 0, widened by ``low``/``high`` of their span."""
    lo, hi = min((0.0, *values)), max((0.0, *values))
    span = hi - lo or 1.0
    return lo - low * span, hi + high * span


class TradeoffChart:
    """Memory saved against step-time cost, one point per configuration, named by its chart label.

    The scales reach past the outermost points, furthest to the right, where the names are
    drawn, so that no point or name is cut at the plot's edge.
    """

    def __init__(self) -> None:
        self.x = LinearScale()
        self.y = LinearScale()
        self.points = Scatter(
            x=[],
            y=[],
            names=[],
            display_names=True,
            names_unique=False,
            scales={"x": self.x, "y": self.y},
            colors=["#4e79a7"],
            default_size=48,
        )
        self.y_axis = Axis(scale=self.y, side="left", tick_format=".3~g")
        self.figure = Figure(
            marks=[self.points],
            axes=[
                Axis(scale=self.x, side="bottom", label="step-time cost (%)", tick_format=".3~g"),
                self.y_axis,
            ],
            title="memory saved vs step-time cost",
            title_style=TITLE_STYLE,
            animation_duration=0,
            fig_margin={"top": 30, "bottom": 40, "left": 56, "right": 24},
            layout=widgets.Layout(height="340px", width="50%", min_width="320px"),
        )

    def update(self, rows: Sequence[Row]) -> None:
        shown = [
            r
            for r in rows
            if r.get("delta_peak_bytes") is not None and r.get("delta_step_pct") is not None
        ]
        saved = [-int(r["delta_peak_bytes"]) for r in shown]
        unit, scale = _unit(max((abs(s) for s in saved), default=0))
        xs = [_step_cost(r) for r in shown]
        ys = [s / scale for s in saved]
        names = chart_labels(shown)
        longest = max((len(n) for n in names), default=0)
        with self.points.hold_sync():
            self.points.x = xs
            self.points.y = ys
            self.points.names = names
        # about 1.5% of the span per character of the longest name: room for it on the right
        self.x.min, self.x.max = padded_range(xs, low=0.08, high=0.1 + 0.015 * longest)
        self.y.min, self.y.max = padded_range(ys, low=0.1, high=0.15)
        self.y_axis.label = f"memory saved ({unit})"
        noise = sum(bool(r.get("step_within_noise")) for r in shown)
        self.figure.title = "memory saved vs step-time cost" + (
            f" ({noise} {WITHIN_NOISE}, at 0)" if noise else ""
        )


GPUS_BUTTON = "Will it fit on N GPUs?"


def message_html(kind: str, text: str) -> str:
    """One escaped line of panel text, coloured by ``kind`` ("error", "warning" or "info")."""
    return f'<div style="color:{MESSAGE_COLORS.get(kind, "inherit")}">{html.escape(text)}</div>'
