"""The timeline drawn as a bqplot figure and as a static SVG."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("bqplot")

from bqplot import Label, Lines, Scatter

from jupyter_gpumem.analysis.timeline import PhaseBand, Timeline
from jupyter_gpumem.report.svg import LEGEND_TEXT, PHASE_COLORS, SERIES_COLORS, timeline_svg
from jupyter_gpumem.widgets.charts import TimelineFigure, timeline_figure

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
