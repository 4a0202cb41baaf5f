"""Step-time changes: a noisy timing pair is within noise, and one change has one figure in
every rendering of a result (the reasoning text, its HTML, the chart and the tuner's table)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import pytest
import torch

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.planning.composed import Anchor, Anchors, Choice, compose
from jupyter_gpumem.tuner.planning.fit import fit_to_budget
from jupyter_gpumem.tuner.planning.joint import Search
from jupyter_gpumem.tuner.results import TrialResult, result_of
from jupyter_gpumem.tuner.step_change import StepChange, spread, step_change

pytest.importorskip("bqplot")

from jupyter_gpumem.widgets.search_chart import legend_html, reasoning_html, search_marks
from jupyter_gpumem.widgets.tuner_charts import TradeoffChart, rows_text

MiB = 2**20
CKPT = Config(checkpoint=("blocks.0", "blocks.1"))


def _run(config: Config, times: tuple[float, ...], peak: int = 100 * MiB) -> TrialResult:
    measured = result_of(config, None, "cpu", times=times)
    return replace(measured, peak_allocated_bytes=peak, peak_reserved_bytes=peak)


@dataclass
class _Workload:
    model: torch.nn.Module


@dataclass
class _Runs:
    """A trial whose only run is ``winner``."""

    winner: TrialResult
    workload: _Workload

    def run(self, config: Config) -> TrialResult:
        return self.winner


def test_a_noisy_timing_pair_is_within_noise() -> None:
    # medians 0.133 s and 0.222 s (+67%), but the baseline's own steps ran from 0.07 s to
    # 0.47 s: a CPU shared with other work
    base = _run(Config(), (0.467, 0.133, 0.071))
    ckpt = _run(CKPT, (0.222, 0.250, 0.201), peak=50 * MiB)
    change = ckpt.step_change(base)
    assert change is not None and change.within_noise
    assert change.figure == "within noise" and change.against("the baseline") == (
        "within noise of the baseline"
    )
    row = ckpt.to_row(base)
    assert row["step_within_noise"] is True and row["delta_step_pct"] == pytest.approx(
        100 * (0.222 - 0.133) / 0.133
    )
    table = rows_text([base.to_row(base), row])
    assert "within noise" in table and "+67%" not in table
    chart = TradeoffChart()
    chart.update([base.to_row(base), row])
    assert list(chart.points.x) == [0.0, 0.0]  # the change stands where no change does
    assert "within noise" in chart.figure.title


def test_a_change_beyond_the_spread_is_a_percentage() -> None:
    base = _run(Config(), (0.180, 0.187, 0.190))
    slower = _run(CKPT, (0.230, 0.235, 0.236))
    change = slower.step_change(base)
    assert change is not None and not change.within_noise
    assert change.figure == "+26%" and change.noise_s == pytest.approx(0.010)
    assert rows_text([base.to_row(base), slower.to_row(base)]).count("+26%") == 1


def test_one_timing_each_leaves_the_noise_unknown() -> None:
    change = step_change(0.2, 0.1, spread([0.2]), spread([0.1]))
    assert change == StepChange(0.2, 0.1, None) and change.figure == "+100%"
    assert step_change(None, 0.1) is None and step_change(0.1, 0.0) is None
    assert step_change(0.1, 0.1, 0.0).figure == "within noise"  # no change at all


def test_fit_among_measured_rows_says_within_noise() -> None:
    base = _run(Config(), (0.467, 0.133, 0.071))
    ckpt = _run(CKPT, (0.222, 0.250, 0.201), peak=50 * MiB)
    choice = fit_to_budget([base, ckpt], 60 * MiB)
    assert choice.chosen == str(CKPT)
    assert choice.reasoning[-1].endswith("within noise of the baseline).")


def test_a_composed_step_time_carries_the_widest_spread_of_its_anchors() -> None:
    def a(step: float, spread_s: float) -> Anchor:
        return Anchor(100 * MiB, 40 * MiB, 20 * MiB, step, spread_s)

    base = a(1.0, 0.05)
    anchors = Anchors(
        base=base,
        precision={None: base, "bf16-autocast": a(0.8, 0.4)},
        optimizer={None: base},
        all_blocks={None: a(1.3, 0.02), "bf16-autocast": a(1.0, 0.01)},
        most_micro={},
        blocks=2,
        most_accumulate=1,
    )
    plain, noisy = compose(anchors, [Choice(None, None, 2, 1), Choice("bf16-autocast", None, 1, 1)])
    assert plain.noise_s == pytest.approx(0.05) and noisy.noise_s == pytest.approx(0.4)
    assert step_change(plain.step_s, base.step_s, plain.noise_s).figure == "+30%"
    assert step_change(noisy.step_s, base.step_s, noisy.noise_s).within_noise


def _search(measured_times: tuple[float, ...]) -> tuple[Search, TrialResult]:
    """A verified search by hand: the winner checkpoints two blocks; its prediction and its
    measurement each against the baseline."""
    base = Anchor(100 * MiB, 40 * MiB, 20 * MiB, 0.20, 0.002)
    estimate = Estimate(str(CKPT), "cpu", 60 * MiB, 60 * MiB, {"activations": 60 * MiB}, None)
    predicted = step_change(0.25, base.step_s, 0.004)
    found = Search(
        100 * MiB, CKPT, estimate, 0.25, 12,
        ((Config(), 100 * MiB, 0.20), (CKPT, 62 * MiB, 0.25)), (),
        ("Keeps your optimizer.", f"Winner: {CKPT}: about 250 ms a step "
         f"({predicted.against('the baseline') if predicted else ''})."),
        1.0, 5, base=base, predicted_change=predicted,
        front_changes=(step_change(0.20, 0.20, 0.002), predicted),
        trial=_Runs(_run(CKPT, measured_times, peak=61 * MiB), _Workload(torch.nn.Linear(1, 1))),
    )  # fmt: skip
    table_base = _run(Config(), (0.200, 0.201, 0.199))
    found.verify(baseline=table_base)
    return found, table_base


def _figures(text: str) -> list[str]:
    return re.findall(r"[+-]\d+%|within noise", text)


@pytest.mark.parametrize(
    ("times", "figure"),
    [((0.300, 0.302, 0.301), "+50%"), ((0.150, 0.300, 0.450), "within noise")],
)
def test_one_change_has_one_figure_in_every_rendering(
    times: tuple[float, ...], figure: str
) -> None:
    found, table_base = _search(times)
    assert found.measured_change is not None and found.measured_change.figure == figure
    assert found.result is not None
    verified = found.text().splitlines()[-1]
    assert verified.startswith("Verified by a measured run") and _figures(verified) == [figure]
    html = reasoning_html(found)
    assert "Verified by a measured run" in html and verified in html.replace("&#x27;", "'")
    marks = search_marks(found, ("blocks.0", "blocks.1"))
    assert marks.measured is not None and marks.measured.change == found.measured_change
    legend = legend_html(marks)
    measured_part = legend.split("measured ")[-1]
    assert _figures(measured_part) == [figure]  # the legend's measured winner
    assert _figures(legend.split("; measured")[0].split("Winner:")[1]) == ["+25%"]
    expected_x = 0.0 if figure == "within noise" else found.measured_change.pct
    assert marks.measured.x == pytest.approx(expected_x)
    row = found.result.to_row(table_base)  # the tuner's table row of the verified winner
    line = rows_text([table_base.to_row(table_base), row]).splitlines()[-1]
    assert _figures(line) == ["-39%", figure]  # the peak's change, then the step time's
