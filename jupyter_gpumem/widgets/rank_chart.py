"""The tuner's per-rank chart: each GPU's peak on 1, 2, 4 or 8 GPUs, estimated and measured.

"Will it fit on N GPUs?" estimates the panel's configuration for each count of GPUs and each
strategy (`jupyter_gpumem.widgets.tuner.Tuner.estimate_gpus`); Re-run with GPUs > 1 measures
one. Both become groups here, one per choice (1 GPU, DDP on 2, ...), with one point per rank:
estimates filled, measurements outlined, under the budget line. Where a group's ranks differ,
the worst (the ranks at its highest peak) are red; where they all peak alike, none is singled
out and the table says "all". Every rank holds its own GPU, so the budget applies to each
point, not to their sum.

`gpu_choices`, `rank_groups` and `rank_points` are pure functions of the records, tested without
a browser; `RankChart` draws their output with bqplot, an HTML legend and a table of the worst
ranks. Units are spelled only through `jupyter_gpumem.units`; all text reaching HTML is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import ipywidgets as widgets
from bqplot import Axis, Figure, LinearScale, Lines, Scatter

from jupyter_gpumem.techniques import PARALLELS, Config
from jupyter_gpumem.units import format_bytes

if TYPE_CHECKING:
    from jupyter_gpumem.tuner.estimation.estimate import Estimate
    from jupyter_gpumem.tuner.results import TrialResult

__all__ = [
    "COLORS",
    "GPU_COUNTS",
    "RankChart",
    "RankGroup",
    "RankPoint",
    "choice_label",
    "gpu_choices",
    "rank_groups",
    "rank_points",
    "worst_rows",
]

GPU_COUNTS = (1, 2, 4, 8)
COLORS = {"rank": "#4e79a7", "worst": "#e15759", "budget": "#79706e"}
GiB, MiB = 2**30, 2**20
TITLE_STYLE = {"fill": "var(--jp-ui-font-color1)"}  # as tuner_charts: the theme's text colour
COUNTS_HELP = "counts are numbers of GPUs, whole numbers >= 1, e.g. (1, 2, 4, 8)"


def choice_label(config: Config) -> str:
    """The GPUs and strategy of ``config``: "1 GPU", else the strategy and ranks as `Config` says."""
    if config.parallel is None:
        return "1 GPU"
    return str(
        Config(
            parallel=config.parallel, world_size=config.world_size, cpu_offload=config.cpu_offload
        )
    )


def gpu_choices(
    base: Config, counts: Sequence[int] = GPU_COUNTS, strategies: Sequence[str] = PARALLELS
) -> list[Config]:
    """``base`` on each count of GPUs with each strategy; 1 GPU once, without a strategy.
    With ``base.cpu_offload``, FSDP2 alone, on one rank too (its policy is FSDP2's).

    ValueError says what counts and strategies are allowed.
    """
    if isinstance(counts, (str, bytes)) or not counts:
        raise ValueError(f"{COUNTS_HELP}; got {counts!r}")
    bad = [n for n in counts if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad:
        raise ValueError(f"{COUNTS_HELP}; got {', '.join(map(repr, bad))}")
    if isinstance(strategies, str):
        strategies = (strategies,)
    unknown = [s for s in strategies if s not in PARALLELS]
    if unknown or (not strategies and any(n > 1 for n in counts)):
        got = ", ".join(map(repr, unknown)) or "none"
        raise ValueError(f"strategies are some of {', '.join(PARALLELS)}; got {got}")
    single = base.single
    out: list[Config] = []
    for n in dict.fromkeys(sorted(counts)):
        if base.cpu_offload:
            out.append(replace(single, parallel="fsdp2", world_size=n, cpu_offload=True))
        elif n == 1:
            out.append(single)
        else:
            out.extend(replace(single, parallel=s, world_size=n) for s in dict.fromkeys(strategies))
    return out


@dataclass(frozen=True)
class RankGroup:
    """One choice of GPUs and strategy: each rank's peak, estimated and measured, in bytes.

    ``estimated``/``measured`` hold one figure per rank in rank order (None where a rank has
    none), and are empty where nothing was estimated or measured.
    """

    label: str
    world_size: int
    estimated: tuple[int | None, ...] = ()
    measured: tuple[int | None, ...] = ()
    reason: str | None = None  # why the estimate failed
    status: str | None = None  # the measurement's status where it is not "ok", with its error

    def peaks(self, kind: str) -> tuple[int | None, ...]:
        """The ``kind`` ("estimated" or "measured") figures, one per rank."""
        return self.estimated if kind == "estimated" else self.measured

    def peak(self, kind: str) -> int | None:
        """The worst rank's ``kind`` peak: what must fit on each GPU."""
        return max((n for n in self.peaks(kind) if n is not None), default=None)

    def worst(self, kind: str) -> tuple[int, ...]:
        """The ranks at the highest ``kind`` peak, where some other rank is below it; else ()."""
        top = self.peak(kind)
        known = [(rank, n) for rank, n in enumerate(self.peaks(kind)) if n is not None]
        if top is None or all(n == top for _, n in known):
            return ()
        return tuple(rank for rank, n in known if n == top)

    def worst_text(self, kind: str) -> str:
        """`worst` in words: ``"1, 3"``, ``"all"`` where every rank peaks alike, ``""`` for one."""
        known = [n for n in self.peaks(kind) if n is not None]
        if len(known) < 2:
            return ""
        return ", ".join(map(str, self.worst(kind))) or "all"


@dataclass(frozen=True)
class RankPoint:
    """One rank's peak as the chart draws it: group i is centred at x = i."""

    x: float
    peak_bytes: int
    kind: str  # "estimated" (filled) or "measured" (outlined)
    rank: int
    worst: bool  # one of the group's worst ranks, where its ranks differ
    group: str


def _per_rank(
    peak: int | None, ranks: Sequence[tuple[int | None, int | None]]
) -> tuple[int | None, ...]:
    """Figures in rank order from (rank, bytes) pairs; the whole's peak as rank 0 without ranks."""
    if not ranks:
        return () if peak is None else (peak,)
    ordered = sorted(ranks, key=lambda r: -1 if r[0] is None else r[0])
    return tuple(n for _, n in ordered)


def _estimated(est: Estimate) -> tuple[int | None, ...]:
    return _per_rank(est.peak_bytes, [(r.rank, r.peak_bytes) for r in est.ranks])


def _measured(result: TrialResult) -> tuple[int | None, ...]:
    return _per_rank(
        result.peak_allocated_bytes, [(r.rank, r.peak_allocated_bytes) for r in result.ranks]
    )


def _status(result: TrialResult) -> str | None:
    """The first failed rank's status and error (else the whole run's); None when all went well."""
    failed = [r for r in result.ranks if r.status != "ok"] or [result]
    worst = failed[0]
    if worst.status == "ok":
        return None
    where = "" if worst.rank is None else f"rank {worst.rank} "
    return f"{where}{worst.status}" + (f": {worst.error}" if worst.error else "")


def rank_groups(
    estimates: Sequence[Estimate], results: Sequence[TrialResult], base: Config | None
) -> list[RankGroup]:
    """One group per choice: the estimates' choices in their order, then measured-only ones.

    Only estimates and measurements of ``base``'s techniques are taken (``config.single ==
    base``; none without a base), the latest measurement of each choice.
    """
    groups: dict[tuple[str | None, int], RankGroup] = {}
    for est in estimates:
        if base is None or est.config.single != base:
            continue
        key = (est.config.parallel, est.config.world_size)
        groups[key] = RankGroup(
            choice_label(est.config), est.config.world_size, _estimated(est), reason=est.reason
        )
    for result in results:
        if base is None or result.config.single != base:
            continue
        config = result.config
        key = (config.parallel, config.world_size)
        found = groups.get(key, RankGroup(choice_label(config), config.world_size))
        groups[key] = replace(found, measured=_measured(result), status=_status(result))
    return list(groups.values())


def _spread(world_size: int) -> float:
    """Distance between neighbouring ranks on the x axis: a group spans at most 0.7 of a step."""
    return min(0.16, 0.7 / max(1, world_size - 1))


def rank_points(groups: Sequence[RankGroup]) -> list[RankPoint]:
    """Every rank's known peak, estimated then measured, spread around its group's centre."""
    points: list[RankPoint] = []
    for kind in ("estimated", "measured"):
        for i, group in enumerate(groups):
            peaks = group.peaks(kind)
            worst, step = group.worst(kind), _spread(len(peaks))
            points.extend(
                RankPoint(i + (rank - (len(peaks) - 1) / 2) * step, n, kind, rank, rank in worst,
                          group.label)
                for rank, n in enumerate(peaks)
                if n is not None
            )  # fmt: skip
    return points


def _unit(top_bytes: float) -> tuple[str, int]:
    return ("GiB", GiB) if top_bytes >= GiB else ("MiB", MiB)


def _swatch(style: str) -> str:
    return f'<span style="display:inline-block;vertical-align:-.05em;margin-right:.3em;{style}">'


def legend_html(budget_bytes: int | None) -> str:
    """What filled, outlined, red and dashed mean; in the page's own text colour."""
    dot = "width:.7em;height:.7em;border-radius:50%;box-sizing:border-box"
    items = [
        (_swatch(f"{dot};background:{COLORS['rank']}"), "estimated"),
        (_swatch(f"{dot};border:2px solid {COLORS['rank']}"), "measured"),
        (_swatch(f"{dot};background:{COLORS['worst']}"), "worst rank, where ranks differ"),
    ]
    if budget_bytes is not None:
        line = f"width:1.4em;height:0;border-top:2px dashed {COLORS['budget']};vertical-align:.25em"
        items.append((_swatch(line), f"budget {format_bytes(budget_bytes)} per GPU"))
    spans = "".join(
        f'<span style="display:inline-block;margin:0 .9em .2em 0;white-space:nowrap">'
        f"{swatch}</span>{html.escape(text)}</span>"
        for swatch, text in items
    )
    return (
        f'<div class="jp-gpumem-rank-legend" style="color:inherit;padding-left:8px">{spans}</div>'
    )


def _fits(peak: int | None, budget_bytes: int | None) -> str:
    if peak is None or budget_bytes is None:
        return ""
    return "yes" if peak <= budget_bytes else "no"


def worst_rows(groups: Sequence[RankGroup], budget_bytes: int | None) -> list[list[str]]:
    """The table beside the chart: choice, worst rank, its peak estimated and measured, fits
    (by the measurement where there is one), notes."""
    rows = []
    for g in groups:
        estimated, measured = g.peak("estimated"), g.peak("measured")
        said, ran = g.worst_text("estimated"), g.worst_text("measured")
        worst = said if not ran or ran == said else ran if not said else f"{said} (measured {ran})"
        notes = [f"not estimated: {g.reason}"] if g.reason else []
        notes += [g.status] if g.status else []
        rows.append([
            g.label,
            worst,
            format_bytes(estimated) if estimated is not None else "",
            format_bytes(measured) if measured is not None else "",
            _fits(measured if measured is not None else estimated, budget_bytes),
            "; ".join(notes),
        ])  # fmt: skip
    return rows


WORST_COLUMNS = ("GPUs", "worst rank", "estimated", "measured", "fits", "notes")


def worst_html(groups: Sequence[RankGroup], budget_bytes: int | None) -> str:
    """`worst_rows` as a theme-aware HTML table, without columns that are empty in every row."""
    rows = worst_rows(groups, budget_bytes)
    keep = [i for i, _ in enumerate(WORST_COLUMNS) if i == 0 or any(r[i] for r in rows)]
    pad = "padding:0 .7em;text-align:left;vertical-align:top"
    head = "".join(
        f'<th style="{pad};white-space:nowrap">{html.escape(WORST_COLUMNS[i])}</th>' for i in keep
    )
    over = ' style="color:var(--jp-error-color1,#c62828)"'
    body = "".join(
        f"<tr{over if r[4] == 'no' else ''}>"
        + "".join(
            f'<td style="{pad}{";white-space:nowrap" if i < 5 else ""}">{html.escape(r[i])}</td>'
            for i in keep
        )
        + "</tr>"
        for r in rows
    )
    style = (
        "font-family:var(--jp-code-font-family,monospace);font-size:var(--jp-code-font-size,12px);"
        "border-collapse:collapse"
    )
    return (
        f'<table class="jp-gpumem-rank-table" style="{style}">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


class RankChart:
    """Each rank's peak per choice of GPUs against the budget; ``widget`` is empty until drawn."""

    def __init__(self) -> None:
        self.x = LinearScale(min=-0.6, max=0.6)
        self.y = LinearScale(min=0.0)
        scales = {"x": self.x, "y": self.y}
        self.estimated = Scatter(x=[], y=[], scales=scales, colors=[COLORS["rank"]],
                                 default_size=56, stroke_width=0)  # fmt: skip
        self.measured = Scatter(x=[], y=[], scales=scales, colors=[COLORS["rank"]],
                                fill=False, default_size=150, stroke_width=2)  # fmt: skip
        self.budget = Lines(x=[], y=[], scales=scales, colors=[COLORS["budget"]],
                            line_style="dashed", stroke_width=2)  # fmt: skip
        self.x_axis = Axis(scale=self.x, side="bottom", tick_values=[0], tick_labels={0: ""})
        self.y_axis = Axis(scale=self.y, side="left", tick_format=".3~g", label="peak per GPU")
        self.figure = Figure(
            marks=[self.budget, self.estimated, self.measured],
            axes=[self.x_axis, self.y_axis],
            title="peak per GPU",
            title_style=TITLE_STYLE,
            animation_duration=0,
            fig_margin={"top": 30, "bottom": 36, "left": 64, "right": 16},
            layout=widgets.Layout(height="300px", width="100%"),
        )
        self.legend = widgets.HTML()
        self.table = widgets.HTML(layout=widgets.Layout(margin="30px 0 0 0"))
        self.groups: list[RankGroup] = []
        self.points: list[RankPoint] = []
        self.widget = widgets.HBox()  # children come with the first groups

    def update(
        self, groups: Sequence[RankGroup], budget_bytes: int | None, title: str = "peak per GPU"
    ) -> None:
        """Draw ``groups``; with none, the widget holds nothing."""
        self.groups, self.points = list(groups), rank_points(groups)
        if not self.groups:
            self.widget.children = ()
            return
        top = max([p.peak_bytes for p in self.points] + [budget_bytes or 0])
        unit, scale = _unit(top)
        for mark, kind in ((self.estimated, "estimated"), (self.measured, "measured")):
            shown = [p for p in self.points if p.kind == kind]
            with mark.hold_sync():
                mark.x = [p.x for p in shown]
                mark.y = [p.peak_bytes / scale for p in shown]
                mark.colors = [COLORS["worst" if p.worst else "rank"] for p in shown] or [
                    COLORS["rank"]
                ]
        last = len(self.groups) - 0.5
        with self.budget.hold_sync():
            self.budget.x = [] if budget_bytes is None else [-0.5, last]
            self.budget.y = [] if budget_bytes is None else [budget_bytes / scale] * 2
        self.x.min, self.x.max = -0.5, last
        self.y.max = top / scale * 1.12 if top else 1.0
        self.x_axis.tick_values = list(range(len(self.groups)))
        self.x_axis.tick_labels = {i: g.label for i, g in enumerate(self.groups)}
        self.y_axis.label = f"peak per GPU ({unit})"
        self.figure.title = title
        self.legend.value = legend_html(budget_bytes)
        self.table.value = worst_html(self.groups, budget_bytes)
        if not self.widget.children:
            chart = widgets.VBox(
                [self.figure, self.legend], layout=widgets.Layout(width="60%", min_width="360px")
            )
            self.widget.children = (chart, self.table)
