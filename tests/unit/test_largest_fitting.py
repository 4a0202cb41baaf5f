"""The largest size that fits, against every size tried in turn, and how few estimates it takes."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from jupyter_gpumem.tuner.estimation.search import LARGEST, NOTHING_FITS, largest_fitting

MiB = 2**20
GiB = 2**30


def affine(n: int) -> int:  # weights and state, then activations per sample
    return 3 * GiB + n * 37 * MiB


def rounded(n: int) -> int:  # the allocator's 2 MiB segments, small batches in the small pool
    raw = 3 * GiB + n * 37 * MiB + (0 if n > 8 else 700 * 1024)
    return -(-raw // (2 * MiB)) * (2 * MiB)


def quadratic(n: int) -> int:  # eager attention: scores grow with the square of the sequence
    return 2 * GiB + n * 2 * MiB + n * n * 64 * 1024


def steps(n: int) -> int:  # a kernel choice that changes with the size
    return 5 * GiB + n * 11 * MiB + (512 * MiB if n >= 700 else 0)


def brute(peak: Callable[[int], int], budget: int, low: int, high: int) -> int:
    fitting = [n for n in range(low, high + 1) if peak(n) <= budget]
    return max(fitting) if fitting else NOTHING_FITS


def counted(peak: Callable[[int], int]) -> tuple[Callable[[int], int], list[int]]:
    calls: list[int] = []

    def tracked(n: int) -> int:
        calls.append(n)
        return peak(n)

    return tracked, calls


@pytest.mark.parametrize("peak", [affine, rounded, quadratic, steps], ids=lambda f: f.__name__)
@pytest.mark.parametrize("budget_gib", [6, 20, 75, 140])
def test_the_answer_is_the_largest_fitting_size(
    peak: Callable[[int], int], budget_gib: int
) -> None:
    budget = budget_gib * GiB
    tracked, calls = counted(peak)
    found = largest_fitting(tracked, budget, 1, None, "batch size")
    assert found == brute(peak, budget, 1, found + 2)
    assert peak(found) <= budget < peak(found + 1)
    assert found in calls and found + 1 in calls  # never a size, or its neighbour, untried
    assert len(calls) == len(set(calls))
    assert len(calls) <= 2 * math.log2(found + 1) + 4


@pytest.mark.parametrize("budget_gib", [6, 20, 75, 140])
def test_a_peak_that_is_a_line_takes_four_estimates(budget_gib: int) -> None:
    tracked, calls = counted(affine)
    found = largest_fitting(tracked, budget_gib * GiB, 1, None, "batch size")
    assert calls[:2] == [1, 2]
    assert sorted(calls[2:]) == [found, found + 1]


@pytest.mark.parametrize("budget_gib", [6, 20, 75, 140])
def test_a_curving_peak_far_under_its_line_is_bracketed_by_its_middle(budget_gib: int) -> None:
    tracked, calls = counted(quadratic)
    found = largest_fitting(tracked, budget_gib * GiB, 1, None, "batch size")
    assert found == brute(quadratic, budget_gib * GiB, 1, 2000)
    assert len(calls) <= 13


def test_a_high_bound_and_nothing_fitting() -> None:
    assert largest_fitting(affine, 20 * GiB, 1, 300, "batch size") == brute(
        affine, 20 * GiB, 1, 300
    )
    assert largest_fitting(affine, 200 * GiB, 1, 300, "batch size") == 300
    with pytest.warns(UserWarning, match="even batch size 4 is estimated"):
        assert largest_fitting(affine, GiB, 4, None, "batch size") == NOTHING_FITS
    with pytest.warns(UserWarning, match="still fits"):
        assert largest_fitting(lambda n: 1, 10, 1, None, "batch size") == LARGEST


def test_progress_is_told_of_each_estimate_once_as_it_begins() -> None:
    lines: list[str] = []
    tracked, calls = counted(rounded)
    largest_fitting(tracked, 75 * GiB, 1, None, "batch size", lines.append)
    assert lines == [f"estimating batch size {n:,}" for n in calls]


def training_phases(n: int) -> dict[str, int]:
    """A step whose small batches peak in the optimizer step (its temporaries over the state),
    which the batch does not move; the backward's peak grows with it and overtakes it."""
    return {
        "forward": 24 * GiB + n * 3 * GiB,
        "backward": 25 * GiB + n * 4 * GiB + n * 4 * MiB,
        "optimizer": 35 * GiB + n * 9 * MiB,
    }


def training(n: int) -> int:
    return max(training_phases(n).values())


@pytest.mark.parametrize("budget_gib", [60, 64, 100, 400])
def test_a_flat_phase_at_the_small_sizes_is_seen_past_by_each_phase_line(
    budget_gib: int,
) -> None:
    budget = budget_gib * GiB
    tracked, calls = counted(training)
    found = largest_fitting(tracked, budget, 1, None, "batch size", phases=training_phases)
    assert found == brute(training, budget, 1, found + 2)
    assert calls[:2] == [1, 2]
    assert sorted(calls[2:]) == [found, found + 1]  # the backward's line, as if it were alone


def test_the_total_alone_is_led_past_the_budget_by_the_flat_phase() -> None:
    tracked, calls = counted(training)
    found = largest_fitting(tracked, 64 * GiB, 1, None, "batch size")
    assert found == brute(training, 64 * GiB, 1, found + 2)
    assert len(calls) > 4
    assert max(calls) > 100 * found  # the line through 1 and 2 rises by 9 MiB a sample


def test_phases_that_do_not_rise_fall_back_to_the_total() -> None:
    flat = {"optimizer": 35 * GiB}
    tracked, calls = counted(affine)
    found = largest_fitting(tracked, 20 * GiB, 1, None, "batch size", phases=lambda n: flat)
    assert found == brute(affine, 20 * GiB, 1, found + 2)
    assert sorted(calls[2:]) == [found, found + 1]
