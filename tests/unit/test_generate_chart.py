"""A generate map drawn: a square per cell coloured by whether it fits, the frontier's step
line, a tooltip per cell; on a real map of a tiny meta GPT-2 estimated on the CPU."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

pytest.importorskip("bqplot")
pytest.importorskip("transformers")

import ipywidgets as widgets
from bqplot import Figure

from jupyter_gpumem.tuner.estimation.generate_map import GenerateMap
from jupyter_gpumem.units import format_bytes
from jupyter_gpumem.widgets.generate_chart import (
    COLORS,
    LEFT_OUT_OPACITY,
    GenerateChart,
    cells,
    frontier_line,
)

BATCHES = (1, 2, 4, 8, 16)
CONTEXTS = (64, 128, 256, 512, 1024)


def _map(budget: str) -> GenerateMap:
    import torch
    import transformers

    from jupyter_gpumem import generate_map

    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=1024)
    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(config).eval()
    return generate_map(
        meta, max_new_tokens=16, budget=budget, batch_sizes=BATCHES, contexts=CONTEXTS,
        device="cpu", pad_token_id=0,
    )  # fmt: skip


@pytest.fixture(scope="module")
def found() -> GenerateMap:
    """20 MiB: batch 1 fits up to 1024 tokens, 2 up to 512, 4 up to 256, 8 up to 128, 16 none."""
    return _map("20MiB")


def _squares(chart: GenerateChart) -> dict[tuple[int, int], tuple[str, float, str]]:
    """Each square's (colour, opacity, tooltip text) by its (batch, context)."""
    s = chart.squares
    return {
        (int(b), int(c)): (colour, float(opacity), name)
        for c, b, colour, opacity, name in zip(s.x, s.y, s.colors, s.opacities, s.names, strict=True)
    }  # fmt: skip


def test_a_square_per_cell_coloured_by_whether_it_fits(found: GenerateMap) -> None:
    assert found.frontier() == (1024, 512, 256, 128, 0)
    chart = GenerateChart(found)
    squares = _squares(chart)
    assert sorted(squares) == sorted((b, c) for b in BATCHES for c in CONTEXTS)
    for i, b in enumerate(BATCHES):
        for j, c in enumerate(CONTEXTS):
            colour, opacity, _ = squares[b, c]
            fits, estimated = found.fits(i, j), found.estimates[i][j] is not None
            assert fits is not None
            assert colour == COLORS["fits" if fits else "over"], (b, c)
            assert opacity == (1.0 if estimated else LEFT_OUT_OPACITY), (b, c)
    states = [cell.state for cell in cells(found)]
    assert (states.count("fits"), states.count("over"), states.count("left_out")) == (14, 4, 7)
    assert squares[2, 1024][0] == squares[16, 64][0] == COLORS["over"]  # estimated over
    assert squares[16, 1024][1] == LEFT_OUT_OPACITY  # over, as a smaller one is: left out
    # The theme's own colours, so that the squares follow JupyterLab's light and dark themes.
    assert COLORS["fits"].startswith("var(--jp-success-color1")
    assert COLORS["over"].startswith("var(--jp-error-color1")
    assert chart.squares.marker == "square" and chart.squares.display_names is False


def test_axes_are_log_scales_with_a_tick_at_each_value_and_room_for_the_outer_squares(
    found: GenerateMap,
) -> None:
    chart = GenerateChart(found)
    assert list(chart.x_axis.tick_values) == list(CONTEXTS)
    assert list(chart.y_axis.tick_values) == list(BATCHES)
    assert chart.x_axis.tick_format == chart.y_axis.tick_format == "d"
    assert chart.x_axis.label == "total context: prompt + 16 new tokens"
    assert chart.y_axis.label == "batch size"
    # half a doubling past the outermost values on each side
    assert math.isclose(chart.x.min, 64 / math.sqrt(2)) and math.isclose(chart.x.max, 1024 * math.sqrt(2))  # fmt: skip
    assert math.isclose(chart.y.min, 1 / math.sqrt(2)) and math.isclose(chart.y.max, 16 * math.sqrt(2))  # fmt: skip
    # a pitch per value: 5 contexts across, 5 batches up, inside the figure's margins
    margin = chart.figure.fig_margin
    width = int(chart.figure.layout.width.removesuffix("px"))
    height = int(chart.figure.layout.height.removesuffix("px"))
    plot_w = width - margin["left"] - margin["right"]
    plot_h = height - margin["top"] - margin["bottom"]
    side = math.sqrt(chart.squares.default_size)
    assert side < plot_w / 5 and side < plot_h / 5  # squares apart from each other


def test_the_frontier_steps_through_the_longest_fitting_context_of_each_batch(
    found: GenerateMap,
) -> None:
    chart = GenerateChart(found)
    corners = [(1024, 1), (512, 1), (512, 2), (256, 2), (256, 4), (128, 4), (128, 8)]
    assert frontier_line(found) == corners
    assert list(zip(chart.frontier.x, chart.frontier.y, strict=True)) == corners
    points = list(zip(chart.frontier_points.x, chart.frontier_points.y, strict=True))
    assert points == [(1024, 1), (512, 2), (256, 4), (128, 8)]  # batch 16: nothing fits
    squares = _squares(chart)
    assert all(squares[b, c][0] == COLORS["fits"] for c, b in corners)  # only through fits
    assert chart.frontier.colors == [COLORS["frontier"]]


def test_each_tooltip_says_batch_context_peak_kv_cache_and_phase(found: GenerateMap) -> None:
    chart = GenerateChart(found)
    tooltip = chart.squares.tooltip
    assert (tooltip.fields, tooltip.labels) == (
        ["y", "x", "name"],
        ["batch", "context", "estimate"],
    )
    squares = _squares(chart)
    for i, j in ((0, 0), (1, 4), (3, 2), (4, 0)):
        est = found.estimates[i][j]
        assert est is not None and est.peak_bytes is not None and est.breakdown is not None
        verdict = "fits" if found.fits(i, j) else "does not fit"
        assert squares[BATCHES[i], CONTEXTS[j]][2] == (
            f"{verdict}: peak {format_bytes(est.peak_bytes)} in {est.phase}, "
            f"of which KV cache {format_bytes(est.breakdown['kv_cache'])}"
        )
    # a short context peaks in decode, with its cache; a long one in prefill, before it
    assert squares[16, 64][2].startswith("does not fit: peak ") and " in decode, " in squares[16, 64][2]  # fmt: skip
    assert not squares[16, 64][2].endswith("KV cache 0 B")
    assert " in prefill, " in squares[1, 1024][2]
    left_out = "does not fit: not estimated, as a smaller batch or context does not fit"
    assert squares[16, 1024][2] == left_out


def test_the_widget_is_a_title_over_the_figure_over_its_legend(found: GenerateMap) -> None:
    shown: Any = found.chart()
    assert isinstance(shown, widgets.VBox)
    heading, figure, legend = shown.children
    assert isinstance(figure, Figure)
    assert ">generate, 16 new tokens: what fits within 20.0 MiB allocated<" in heading.value
    assert [m.__class__.__name__ for m in figure.marks] == ["Scatter", "Lines", "Scatter"]
    for words in ("fits", "does not fit", "left out: a smaller one does not", "frontier"):
        assert words in legend.value
    assert "no estimate" not in legend.value and "nothing fits" not in legend.value
    assert "var(--jp-ui-font-color1" in heading.value  # the theme's text colour, light or dark


def test_a_budget_that_nothing_fits_draws_no_frontier_and_says_so() -> None:
    none = _map("1MiB")
    assert none.frontier() == (0,) * 5
    chart = GenerateChart(none)
    assert {c.state for c in chart.cells} == {"over", "left_out"}
    assert [c.state for c in chart.cells].count("over") == 1  # only batch 1 at 64 was estimated
    assert set(chart.squares.colors) == {COLORS["over"]}
    assert frontier_line(none) == []
    assert list(chart.frontier.x) == list(chart.frontier.y) == []
    assert list(chart.frontier_points.x) == []
    assert "nothing fits, not even the smallest batch and context" in chart.legend.value
    assert "frontier" not in chart.legend.value
    assert "within 1.00 MiB allocated" in chart.title.value


def test_a_cell_without_an_estimate_is_grey_and_its_tooltip_says_why(found: GenerateMap) -> None:
    failed = dataclasses.replace(
        found.estimates[0][1] or pytest.fail("estimated"),
        peak_bytes=None,
        peak_reserved_bytes=None,
        breakdown=None,
        phase=None,
        reason="generate() raised RuntimeError: <cache & co>",
    )
    grid = [list(row) for row in found.estimates]
    grid[0][1] = failed
    grid[2][0] = None  # not run, and no smaller cell is over: unknown, not over
    odd = dataclasses.replace(found, estimates=tuple(tuple(row) for row in grid))
    assert odd.fits(0, 1) is None and odd.fits(2, 0) is None
    chart = GenerateChart(odd)
    squares = _squares(chart)
    # bqplot sets a tooltip's values as text: the reason is shown as it is, not as markup
    assert squares[1, 128] == (
        COLORS["unknown"], 1.0, "no estimate: generate() raised RuntimeError: <cache & co>"
    )  # fmt: skip
    assert squares[4, 64] == (COLORS["unknown"], 1.0, "not estimated")
    assert squares[1, 64][0] == squares[1, 256][0] == COLORS["fits"]
    assert "no estimate" in chart.legend.value
    assert odd.frontier() == found.frontier()  # the longest fitting context stays
    assert frontier_line(odd) == frontier_line(found)


def test_a_map_judged_on_a_card_names_the_card(found: GenerateMap) -> None:
    on_card = dataclasses.replace(found, budget_bytes=None, card="NVIDIA H100 80GB HBM3")
    chart = GenerateChart(on_card)
    assert "generate, 16 new tokens: what fits on NVIDIA H100 80GB HBM3" in chart.title.value
    # without the card's verdicts nothing is judged: every cell is grey, none said to fit
    assert {c.state for c in chart.cells} == {"unknown"}
    assert set(chart.squares.colors) == {COLORS["unknown"]}
    assert _squares(chart)[1, 64][2].startswith("not judged: peak ")
