"""The timeline drawn as a bqplot figure and as a static SVG; the tuner's per-rank chart."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("bqplot")

from bqplot import Label, Lines, Scatter

from jupyter_gpumem.analysis.timeline import PhaseBand, Timeline
from jupyter_gpumem.report.svg import LEGEND_TEXT, PHASE_COLORS, SERIES_COLORS, timeline_svg
from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.results import TrialResult
from jupyter_gpumem.widgets.charts import TimelineFigure, timeline_figure
from jupyter_gpumem.widgets.rank_chart import (
    COLORS,
    RankChart,
    RankGroup,
    RankPoint,
    gpu_choices,
    rank_groups,
    rank_points,
    worst_rows,
)

GiB, MiB = 2**30, 2**20
SVG = "{http://www.w3.org/2000/svg}"

TRAIN = Timeline(
    t_s=(0.0, 0.1, 0.2, 0.3, 0.4),
    allocated_bytes=(1 * GiB, 2 * GiB, 3 * GiB, 2 * GiB, 1 * GiB),
    reserved_bytes=(2 * GiB, 3 * GiB, 4 * GiB, 4 * GiB, 4 * GiB),
    bands=(
        PhaseBand(0.0, 0.15, "forward", 0),
        PhaseBand(0.15, 0.3, "backward", 0),
        PhaseBand(0.3, 0.35, "optimizer", 0),
        PhaseBand(0.35, 0.4, "forward", 1),
    ),
    peak_t_s=0.2,
    peak_bytes=3 * GiB,
)


def marks_by_label(fig: object) -> dict[str, Lines]:
    return {m.labels[0]: m for m in fig.marks if isinstance(m, Lines)}  # type: ignore[attr-defined]


def test_figure_has_lines_bands_and_peak_in_gib() -> None:
    fig = timeline_figure(TRAIN)
    lines = marks_by_label(fig)
    assert list(lines) == ["forward", "backward", "optimizer", "reserved", "allocated", "peak"]
    assert list(lines["allocated"].x) == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert list(lines["allocated"].y) == [1.0, 2.0, 3.0, 2.0, 1.0]
    assert list(lines["reserved"].y) == [2.0, 3.0, 4.0, 4.0, 4.0]
    assert lines["reserved"].line_style == "dashed"
    top = fig.axes[1].scale.max
    assert top == pytest.approx(4.0 * 1.3)  # headroom for the peak label above the curves
    # one band line per phase, covering each of its stretches up to the top of the axis
    assert list(lines["forward"].x) == [0.0, 0.0, 0.15, 0.15, 0.35, 0.35, 0.4, 0.4]
    assert list(lines["forward"].y) == [0.0, top, top, 0.0] * 2
    assert lines["forward"].fill == "bottom"
    assert list(lines["backward"].fill_colors) == [PHASE_COLORS["backward"]]
    (peak,) = [m for m in fig.marks if isinstance(m, Scatter)]
    assert (list(peak.x), list(peak.y)) == ([0.2], [3.0])
    (label,) = [m for m in fig.marks if isinstance(m, Label)]
    assert list(label.text) == ["peak 3.00 GiB at 200 ms"]
    # the label hangs from the top edge, in the headroom above every curve (reserved ends at
    # 4.0 = 77% of the axis), joined to the point by a leader that stops short of it
    assert (list(label.x), list(label.y), label.y_offset) == ([0.2], [top], 13)
    assert (list(lines["peak"].x), list(lines["peak"].y)) == ([0.2, 0.2], [3.0, 0.88 * top])
    assert not lines["peak"].display_legend
    assert fig.axes[1].label == "memory (GiB)"
    assert fig.axes[0].label == "time (s)"
    assert fig.layout.height == "220px"


def test_figure_uses_mib_below_one_gib_and_groups_unknown_phases_as_other() -> None:
    tl = Timeline(
        t_s=(0.0, 1.0),
        allocated_bytes=(0, 512 * MiB),
        reserved_bytes=(0, 600 * MiB),
        bands=(PhaseBand(0.0, 1.0, "warmup", 0),),
        peak_t_s=1.0,
        peak_bytes=512 * MiB,
    )
    fig = timeline_figure(tl)
    lines = marks_by_label(fig)
    assert list(lines["allocated"].y) == [0.0, 512.0]
    assert fig.axes[1].label == "memory (MiB)"
    assert "other" in lines


def test_empty_timeline_has_no_peak_marker() -> None:
    empty = Timeline((), (), (), (), 0.0, 0)
    fig = timeline_figure(empty)
    assert not [m for m in fig.marks if isinstance(m, (Scatter, Label))]
    root = ET.fromstring(timeline_svg(empty))
    assert root.find(f"{SVG}circle") is None


def points(d: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in re.findall(r"([\d.]+),([\d.]+)", d)]


def test_svg_is_well_formed_with_a_path_per_series_and_the_peak_marked() -> None:
    svg = timeline_svg(TRAIN, width=640, height=180)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    assert (root.get("width"), root.get("height")) == ("640", "180")
    paths = {p.get("data-series"): p for p in root.iter(f"{SVG}path") if p.get("data-series")}
    assert set(paths) == {"allocated", "reserved"}
    allocated = points(paths["allocated"].get("d", ""))
    assert len(allocated) == len(TRAIN.t_s)
    assert "stroke-dasharray" in paths["reserved"].attrib
    (circle,) = root.iter(f"{SVG}circle")
    peak_index = TRAIN.t_s.index(TRAIN.peak_t_s)
    assert (float(circle.get("cx", "")), float(circle.get("cy", ""))) == allocated[peak_index]
    # the peak is the highest point of the allocated line (smallest y in SVG)
    assert allocated[peak_index][1] == min(y for _, y in allocated)
    labels = [t.text for t in root.iter(f"{SVG}text")]
    assert "peak 3.00 GiB at 200 ms" in labels
    assert {"allocated", "reserved", "forward", "backward", "optimizer"} <= set(labels)
    bands = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "band"]
    assert [b.get("data-phase") for b in bands] == ["forward", "forward", "backward", "optimizer"]
    assert all(0 < float(b.get("width", "")) for b in bands)


def test_svg_escapes_all_text() -> None:
    nasty = '<script>alert("x")</script> & co'
    tl = Timeline(
        t_s=(0.0, 1.0),
        allocated_bytes=(0, MiB),
        reserved_bytes=(0, MiB),
        bands=(PhaseBand(0.0, 1.0, nasty, 0),),
        peak_t_s=1.0,
        peak_bytes=MiB,
    )
    svg = timeline_svg(tl, title=nasty)
    assert "<script" not in svg
    root = ET.fromstring(svg)
    assert root.get("aria-label") == nasty
    assert root.find(f"{SVG}title").text.startswith(nasty)  # type: ignore[union-attr]
    band_titles = [t.text for r in root.iter(f"{SVG}rect") for t in r.iter(f"{SVG}title")]
    assert band_titles == [f"{nasty}, step 0"]


def test_svg_rejects_a_size_too_small_to_draw() -> None:
    with pytest.raises(ValueError, match="width >= 160 and height >= 80"):
        timeline_svg(TRAIN, width=100)


CPU = Timeline(
    t_s=(0.0, 0.1, 0.2, 0.3),
    allocated_bytes=(MiB, 6 * MiB, 3 * MiB, 2 * MiB),
    reserved_bytes=(MiB, 6 * MiB, 3 * MiB, 2 * MiB),  # the CPU source: reserved is allocated
    bands=(PhaseBand(0.0, 0.3, "forward", 0),),
    peak_t_s=0.1,
    peak_bytes=6 * MiB,
)


def test_reserved_is_drawn_and_listed_only_when_it_differs_from_allocated() -> None:
    assert "reserved" not in marks_by_label(timeline_figure(CPU))
    root = ET.fromstring(timeline_svg(CPU))
    series = [p.get("data-series") for p in root.iter(f"{SVG}path") if p.get("data-series")]
    assert series == ["allocated"]
    assert "reserved" not in [t.text for t in root.iter(f"{SVG}text")]
    no_reserved = Timeline(
        CPU.t_s, CPU.allocated_bytes, (), CPU.bands, CPU.peak_t_s, CPU.peak_bytes
    )
    assert "reserved" not in [
        t.text for t in ET.fromstring(timeline_svg(no_reserved)).iter(f"{SVG}text")
    ]


@pytest.mark.parametrize("timeline", [TRAIN, CPU], ids=["gpu", "cpu"])
def test_svg_peak_label_sits_above_the_plot_area_with_a_leader(timeline: Timeline) -> None:
    root = ET.fromstring(timeline_svg(timeline, width=640, height=180))
    axis = next(p for p in root.iter(f"{SVG}path") if p.get("class") == "axis")
    plot_top = float(re.findall(r"[\d.]+", axis.get("d", ""))[1])
    (label,) = [t for t in root.iter(f"{SVG}text") if t.get("class") == "peak-label"]
    assert float(label.get("y", "")) < plot_top  # above every curve, whatever their shape
    (circle,) = root.iter(f"{SVG}circle")
    (leader,) = [p for p in root.iter(f"{SVG}path") if p.get("class") == "peak-leader"]
    x, top, bottom = (float(v) for v in re.findall(r"[\d.]+", leader.get("d", "")))
    assert x == float(circle.get("cx", "")) == float(label.get("x", ""))
    assert top < plot_top and bottom < float(circle.get("cy", ""))
    legend = [t for t in root.iter(f"{SVG}text") if t.text in ("allocated", "forward")]
    assert all(float(t.get("y", "")) < float(label.get("y", "")) for t in legend)  # own row


def legend_items(fig: TimelineFigure) -> list[tuple[str, str]]:
    """(label, swatch style) of each entry of the figure's HTML legend."""
    root = ET.fromstring(fig.legend.value)
    return [(item[0].tail or "", item[0].get("style", "")) for item in root]


def test_legend_is_html_under_the_figure_in_the_text_colour_with_solid_swatches() -> None:
    fig = timeline_figure(TRAIN)
    # bqplot would draw it over the curves, faded like the band lines: no mark shows one there.
    assert not [m for m in fig.marks if m.display_legend]
    assert fig.widget.children == (fig, fig.legend)
    # display(fig) shows the figure with its legend under it
    bundle = fig._repr_mimebundle_()
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == fig.widget.model_id
    root = ET.fromstring(fig.legend.value)
    assert f"color:{LEGEND_TEXT}" in root.get("style", "")
    items = legend_items(fig)
    assert [label for label, _ in items] == [
        "allocated",
        "reserved",
        "forward",
        "backward",
        "optimizer",
    ]
    styles = dict(items)
    assert f"solid {SERIES_COLORS['allocated']}" in styles["allocated"]
    assert f"dashed {SERIES_COLORS['reserved']}" in styles["reserved"]
    for phase in ("forward", "backward", "optimizer"):
        assert f"background:{PHASE_COLORS[phase]}" in styles[phase]
    assert not [style for style in styles.values() if "opacity" in style]


def test_legend_lists_what_is_drawn() -> None:
    assert [label for label, _ in legend_items(timeline_figure(CPU))] == ["allocated", "forward"]
    empty = timeline_figure(Timeline((), (), (), (), 0.0, 0))
    assert legend_items(empty) == []


FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_cpu_fixture_timeline_draws_one_series() -> None:
    """The recorded CPU report (shared with the labextension's tests): reserved is allocated."""
    report = json.loads((FIXTURES / "report_cpu_training_step.json").read_text())
    raw = report["devices"][0]["timeline"]
    tl = Timeline(
        tuple(raw["t_s"]),
        tuple(raw["allocated_bytes"]),
        tuple(raw["reserved_bytes"]),
        tuple(PhaseBand(b["start_s"], b["end_s"], b["phase"], b["step"]) for b in raw["bands"]),
        raw["peak_t_s"],
        raw["peak_bytes"],
    )
    assert tl.reserved_bytes == tl.allocated_bytes
    fig = timeline_figure(tl)
    assert "reserved" not in marks_by_label(fig)
    assert [label for label, _ in legend_items(fig)] == [
        "allocated",
        "forward",
        "backward",
        "optimizer",
    ]
    (label,) = [m for m in fig.marks if isinstance(m, Label)]
    assert label.align == "end"  # the peak comes at 95% of the cell: the label ends at it


# -- the tuner's per-rank chart ("Will it fit on N GPUs?") -------------------------------------


def estimate(config: Config, *peaks: int | None, reason: str | None = None) -> Estimate:
    """An estimate of ``config`` whose ranks peak at ``peaks`` (one figure: no ranks)."""

    def one(peak: int | None, rank: int | None, ranks: tuple[Estimate, ...] = ()) -> Estimate:
        return Estimate(str(config), "cuda:0", peak, peak, None, None, reason, config=config,
                        rank=rank, ranks=ranks)  # fmt: skip

    if len(peaks) == 1:
        return one(peaks[0], None)
    ranks = tuple(one(p, r) for r, p in enumerate(peaks))
    known = [p for p in peaks if p is not None]
    return one(max(known) if known else None, None, ranks)


def measured(config: Config, *peaks: int | None, status: str = "ok") -> TrialResult:
    """A measurement of ``config``: rank 1 has ``status`` when it is not ok."""

    def one(peak: int | None, rank: int | None, st: str = "ok") -> TrialResult:
        error = None if st == "ok" else "CUDA out of memory <b>"
        return TrialResult(config, str(config), st, error, peak, peak, None, 0.1, (0.1,), (),
                           rank=rank)  # fmt: skip

    if len(peaks) == 1:
        return one(peaks[0], None)
    ranks = tuple(one(p, r, status if r == 1 else "ok") for r, p in enumerate(peaks))
    top = max(p for p in peaks if p is not None)
    return replace(one(top, None, status), ranks=ranks)


X = "\N{MULTIPLICATION SIGN}"  # as Config labels its ranks
BASE = Config(checkpoint="blocks")
DDP2 = replace(BASE, parallel="ddp", world_size=2)
FSDP2 = replace(BASE, parallel="fsdp2", world_size=2)
FSDP4 = replace(BASE, parallel="fsdp2", world_size=4)


def test_gpu_choices_are_one_gpu_once_then_each_count_with_each_strategy() -> None:
    choices = gpu_choices(replace(FSDP4, precision="bf16"), (4, 1, 2), ("fsdp2", "ddp"))
    assert [(c.parallel, c.world_size) for c in choices] == [
        (None, 1), ("fsdp2", 2), ("ddp", 2), ("fsdp2", 4), ("ddp", 4)
    ]  # fmt: skip
    assert {c.single for c in choices} == {replace(BASE, precision="bf16")}  # the same techniques
    assert [c.world_size for c in gpu_choices(Config(), [8], "ddp")] == [8]
    assert gpu_choices(Config(), (1,), ()) == [Config()]
    for counts in ((), (0, 2), (2.0,), (True,), "1248"):
        with pytest.raises(ValueError, match=r"whole numbers >= 1, e\.g\. \(1, 2, 4, 8\)"):
            gpu_choices(Config(), counts)  # type: ignore[arg-type]  # bad on purpose
    with pytest.raises(ValueError, match="strategies are some of ddp, fsdp2; got 'zero3'"):
        gpu_choices(Config(), (2,), ("zero3",))
    with pytest.raises(ValueError, match="got none"):
        gpu_choices(Config(), (2,), ())


def test_groups_take_each_ranks_estimate_and_the_runs_of_the_same_techniques() -> None:
    estimates = [
        estimate(BASE, 90 * MiB),
        estimate(DDP2, 95 * MiB, 95 * MiB),
        estimate(FSDP2, 50 * MiB, 61 * MiB),
        estimate(FSDP4, None, reason="fsdp2 needs <a GPU>"),
        estimate(replace(DDP2, optimizer="sgd"), 1 * MiB, 1 * MiB),  # other techniques: left out
    ]
    results = [
        measured(FSDP2, 40 * MiB, 44 * MiB),  # replaced by the later run of fsdp2 on 2 GPUs
        measured(FSDP2, 52 * MiB, 60 * MiB),
        measured(replace(DDP2, precision="bf16"), 1 * MiB, 1 * MiB),  # other techniques: left out
        measured(replace(BASE, parallel="ddp", world_size=8), *(70 * MiB,) * 8, status="oom"),
    ]
    groups = rank_groups(estimates, results, BASE)
    assert [g.label for g in groups] == [
        "1 GPU",
        f"ddp {X} 2",
        f"fsdp2 {X} 2",
        f"fsdp2 {X} 4",
        f"ddp {X} 8",
    ]
    one, ddp, fsdp, failed, oom = groups
    assert (one.estimated, one.measured, one.world_size) == ((90 * MiB,), (), 1)
    assert ddp.estimated == (95 * MiB, 95 * MiB) and ddp.worst("estimated") == ()  # alike
    assert ddp.worst_text("estimated") == "all" and one.worst_text("estimated") == ""
    assert (fsdp.estimated, fsdp.measured) == ((50 * MiB, 61 * MiB), (52 * MiB, 60 * MiB))
    assert fsdp.worst("estimated") == fsdp.worst("measured") == (1,)
    assert (fsdp.peak("estimated"), fsdp.peak("measured")) == (61 * MiB, 60 * MiB)
    assert (failed.estimated, failed.reason, failed.worst("estimated")) == (
        (), "fsdp2 needs <a GPU>", ()
    )  # fmt: skip
    assert oom.estimated == () and oom.measured == (70 * MiB,) * 8
    assert oom.status == "rank 1 oom: CUDA out of memory <b>"
    assert rank_groups(estimates, results, None) == []  # nothing tried on GPUs yet


def test_points_spread_each_groups_ranks_around_its_centre_and_mark_the_worst() -> None:
    groups = [
        RankGroup("1 GPU", 1, (90,), (88,)),
        RankGroup(f"fsdp2 {X} 2", 2, (50, 61), (52, None)),
        RankGroup(f"fsdp2 {X} 8", 8, tuple(range(10, 18))),
        RankGroup(f"ddp {X} 4", 4, (30, 31, 31, 30)),
        RankGroup(f"ddp {X} 8", 8, (20,) * 8),
    ]
    points = rank_points(groups)
    est = [p for p in points if p.kind == "estimated"]
    assert [(p.group, p.rank, p.peak_bytes, p.worst) for p in est[:3]] == [
        ("1 GPU", 0, 90, False), (f"fsdp2 {X} 2", 0, 50, False), (f"fsdp2 {X} 2", 1, 61, True)
    ]  # fmt: skip  # one rank is no worse than itself
    assert [p.x for p in est[:3]] == pytest.approx([0.0, 0.92, 1.08])
    eight = [p.x for p in est if p.group == f"fsdp2 {X} 8"]
    assert eight == pytest.approx([2 - 0.35 + 0.1 * r for r in range(8)])  # 0.7 wide at most
    # the worst where ranks differ, each of them on ties; none where all peak alike
    assert [(p.group, p.rank) for p in est if p.worst] == [
        (f"fsdp2 {X} 2", 1), (f"fsdp2 {X} 8", 7), (f"ddp {X} 4", 1), (f"ddp {X} 4", 2)
    ]  # fmt: skip
    runs = [p for p in points if p.kind == "measured"]
    assert runs == [  # a rank without a figure has no point; the outlined one sits on its estimate
        RankPoint(0.0, 88, "measured", 0, False, "1 GPU"),
        RankPoint(pytest.approx(0.92), 52, "measured", 0, False, f"fsdp2 {X} 2"),  # type: ignore[arg-type]
    ]


def test_chart_draws_filled_estimates_outlined_runs_the_worst_in_red_and_the_budget() -> None:
    chart = RankChart()
    assert chart.widget.children == ()  # nothing shown before anything is estimated or run
    groups = rank_groups(
        [estimate(BASE, 90 * MiB), estimate(FSDP2, 50 * MiB, 61 * MiB)],
        [measured(FSDP2, 52 * MiB, 60 * MiB)],
        BASE,
    )
    chart.update(groups, 64 * MiB, "peak per GPU: ckpt blocks")
    assert len(chart.widget.children) == 2  # the figure with its legend, the table beside
    assert chart.figure.title == "peak per GPU: ckpt blocks"
    assert chart.estimated.fill and not chart.measured.fill
    assert list(chart.estimated.y) == [90.0, 50.0, 61.0]  # MiB
    assert list(chart.estimated.colors) == [COLORS["rank"], COLORS["rank"], COLORS["worst"]]
    assert list(chart.measured.y) == [52.0, 60.0]
    assert list(chart.measured.x) == list(chart.estimated.x)[1:]  # on their estimates
    assert list(chart.measured.colors) == [COLORS["rank"], COLORS["worst"]]
    assert (list(chart.budget.x), list(chart.budget.y)) == ([-0.5, 1.5], [64.0, 64.0])
    assert chart.budget.line_style == "dashed"
    assert (chart.x.min, chart.x.max) == (-0.5, 1.5)
    assert chart.y.max == pytest.approx(90 * 1.12)  # headroom above the highest point
    assert list(chart.x_axis.tick_values) == [0, 1]
    assert chart.x_axis.tick_labels == {0: "1 GPU", 1: f"fsdp2 {X} 2"}
    assert chart.y_axis.label == "peak per GPU (MiB)"
    legend = re.sub(r"<[^>]+>", " ", chart.legend.value).split()
    assert " ".join(legend) == (
        "estimated measured worst rank, where ranks differ budget 64.0 MiB per GPU"
    )
    assert worst_rows(chart.groups, 64 * MiB) == [
        ["1 GPU", "", "90.0 MiB", "", "no", ""],
        [f"fsdp2 {X} 2", "1", "61.0 MiB", "60.0 MiB", "yes", ""],  # fits: judged by the measurement
    ]
    table = chart.table.value
    assert "notes" not in table  # a column empty in every row is left out
    assert table.count("<tr style=") == 1  # the row that does not fit, in the error colour

    chart.update(groups, None)  # no budget: no line, nothing fits or not
    assert (list(chart.budget.x), list(chart.budget.y)) == ([], [])
    assert "budget" not in chart.legend.value and "fits" not in chart.table.value
    chart.update([], None)
    assert chart.widget.children == ()


def test_chart_scales_to_the_budget_in_gib_and_escapes_reasons() -> None:
    chart = RankChart()
    groups = rank_groups(
        [estimate(BASE, 3 * GiB), estimate(FSDP4, None, reason="<script>x</script>")],
        [measured(replace(BASE, parallel="ddp", world_size=8), *(5 * GiB,) * 8, status="oom")],
        BASE,
    )
    chart.update(groups, 16 * GiB)
    assert chart.y_axis.label == "peak per GPU (GiB)"
    assert chart.y.max == pytest.approx(16 * 1.12)  # the budget line stays in the plot
    assert list(chart.estimated.y) == [3.0] and list(chart.measured.y) == [5.0] * 8
    assert chart.x_axis.tick_labels == {0: "1 GPU", 1: f"fsdp2 {X} 4", 2: f"ddp {X} 8"}
    rows = worst_rows(chart.groups, 16 * GiB)
    assert rows[1] == [f"fsdp2 {X} 4", "", "", "", "", "not estimated: <script>x</script>"]
    assert rows[2][1] == "all"  # every rank peaks alike
    assert rows[2][4:] == ["yes", "rank 1 oom: CUDA out of memory <b>"]
    table = chart.table.value
    assert "<script>" not in table and "&lt;script&gt;x&lt;/script&gt;" in table
    assert "<b>" not in table and "memory &lt;b&gt;" in table
