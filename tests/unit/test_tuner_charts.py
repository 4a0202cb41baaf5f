"""The tuner's table and charts from plain rows: readable at any width, nothing clipped or hidden."""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("bqplot")

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.widgets.chart_labels import WIDTH, chart_label, cut, numbered
from jupyter_gpumem.widgets.plan_view import CPU_STEPS, choice_line, plan_html
from jupyter_gpumem.widgets.tuner_charts import (
    CATEGORY_COLORS,
    BreakdownChart,
    TradeoffChart,
    rows_html,
    rows_text,
)

MiB = 2**20
ROWS: list[dict[str, Any]] = [
    {
        "configuration": "baseline", "status": "ok", "peak_bytes": 107 * MiB, "step_ms": 1121.0,
        "delta_peak_bytes": 0, "delta_peak_pct": 0.0, "delta_step_pct": 0.0, "fits_budget": None,
        "breakdown": {"activations": 70 * MiB, "optimizer_state": 16 * MiB, "temporary": 10 * MiB,
                      "parameters": 8 * MiB},
        "warnings": (),
    },
    {
        "configuration": "ckpt blocks · bf16 · sgd", "status": "ok", "peak_bytes": 11324621,
        "step_ms": 927.0, "delta_peak_bytes": -83 * MiB, "delta_peak_pct": -78.0,
        "delta_step_pct": 47.0, "fits_budget": None,
        "breakdown": {"temporary": 13 * MiB, "parameters": 4 * MiB, "gradients": 3 * MiB},
        "warnings": (),
    },
]  # fmt: skip


def test_text_wraps_between_words_and_keeps_each_size_whole() -> None:
    text = rows_text(ROWS)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 110  # fits a notebook's output area
    assert "activations 70.0 MiB," in text and "optimizer state 16.0 MiB," in text
    assert not re.search(r"\d\s*$", "\n".join(line.rstrip() for line in lines))  # no "70.0" / "MiB"
    base = [line for line in lines if line.startswith("baseline")]
    assert len(base) == 1 and "activations 70.0 MiB," in base[0]
    following = lines[lines.index(base[0]) + 1]
    assert following.startswith(" " * 20) and "optimizer state 16.0 MiB," in following


def test_columns_empty_in_every_row_are_left_out() -> None:
    head = rows_text(ROWS).splitlines()[0]
    assert "notes" not in head and "fits budget" not in head  # no warnings, no budget
    page = rows_html(ROWS)
    assert ">notes<" not in page and ">fits budget<" not in page
    warned = [{**ROWS[0], "warnings": ("no training steps were recognised",), "fits_budget": True}]
    assert rows_text(warned).splitlines()[0].split()[-3:] == ["fits", "budget", "notes"]
    assert ">notes<" in rows_html(warned) and ">yes<" in rows_html(warned)


def test_html_numbers_and_headers_never_wrap() -> None:
    page = rows_html(ROWS)
    for text in ("107 MiB", "1121 ms", "-83.0 MiB -78%", "+47%", "Δ peak", "Δ step", "peak"):
        cell = re.search(rf'<t[dh] style="([^"]*)">{re.escape(text)}</t[dh]>', page)
        assert cell is not None and "white-space:nowrap" in cell.group(1), text
    # a breakdown cell may wrap, but only between its items
    assert "activations\u00a070.0\u00a0MiB, optimizer\u00a0state\u00a016.0\u00a0MiB" in page


def test_tradeoff_scales_reach_past_the_points_and_their_names() -> None:
    chart = TradeoffChart()
    chart.update(ROWS)
    xs, ys = list(chart.points.x), list(chart.points.y)
    assert (xs, ys) == ([0.0, 47.0], [0.0, 83.0])
    span = 47.0
    assert chart.x.min <= -0.08 * span and chart.x.max >= 47.0 + 0.3 * span  # room for the name
    assert chart.y.min < 0.0 and chart.y.max > 83.0 * 1.1


def test_breakdown_legend_is_html_outside_the_plot_in_the_page_colour() -> None:
    chart = BreakdownChart()
    chart.update(ROWS)
    assert chart.bars.display_legend is False  # nothing drawn over the bars
    assert list(chart.widget.children) == [chart.figure, chart.legend, chart.names]
    legend = chart.legend.value
    assert "color:inherit" in legend
    for category in ("activations", "optimizer state", "temporary", "parameters", "gradients"):
        assert f"</span>{category}</span>" in legend
    assert CATEGORY_COLORS["activations"] in legend
    # level names on the left, wide enough for the longest one; the first row on top
    assert chart.bars.orientation == "horizontal" and chart.x.reverse
    assert chart.figure.fig_margin["left"] >= 7 * len("ckpt blocks · bf16 · sgd")


def test_breakdown_longest_bar_ends_inside_the_plot_and_titles_follow_the_theme() -> None:
    chart = BreakdownChart()
    chart.update(ROWS)
    longest = max(sum(column) for column in zip(*chart.bars.y, strict=True))
    assert chart.y.max is not None and longest < chart.y.max <= longest * 1.1
    assert chart.figure.title_style["fill"] == "var(--jp-ui-font-color1)"
    chart.update([])
    assert chart.y.max is None


PLAN: dict[str, Any] = {
    "budget_bytes": 12 * 2**30,
    "checkpoint": ["transformer.h.0", "transformer.h.1"],
    "blocks": [f"transformer.h.{i}" for i in range(12)],
    "precision": None,
    "optimizer": "adamw-fused",
    "fits": True,
    "predicted_peak_bytes": 11 * 2**30,
    "predicted_step_s": 0.2068,
    "measured_peak_bytes": 11 * 2**30 + 300 * MiB,
    "measured_step_s": 0.2071,
    "measured_fits": True,
    "reasoning": ["Budget: 12.0 GiB.", "Plan: <checkpoint> 2 of 12 blocks & more."],
}


def test_plan_shows_prediction_beside_measurement() -> None:
    page = plan_html(PLAN)
    cells = re.findall(r"<t[hd][^>]*>([^<]*)</t[hd]>", page)
    assert cells[:3] == ["", "predicted", "measured"]
    assert cells[3:6] == ["peak", "11.0 GiB", "11.3 GiB"]
    assert cells[6:9] == ["step", "207 ms", "207 ms"]
    assert cells[9:12] == ["fits 12.0 GiB", "yes", "yes"]
    first = re.search(r"<b>([^<]*)</b>", page)
    assert first is not None and first.group(1) == (
        "Fit to budget chose: checkpoint h.0-h.1 (2 of 12 blocks), precision kept (as is); "
        "optimizer yours → adamw-fused"
    )
    assert "&lt;checkpoint&gt; 2 of 12 blocks &amp; more." in page and "<checkpoint>" not in page
    unmeasured = plan_html({**PLAN, "measured_peak_bytes": None, "measured_fits": None})
    assert "not measured" in unmeasured


BLOCKS = [f"transformer.h.{i}" for i in range(12)]


def test_chart_labels_are_short_and_never_cut_at_their_start() -> None:
    two = Config(checkpoint=("transformer.h.0", "transformer.h.1"), optimizer="sgd-momentum")
    assert str(two) == "ckpt transformer.h.0,transformer.h.1 · sgd-momentum"  # the table's
    assert chart_label(two, BLOCKS) == "ckpt h.0-h.1 · sgd-momentum"
    four = Config(checkpoint=tuple(BLOCKS[:4]), precision="bf16-autocast")
    assert chart_label(four, BLOCKS) == "ckpt h.0-h.3 · bf16-autocast"
    scattered = Config(checkpoint=tuple(BLOCKS[::2]), optimizer="sgd-momentum")
    assert chart_label(scattered, BLOCKS) == "ckpt 6 blocks · sgd-momentum"
    assert chart_label(Config(checkpoint=("transformer.wte",)), BLOCKS) == "ckpt transformer.wte"
    assert chart_label(Config(checkpoint="blocks", every=2), BLOCKS) == "ckpt blocks every 2"
    assert chart_label(Config()) == "baseline"
    many = Config(checkpoint=tuple(BLOCKS), precision="bf16-autocast", optimizer="adamw-fused")
    plan = chart_label(many, BLOCKS, "plan · ")
    assert plan.startswith("plan · ckpt h.0-h.11") and plan.endswith("…") and len(plan) == WIDTH
    assert cut("x" * 40).startswith("x" * 27) and cut("short") == "short"
    assert numbered(["baseline", "sgd", "baseline"]) == ["baseline", "sgd", "baseline #2"]


def test_breakdown_names_bars_by_chart_label_with_the_full_one_under_the_legend() -> None:
    long_row = {**ROWS[1], "configuration": "ckpt transformer.h.0,transformer.h.1 · sgd-momentum",
                "chart_label": "ckpt h.0-h.1 · sgd-momentum"}  # fmt: skip
    unlabelled = {**ROWS[1], "configuration": "/transformer\\.h\\.[0-9]+\\.attn/ · lion-8bit"}
    chart = BreakdownChart()
    chart.update([ROWS[0], long_row, unlabelled])
    assert list(chart.bars.x) == [
        "baseline",
        "ckpt h.0-h.1 · sgd-momentum",
        "/transformer\\.h\\.[0-9]+\\.at…",  # cut at its end, never its start
    ]
    assert all(len(x) <= WIDTH for x in chart.bars.x)
    assert chart.figure.fig_margin["left"] >= 7 * WIDTH <= 220  # the longest fits the margin
    names = chart.names.value
    assert "<b>ckpt h.0-h.1 · sgd-momentum</b>: ckpt transformer.h.0,transformer.h.1" in names
    assert "baseline</b>" not in names  # shown whole: no need to spell it out
    tradeoff = TradeoffChart()
    tradeoff.update([ROWS[0], long_row])
    assert list(tradeoff.points.names) == ["baseline", "ckpt h.0-h.1 · sgd-momentum"]


def test_breakdown_draws_the_budget_as_a_dashed_line_inside_the_plot() -> None:
    chart = BreakdownChart()
    chart.update(ROWS)
    assert list(chart.budget.x) == [] and "budget" not in chart.legend.value
    chart.update(ROWS, 150 * MiB)  # beyond the longest bar: the scale reaches past it
    assert list(chart.budget.x) == [150.0, 150.0] and list(chart.budget.y) == [0.0, 1.0]
    assert chart.budget.scales["x"] is chart.y and chart.budget.line_style == "dashed"
    assert chart.y.max is not None and 150.0 < chart.y.max <= 150.0 * 1.1
    assert "budget 150 MiB" in chart.legend.value and "dashed" in chart.legend.value
    chart.update(ROWS, 12 * MiB)
    assert list(chart.budget.x) == [12.0, 12.0]
    assert chart.y.max is not None and chart.y.max > 107.0  # the bars still fit
    chart.update([], 12 * MiB)  # nothing to draw against
    assert list(chart.budget.x) == []


def test_fit_says_what_it_chose_and_what_it_kept_first() -> None:
    config = Config(checkpoint=tuple(BLOCKS[:4]), precision="bf16-autocast")
    assert choice_line(config, blocks=BLOCKS, precision_now="fp32", optimizer_now="adamw") == (
        "Fit to budget chose: checkpoint h.0-h.3 (4 of 12 blocks), bf16-autocast; "
        "optimizer kept (adamw)"
    )
    swap = Config(optimizer="sgd")
    assert choice_line(swap, precision_now="fp32", optimizer_now="adamw") == (
        "Fit to budget chose: no checkpointing, precision kept (fp32); optimizer adamw → sgd"
    )
    assert choice_line(None).startswith("Fit to budget chose nothing")
    page = plan_html(
        {**PLAN, "optimizer": None}, optimizer_now="adamw", allowed=("checkpoint", "precision")
    )
    assert "; optimizer kept (adamw)</b>" in page
    assert "Fit may not change the optimizer" in page and "tick &#x27;optimizer&#x27;" in page


def test_step_times_far_from_their_prediction_carry_a_caveat() -> None:
    assert "*" not in plan_html(PLAN)  # 207 ms both
    far = plan_html({**PLAN, "predicted_step_s": 0.087, "measured_step_s": 1.25})
    cells = re.findall(r"<t[hd][^>]*>([^<]*)</t[hd]>", far)
    assert cells[6:9] == ["step", "87.0 ms *", "1250 ms"]
    assert "* The measured step took 14 times the predicted time (1250 ms against 87.0 ms)" in far
    assert CPU_STEPS.replace("'", "&#x27;") not in far  # a plan's steps are timed untracked
