"""Fit to budget over plain records: the fitting configuration with the least step time."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from jupyter_gpumem.tuner.planning.fit import fit_to_budget

GiB = 2**30


@dataclass(frozen=True)
class R:
    label: str
    peak_allocated_bytes: int | None
    step_s: float | None
    status: str = "ok"


BASE = R("baseline", 14 * GiB, 0.187)


def test_baseline_that_fits_is_chosen() -> None:
    cheaper = R("bf16", 12 * GiB, 0.071)
    choice = fit_to_budget([BASE, cheaper], 16 * GiB)
    assert choice.chosen == "baseline" and choice.fits
    assert choice.reasoning[0] == "Budget: 16.0 GiB."
    assert "nothing needs to change" in choice.reasoning[-1]


def test_baseline_defaults_to_first_and_can_be_given() -> None:
    small = R("small", 1 * GiB, 0.5)
    assert fit_to_budget([small, BASE], 2 * GiB).chosen == "small"
    choice = fit_to_budget([small, BASE], 2 * GiB, baseline=BASE)
    assert choice.chosen == "small"
    assert "The baseline does not fit" in " ".join(choice.reasoning)


def test_least_step_time_wins_where_the_greedy_ratio_disagrees() -> None:
    # ckpt saves 8 GiB for +20 ms (0.4 GiB/ms), sgd saves 2 GiB for +10 ms (0.2 GiB/ms):
    # greedy by ratio would take ckpt, but both fit and sgd costs less step time.
    ckpt = R("ckpt", 6 * GiB, 0.207)
    sgd = R("sgd", 12 * GiB, 0.197)
    choice = fit_to_budget([BASE, ckpt, sgd], 12 * GiB)
    assert choice.ranking == ("ckpt", "sgd")
    assert choice.chosen == "sgd" and choice.fits
    text = "\n".join(choice.reasoning)
    assert "First in that order to fit: ckpt." in text
    assert "sgd fits as well at a lower step time (197 ms against 207 ms)" in text
    assert choice.reasoning[-1].startswith("Chosen: sgd, peak 12.0 GiB of 12.0 GiB at 197 ms")
    assert "+10 ms, +5% against the baseline" in choice.reasoning[-1]


def test_greedy_and_cheapest_agree_when_the_best_ratio_is_cheapest() -> None:
    ckpt = R("ckpt", 6 * GiB, 0.235)
    bf16 = R("bf16", 12 * GiB + 700 * 2**20, 0.071)
    both = R("bf16+ckpt", 5 * GiB, 0.100)
    choice = fit_to_budget([BASE, ckpt, bf16, both], 8 * GiB)
    assert choice.ranking[:2] == ("bf16+ckpt", "bf16")  # faster than the baseline: first
    assert choice.chosen == "bf16+ckpt"
    assert "fits as well" not in " ".join(choice.reasoning)


def test_ratio_ranking_is_explained_with_sizes_and_times() -> None:
    ckpt = R("ckpt", 6 * GiB, 0.235)
    choice = fit_to_budget([BASE, ckpt], 8 * GiB)
    assert "  1. ckpt: peak 6.00 GiB, saves 8.00 GiB for +48 ms: 171 MiB per ms, fits" in (
        choice.reasoning
    )
    assert "The baseline does not fit: peak 14.0 GiB, 6.00 GiB over, at 187 ms per step." in (
        choice.reasoning
    )


def test_ties_in_step_time_go_to_the_lower_peak_then_the_earlier() -> None:
    a = R("a", 7 * GiB, 0.2)
    b = R("b", 6 * GiB, 0.2)
    c = R("c", 6 * GiB, 0.2)
    choice = fit_to_budget([BASE, a, b, c], 8 * GiB)
    assert choice.chosen == "b"
    assert choice.ranking == ("b", "c", "a")  # same cost: more saved first, then given order


def test_exactly_at_the_budget_fits() -> None:
    edge = R("edge", 8 * GiB, 0.3)
    assert fit_to_budget([BASE, edge], 8 * GiB).chosen == "edge"
    assert fit_to_budget([BASE, edge], 8 * GiB - 1).chosen is None


def test_none_fits_names_the_lowest_peak() -> None:
    ckpt = R("ckpt", 6 * GiB, 0.235)
    sgd = R("sgd", 13 * GiB, 0.187)
    choice = fit_to_budget([BASE, ckpt, sgd], 4 * GiB)
    assert choice.chosen is None and not choice.fits
    assert choice.reasoning[-1].startswith(
        "No measured configuration fits 4.00 GiB. The lowest peak is ckpt: 6.00 GiB, 2.00 GiB over"
    )


def test_oom_and_failed_results_are_left_out() -> None:
    oom = R("huge batch", 3 * GiB, None, status="oom")  # peak at the failure, below the budget
    broken = R("broken", 1 * GiB, 0.1, status="error")
    ok = R("ckpt", 6 * GiB, 0.235)
    choice = fit_to_budget([BASE, oom, broken, ok], 8 * GiB)
    assert choice.chosen == "ckpt"
    assert "huge batch: left out, it ran out of memory." in choice.reasoning
    assert "broken: left out, it failed." in choice.reasoning
    assert choice.ranking == ("ckpt",)


def test_a_baseline_that_ran_out_of_memory_ranks_by_step_time() -> None:
    base = R("baseline", 20 * GiB, None, status="oom")
    slow = R("ckpt", 6 * GiB, 0.3)
    fast = R("bf16", 7 * GiB, 0.1)
    choice = fit_to_budget([base, slow, fast], 8 * GiB)
    assert choice.chosen == "bf16"
    assert choice.ranking == ("bf16", "ckpt")
    assert any("has no measurement (it ran out of memory)" in line for line in choice.reasoning)
    assert choice.reasoning[-1] == "Chosen: bf16, peak 7.00 GiB of 8.00 GiB at 100 ms per step."


def test_candidates_that_save_nothing_rank_last() -> None:
    worse = R("worse", 15 * GiB, 0.1)
    ckpt = R("ckpt", 6 * GiB, 0.3)
    choice = fit_to_budget([BASE, worse, ckpt], 8 * GiB)
    assert choice.ranking == ("ckpt", "worse")
    assert any(
        "worse: peak 15.0 GiB, saves nothing (+1.00 GiB)" in line for line in choice.reasoning
    )


def test_nothing_measured() -> None:
    choice = fit_to_budget([R("baseline", None, None, status="error")], GiB)
    assert choice.chosen is None and not choice.fits
    assert choice.reasoning[-1].startswith("Nothing was measured")


def test_bad_input_says_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="positive number of bytes"):
        fit_to_budget([BASE], 0)
    with pytest.raises(ValueError, match="at least one result"):
        fit_to_budget([], GiB)
