"""The peak model and the block solver on plain numbers: exact against every subset."""

from __future__ import annotations

import itertools
import random

import pytest

from jupyter_gpumem.tuner.planning.solver import MAX_FRONT, BlockCost, PeakModel, calibrated, solve

MiB = 2**20


def _blocks(n: int, saving: int = 100 * MiB, held: int = 110 * MiB) -> list[BlockCost]:
    return [BlockCost(f"h.{i}", saving, held, 4 * MiB, 0.004, 10 * MiB) for i in range(n)]


def _model(blocks: list[BlockCost], base: int = 3000 * MiB) -> PeakModel:
    model, _, _ = calibrated(
        blocks,
        base_peak_bytes=base,
        base_step_s=0.180,
        all_peak_bytes=base - sum(b.saving_bytes for b in blocks) + 50 * MiB,
        all_step_s=0.180 + 0.004 * len(blocks),
    )
    return model


def _brute(model: PeakModel, budget: int) -> tuple[float, int] | None:
    """The least (step time, number of blocks) over every subset that fits."""
    n = len(model.blocks)
    best = None
    for k in range(n + 1):
        for chosen in itertools.combinations(range(n), k):
            if model.peak(chosen) <= budget:
                key = (round(model.step_s(chosen), 12), k)
                best = key if best is None or key < best else best
    return best


def test_the_model_meets_both_measured_anchors() -> None:
    blocks = _blocks(12)
    model = _model(blocks)
    assert model.peak(()) == 3000 * MiB
    assert model.peak(range(12)) == 3000 * MiB - 1200 * MiB + 50 * MiB
    assert model.step_s(()) == 0.180
    assert model.step_s(range(12)) == pytest.approx(0.180 + 0.048)
    # in between, each block frees its saving from the start of backward
    assert model.peak(range(5)) == 3000 * MiB - 500 * MiB


def test_savings_scale_up_only_when_the_measured_drop_is_larger() -> None:
    blocks = _blocks(4)
    _, up, _ = calibrated(
        blocks,
        base_peak_bytes=2000 * MiB,
        base_step_s=0.1,
        all_peak_bytes=1000 * MiB,
        all_step_s=0.2,
    )
    assert up == pytest.approx(1000 / 400)
    _, same, time_scale = calibrated(
        blocks,
        base_peak_bytes=2000 * MiB,
        base_step_s=0.1,
        all_peak_bytes=1900 * MiB,
        all_step_s=0.1,
    )
    assert same == 1.0  # the profile saw more than the drop: the backward moment holds the peak
    assert time_scale == 0.0  # checkpointing cost nothing measurable


def test_the_last_blocks_free_little_because_their_backward_comes_first() -> None:
    model = _model(_blocks(12))
    assert model.peak((11,)) > model.peak((0,))  # recomputed while all before it are held
    choice = solve(model, model.peak(range(3)))
    assert choice is not None and choice.chosen == (0, 1, 2)  # ties go to the earlier blocks


@pytest.mark.parametrize("seed", range(30))
def test_solver_is_exact_against_every_subset(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 10)
    blocks = [
        BlockCost(
            f"b{i}",
            rng.randint(-5, 200) * MiB,
            rng.randint(0, 250) * MiB,
            rng.randint(0, 20) * MiB,
            rng.uniform(0.001, 0.02),
            rng.randint(0, 30) * MiB,
        )
        for i in range(n)
    ]
    base = 4000 * MiB
    model, _, _ = calibrated(
        blocks,
        base_peak_bytes=base,
        base_step_s=0.2,
        all_peak_bytes=base - max(0, sum(b.saving_bytes for b in blocks)) // 2,
        all_step_s=0.3,
    )
    for budget in (base, base - 1, (base + model.all_peak_bytes) // 2, model.all_peak_bytes):
        choice = solve(model, budget)
        best = _brute(model, budget)
        if best is None:
            assert choice is None, (budget, choice)
            continue
        assert choice is not None and choice.exact
        assert choice.peak_bytes == model.peak(choice.chosen) <= budget
        assert round(choice.step_s, 12) == best[0]


def test_nothing_fits_below_everything_checkpointed() -> None:
    model = _model(_blocks(6))
    assert solve(model, model.all_peak_bytes - 1) is None
    assert solve(model, model.all_peak_bytes) is not None


def test_a_wide_front_is_thinned_and_says_so() -> None:
    # time in proportion to bytes, every sum distinct: each of the 2**16 subsets is on the front
    blocks = [BlockCost(f"b{i}", 2**i * 1000, 0, 0, 2**i * 1e-6) for i in range(16)]
    total = sum(b.saving_bytes for b in blocks)
    model = PeakModel(tuple(blocks), 10**9, 0.1, 10**9 - total, 0)
    budget = 10**9 - total // 3
    choice = solve(model, budget)
    assert choice is not None and not choice.exact and choice.peak_bytes <= budget
    best = _brute_sum(blocks, 10**9 - budget)
    assert choice.step_s - 0.1 <= best * (1 + 2 * 10**9 / MAX_FRONT / total)


def _brute_sum(blocks: list[BlockCost], need: int) -> float:
    """Least time of a subset saving at least ``need`` (bytes and times in proportion)."""
    unit = blocks[0].saving_bytes
    k = -(-need // unit)  # savings are multiples of unit, every multiple reachable
    return k * unit * 1e-9


def test_the_half_anchor_scales_savings_down_to_what_checkpointing_frees() -> None:
    # the profile saw 100 MiB saved per block; checkpointing frees 90 (a cache keeps the rest)
    blocks = _blocks(12)
    base = 3000 * MiB
    model, scale, _ = calibrated(
        blocks,
        base_peak_bytes=base,
        base_step_s=0.18,
        all_peak_bytes=base - 12 * 90 * MiB,
        all_step_s=0.23,
        half_peak_bytes=base - 6 * 90 * MiB,
    )
    assert scale == pytest.approx(0.9)
    assert model.peak(range(6)) == base - 6 * 90 * MiB
    assert model.peak(range(4)) == base - 4 * 90 * MiB
    choice = solve(model, base - 5 * 90 * MiB)
    assert choice is not None and choice.chosen == (0, 1, 2, 3, 4)


def test_free_recomputation_still_checkpoints_the_fewest_blocks() -> None:
    # a noisy CPU run can measure "checkpoint everything" no slower than nothing: time scale 0
    blocks = _blocks(8)
    model, _, time_scale = calibrated(
        blocks,
        base_peak_bytes=3000 * MiB,
        base_step_s=0.2,
        all_peak_bytes=2200 * MiB,
        all_step_s=0.19,
    )
    assert time_scale == 0.0
    choice = solve(model, 3000 * MiB - 250 * MiB)
    assert choice is not None and choice.chosen == (0, 1, 2)


def test_when_only_everything_fits_the_measured_run_decides() -> None:
    blocks = _blocks(4)
    base = 3000 * MiB
    # checkpointing frees far more than the half anchor says each block frees
    model, _, _ = calibrated(
        blocks,
        base_peak_bytes=base,
        base_step_s=0.2,
        all_peak_bytes=base - 1000 * MiB,
        all_step_s=0.3,
        half_peak_bytes=base - 100 * MiB,
    )
    assert model.peak(range(4)) == base - 1000 * MiB
    choice = solve(model, base - 900 * MiB)
    assert choice is not None and choice.chosen == (0, 1, 2, 3)
    assert choice.peak_bytes == base - 1000 * MiB
