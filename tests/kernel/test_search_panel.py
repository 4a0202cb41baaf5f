"""The tuner's Search: the chart of a real search's front on the tiny GPT on the CPU (points,
budget line, winner, measured winner), and the panel's Search button, Apply and Revert."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

pytest.importorskip("bqplot")

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.planning.joint import Search
from jupyter_gpumem.tuner.trial import Trial
from jupyter_gpumem.units import format_bytes
from jupyter_gpumem.widgets.search_chart import (
    CHANGES_AXIS,
    COLORS,
    COST_AXIS,
    SearchChart,
    changes,
    point_label,
    reasoning_html,
)
from jupyter_gpumem.widgets.tuner import ACCUMULATE_HELP, tune
from jupyter_gpumem.widgets.tuner_panel import SEARCH_BUTTON, SEARCH_NEEDS
from tests.kernel.test_estimate import _gpt, _trained
from tests.kernel.test_search import meta_gpt

BLOCKS = ("blocks.0", "blocks.1")


@pytest.fixture(autouse=True)
def _closed_panels() -> Iterator[None]:
    """An open widget keeps its model alive: close every one a test opened."""
    yield
    import gc

    import ipywidgets

    ipywidgets.Widget.close_all()
    gc.collect()


def _gpt_adam() -> Trial:
    """The tiny GPT trained with Adam: no 8-bit variant keeps its algorithm, so under 40%
    only micro-batches fit."""
    trial = _gpt()
    opt = torch.optim.Adam(trial.model.parameters(), lr=1e-3)
    return Trial(
        trial.model, trial.batch, trial.loss_fn, optimizer=opt, warmup=trial.warmup,
        steps=trial.steps,
    )  # fmt: skip


def _budget(trial: Trial) -> int:
    """40% of the measured baseline: no candidate without gradient accumulation fits."""
    base = trial.run(Config())
    assert base.peak_allocated_bytes is not None
    return int(0.4 * base.peak_allocated_bytes)


@pytest.fixture(scope="module")
def found() -> Search:
    trial = _trained(_gpt_adam())
    return trial.search(_budget(trial))


def _xy(mark: Any) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in zip(mark.x, mark.y, strict=True)]


def _figures(text: str) -> list[str]:
    """The step-time figures in ``text``, as every rendering writes them."""
    return re.findall(r"[+-]\d+%|within noise", text)


def _flat(pairs: list[tuple[float, float]]) -> list[float]:
    """Pairs as one list, which ``pytest.approx`` compares."""
    return [v for pair in pairs for v in pair]


def test_the_chart_draws_the_front_the_budget_and_the_winner_then_its_measurement(
    found: Search,
) -> None:
    assert found.config is not None and found.estimate is not None, found.text()
    base_peak, base_step = found.baseline_peak_bytes, found.baseline_step_s
    assert base_peak is not None and base_step is not None and base_step > 0

    chart = SearchChart()
    marks = chart.update(found, BLOCKS)
    assert not marks.by_changes and chart.x_axis.label == COST_AXIS
    assert marks.title.startswith("memory saved vs step-time cost: ")
    assert f"{len(found.front)} of {found.candidates} candidates" in marks.title

    # One filled point per candidate on the front, at its cost and saving against the baseline;
    # a cost within the noise of the timings it was composed from stands at 0, and says so.
    costs = found.front_changes
    assert len(costs) == len(found.front) >= 2
    for change, (_, _, step) in zip(costs, found.front, strict=True):
        assert change is not None and step is not None
        assert change.pct == pytest.approx(100 * (step - base_step) / base_step)
    expected = [
        (0.0 if change.within_noise else change.pct, 100 * (base_peak - peak) / base_peak)
        for change, (_, peak, _) in zip(costs, found.front, strict=True)
        if change is not None
    ]
    assert _flat(_xy(chart.points)) == pytest.approx(_flat(expected))
    assert list(chart.points.names) == [
        point_label(c, BLOCKS) + (" (step time within noise)" if change.within_noise else "")
        for change, (c, _, _) in zip(costs, found.front, strict=True)
        if change is not None
    ]
    assert chart.points.fill is not False and chart.points.colors == [COLORS["candidate"]]

    # The budget line: the share of the baseline's peak that must go, across the whole plot.
    must_save = 100 * (base_peak - found.budget_bytes) / base_peak
    assert list(chart.budget.y) == pytest.approx([must_save, must_save])
    assert list(chart.budget.x) == [chart.x.min, chart.x.max]
    assert marks.budget_saved_pct == pytest.approx(must_save)

    # The winner: a diamond at its own estimate, named; above the budget line.
    predicted = found.predicted_change
    assert found.predicted_step_s is not None and predicted is not None
    assert predicted.pct == pytest.approx(100 * (found.predicted_step_s - base_step) / base_step)
    winner = (
        0.0 if predicted.within_noise else predicted.pct,
        100 * (base_peak - (found.estimate.peak_bytes or 0)) / base_peak,
    )
    assert _flat(_xy(chart.winner)) == pytest.approx(list(winner))
    assert chart.winner.marker == "diamond" and list(chart.winner.names) == ["winner"]
    assert winner[1] >= must_save
    assert _xy(chart.baseline) == [(0.0, 0.0)]
    # Not measured yet: no outlined point.
    assert list(chart.measured.x) == [] and marks.measured is None
    assert "winner measured" not in chart.legend.value

    result = found.verify()
    assert result.status == "ok" and result.peak_allocated_bytes is not None
    assert result.step_s is not None
    marks = chart.update(found, BLOCKS)
    change = found.measured_change  # against the baseline's timed steps in the search
    assert change is not None
    assert change.pct == pytest.approx(100 * (result.step_s - base_step) / base_step)
    measured = (
        0.0 if change.within_noise else change.pct,
        100 * (base_peak - result.peak_allocated_bytes) / base_peak,
    )
    assert _flat(_xy(chart.measured)) == pytest.approx(list(measured))
    assert chart.measured.fill is False  # outlined
    assert marks.measured is not None and marks.measured.config == found.config
    legend = chart.legend.value
    assert "winner measured" in legend and f"budget {format_bytes(found.budget_bytes)}" in legend
    assert f"measured {format_bytes(result.peak_allocated_bytes)}" in legend
    # Everything lies inside the scales.
    for x, y in _xy(chart.points) + _xy(chart.winner) + _xy(chart.measured):
        assert chart.x.min < x < chart.x.max and chart.y.min < y < chart.y.max

    shown = reasoning_html(found)
    assert shown.startswith('<div class="jp-gpumem-search-reasoning"')
    assert "<div><b>Keeps your optimizer, adam " in shown  # the first line, in bold
    assert "Verified by a measured run" in shown and "press Apply" in shown
    assert "compare configurations with each other only" not in shown  # timed untracked


def test_without_step_times_points_stand_at_their_number_of_changes() -> None:
    trial, budget = meta_gpt()
    found = trial.search(budget)
    assert found.config is not None and found.baseline_step_s is None
    chart = SearchChart()
    marks = chart.update(found, BLOCKS)
    assert marks.by_changes and "(step times unknown)" in chart.figure.title
    assert chart.x_axis.label == CHANGES_AXIS == chart.tooltip.labels[1]
    assert [x for x, _ in _xy(chart.points)] == [changes(c) for c, _, _ in found.front]
    assert [x for x, _ in _xy(chart.winner)] == [changes(found.config)]
    assert "Not measured" in reasoning_html(found, unmeasured="Not measured: no weights.")


# -- the panel --------------------------------------------------------------------------------


@pytest.fixture
def tuned(shell: InteractiveShell) -> tuple[Any, Trial]:
    trial = _trained(_gpt_adam())
    shell.user_ns.update(model=trial.model, opt=trial.optimizer)
    return tune(trial.model, "opt", trial=trial, shell=shell), trial


def test_search_button_shows_the_front_and_apply_applies_exactly_the_winner(
    shell: InteractiveShell, tuned: tuple[Any, Trial]
) -> None:
    tuner, trial = tuned
    button = tuner.panel.buttons[SEARCH_BUTTON]
    assert button.disabled and button.tooltip == SEARCH_NEEDS["budget"]  # a trial, no budget
    budget = _budget(trial)
    tuner.panel.budget.value = f"{budget} B"
    assert not button.disabled and tuner.budget_bytes == budget
    assert tuner.panel.search_view.children == ()

    button.click()  # the button calls tuner.search()
    assert tuner.panel.messages.value == "" and tuner.panel.status.value == "searched and verified"
    found = tuner.searched
    assert isinstance(found, Search) and found.config is not None, tuner.panel.messages.value
    winner = found.config
    assert winner.accumulate > 1, found.text()  # only micro-batches get under 40%
    assert tuner.config == winner  # the panel holds exactly the winner, micro-batches too
    assert f"configuration: {winner}" in tuner.panel.configuration.value
    assert f"accumulate {winner.accumulate}" in tuner.panel.configuration.value
    view = tuner.panel.search_view.children
    assert view == (tuner.panel.search_chart.widget, tuner.panel.search_text)
    assert len(tuner.panel.search_chart.points.x) == len(found.front)
    assert len(tuner.panel.search_chart.measured.x) == 1  # verified: outlined
    first = found.reasoning[0]
    assert first.startswith("Keeps your optimizer, adam ")
    assert "press Apply" in tuner.panel.search_text.value
    rows = tuner.rows
    assert [r["configuration"] for r in rows] == ["baseline", f"search · {winner}"]
    assert found.result is not None
    assert rows[-1]["peak_bytes"] == found.result.peak_allocated_bytes
    assert rows[-1]["fits_budget"] is True
    # Each step-time change has one figure: the prediction in the reasoning and the legend,
    # the measurement (against the table's baseline) there and in the table's row.
    predicted, measured = found.predicted_change, found.measured_change
    assert predicted is not None and measured is not None
    assert rows[-1]["step_within_noise"] == measured.within_noise
    assert rows[-1]["delta_step_pct"] == pytest.approx(measured.pct)
    assert measured == found.result.step_change(tuner.baseline)
    winner_line = next(line for line in found.reasoning if line.startswith("Winner: "))
    assert _figures(winner_line) == [predicted.figure]
    assert _figures(found.text().splitlines()[-1]) == [measured.figure]  # "Verified by ..."
    assert _figures(tuner.panel.search_text.value.split("Verified by")[1]) == [measured.figure]
    legend = tuner.panel.search_chart.legend.value.split("Winner: ")[1]
    assert _figures(legend) == [predicted.figure, measured.figure]
    table = tuner.text().split("\nsearch · ")[-1]
    assert _figures(table)[1] == measured.figure  # after the peak's change

    model, original = trial.model, shell.user_ns["opt"]
    weights = [p.detach().clone() for p in model.parameters()]
    applied = tuner.apply()
    assert applied.config == winner
    assert ACCUMULATE_HELP.format(k=winner.accumulate) in tuner.panel.messages.value
    assert tuner.panel.status.value.startswith(f"applied {winner}")
    patched = [n for n, m in model.named_modules() if "forward" in m.__dict__]
    assert patched == list(winner.checkpoint or ())
    assert len(applied.micro_batches(trial.batch)) == winner.accumulate

    tuner.revert()
    assert tuner.panel.status.value.startswith(f"reverted {winner}: the model is as it was")
    assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == []
    assert shell.user_ns["opt"] is original
    assert tuner.applied.config == Config()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))

    tuner.fit(techniques=("checkpoint",))  # the panel shows one answer: the fit's
    assert tuner.panel.search_view.children == ()


def test_micro_batches_go_through_set_and_apply_without_a_control(
    shell: InteractiveShell, tuned: tuple[Any, Trial]
) -> None:
    tuner, _ = tuned
    tuner.set(Config(checkpoint="blocks", accumulate=4))
    assert tuner.config == Config(checkpoint="blocks", accumulate=4)
    assert "configuration: ckpt blocks · accumulate 4" in tuner.panel.configuration.value
    tuner.panel.precision.value = "bf16-autocast"  # a control changed: the micro-batches stay
    assert tuner.config.accumulate == 4
    assert "ckpt blocks · bf16-autocast · accumulate 4" in tuner.panel.configuration.value
    assert tuner.apply().config.accumulate == 4
    tuner.revert()
    tuner.panel.regex.value = "blocks"  # with "all blocks" too: a conflict, said in the line
    assert "choose one" in tuner.panel.configuration.value


def test_search_says_what_it_needs(shell: InteractiveShell) -> None:
    trial = _trained(_gpt_adam())
    shell.user_ns.update(model=trial.model, opt=trial.optimizer)
    alone = tune(trial.model, "opt", shell=shell, budget="1MiB")
    button = alone.panel.buttons[SEARCH_BUTTON]
    assert button.disabled and button.tooltip == SEARCH_NEEDS["trial"]
    with pytest.raises(RuntimeError, match="Search needs a trial"):
        alone.search()
    with_trial = tune(trial.model, "opt", trial=trial, shell=shell)
    with pytest.raises(ValueError, match="set a budget first"):
        with_trial.search()
