"""What the process held before an estimate: named, left out on request, never on another card.

The allocator model starts from a recorded layout (no GPU): a 3 MiB parameter on its real block,
two cuBLAS workspaces and a 2 GiB tensor of the user's in segments of their own.
"""

from __future__ import annotations

import time

import pytest

from jupyter_gpumem.records import ALLOCATED, FREE, BlockState, SegmentState
from jupyter_gpumem.tuner.estimation.cards import card
from jupyter_gpumem.tuner.estimation.estimate import Estimate, from_peaks
from jupyter_gpumem.tuner.estimation.fake_peaks import DeviceFacts, Peaks, cuda_peaks
from jupyter_gpumem.tuner.estimation.fake_step import FakeRun
from jupyter_gpumem.tuner.estimation.on_card import checked_count_held, counts_held, on_card
from jupyter_gpumem.tuner.estimation.verdict import verdict

MiB, GiB = 1 << 20, 1 << 30
PARAM, WORKSPACE, HELD = 1 << 40, (1 << 40) + 64 * MiB, (1 << 40) + 128 * MiB
H200 = DeviceFacts(
    name="NVIDIA H200",
    total_bytes=card("H200").total_bytes,
    capability=(9, 0),
    workspace_bytes=0,
    context_bytes=500 * MiB,
    workspace_sizes=(32 * MiB, MiB),
)


def _layout(held: bool = True) -> tuple[SegmentState, ...]:
    """The parameter's segment, the workspaces', and (``held``) the user's 2 GiB tensor's."""
    segments = [
        SegmentState(PARAM, 20 * MiB, False, (BlockState(PARAM, 3 * MiB, ALLOCATED, 3 * MiB),
                                              BlockState(PARAM + 3 * MiB, 17 * MiB, FREE))),
        SegmentState(WORKSPACE, 64 * MiB, False,
                     (BlockState(WORKSPACE, 32 * MiB, ALLOCATED, 32 * MiB),
                      BlockState(WORKSPACE + 32 * MiB, 32 * MiB, ALLOCATED, 32 * MiB))),
    ]  # fmt: skip
    if held:
        segments.append(SegmentState(HELD, 2 * GiB, False, (BlockState(HELD, 2 * GiB, ALLOCATED, 2 * GiB),)))  # fmt: skip
    return tuple(segments)


def _run() -> FakeRun:
    """The parameter (on its real block), then a 6 MiB activation and a 1 MiB temporary."""
    return FakeRun(
        device="cuda:0",
        sizes=(3 * MiB, 6 * MiB, MiB),
        real={0: PARAM},
        existing=(0,),
        events=(("alloc", 1, 2), ("alloc", 2, 3), ("free", 2, 4), ("free", 1, 5)),
        window=0,
        window_clock=1,
        live_at_window=(0,),
        reachable=frozenset({0}),
        tags=((0, "parameters"), (1, "activations")),
        marks=(),
    )


def _estimate(peaks: Peaks, target: str | None = None) -> Estimate:
    found = from_peaks(peaks, H200, t0=time.perf_counter(), label="baseline", device="cuda:0")
    return on_card(found, H200, None if target is None else card(target))


def _peaks(count_held: bool, held: bool = True) -> Peaks:
    return cuda_peaks(_run(), _layout(held), workspaces=H200.workspace_sizes, count_held=count_held)


def test_what_was_held_is_its_own_category_with_a_note() -> None:
    peaks = _peaks(count_held=True)
    assert peaks.held_bytes == 2 * GiB and peaks.held_counted
    assert peaks.breakdown["held_before"] == 2 * GiB
    assert peaks.breakdown["unattributed"] == 64 * MiB  # the workspaces alone, not the user's
    assert peaks.breakdown["parameters"] == 3 * MiB and peaks.breakdown["activations"] == 6 * MiB
    assert peaks.peak_bytes == 2 * GiB + 64 * MiB + 3 * MiB + 6 * MiB + MiB
    assert sum(peaks.breakdown.values()) == peaks.peak_bytes
    est = _estimate(peaks)
    assert est.held_bytes == 2 * GiB and est.held_counted
    assert (
        "held before the call: 2.00 GiB (not the model's; count_held=False leaves it out)"
        in est.notes
    )
    assert est.verdict is not None and est.verdict.reserved_bytes == peaks.peak_reserved_bytes
    text = est.text()
    assert "held before" in text and "unattributed" in text
    assert "note: held before the call: 2.00 GiB" in text


def test_count_held_false_estimates_a_process_that_holds_nothing_else() -> None:
    counted, left_out = _peaks(count_held=True), _peaks(count_held=False)
    fresh = _peaks(count_held=True, held=False)
    assert left_out.peak_bytes == counted.peak_bytes - 2 * GiB == fresh.peak_bytes
    assert left_out.peak_reserved_bytes == counted.peak_reserved_bytes - 2 * GiB
    assert left_out.peak_reserved_bytes == fresh.peak_reserved_bytes
    assert left_out.breakdown == fresh.breakdown and left_out.breakdown["held_before"] == 0
    assert left_out.held_bytes == 2 * GiB and not left_out.held_counted
    est = _estimate(left_out)
    assert est.notes == (
        "held before the call: 2.00 GiB, left out (count_held=False): the estimate is for a "
        "process holding nothing else",
    )
    assert _estimate(fresh).notes == ()  # nothing held, nothing said


def test_a_verdict_for_another_card_never_counts_what_is_held_here() -> None:
    rtx = card("RTX-4090")
    assert counts_held(True, H200, None) and counts_held(True, H200, card("H200"))
    assert not counts_held(True, H200, rtx) and not counts_held(False, H200, None)
    est = _estimate(_peaks(count_held=counts_held(True, H200, rtx)), "RTX-4090")
    fresh = _estimate(_peaks(count_held=True, held=False), "RTX-4090")
    assert est.verdict is not None and fresh.verdict is not None
    assert est.verdict.needed_bytes == fresh.verdict.needed_bytes < 1 * GiB
    assert est.peak_bytes == fresh.peak_bytes and est.breakdown == fresh.breakdown
    assert est.notes[-1] == (
        "held before the call: 2.00 GiB on this H200, left out: it is held here, not on the RTX-4090"
    )
    # the same card by name is this one: what is held is there
    same = _estimate(_peaks(count_held=counts_held(True, H200, card("H200"))), "H200")
    assert same.verdict is not None and same.verdict.reserved_bytes > 2 * GiB


def test_held_memory_that_dominates_a_verdict_says_how_to_leave_it_out() -> None:
    over = verdict(card("L4"), 30 * GiB, GiB, {"held_before": 20 * GiB, "parameters": 9 * GiB})
    assert not over.fits
    assert "most of the peak is held before the call (20.0 GiB) and parameters" in over.line()
    assert over.remedies[0].startswith("held before the call: deleting what this process holds")
    assert "count_held=False" in over.remedies[0]


@pytest.mark.parametrize("value", ["no", 0, None, 1.0])
def test_count_held_must_be_a_bool(value: object) -> None:
    with pytest.raises(TypeError, match=r"count_held must be True .* or False .*, got"):
        checked_count_held(value)
    assert checked_count_held(False) is False
