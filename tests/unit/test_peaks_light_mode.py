"""Cells traced in part: a detailed window, then peak counters read at step boundaries.

The window is the real trace recorded on the GPU machine (tests/fixtures); the readings
after it are what the counters would say of later steps.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_replay_cuda_fixture import _recording

from jupyter_gpumem.analysis.peaks import device_peaks
from jupyter_gpumem.records import CellRecording, DeviceRecording, StepSample, Tag
from jupyter_gpumem.report.build import build_report


def _light(peak_after: int, steps: int = 10) -> tuple[DeviceRecording, int]:
    """The fixture as steps 0-2 of a ``steps``-step cell whose later steps peak at ``peak_after``."""
    rec, data = _recording()
    window = replace(rec.windows[0], last_step=3)
    t = window.events[-1].time_us
    # the reading that closes the window holds its peak; each later one, its step's
    samples = [
        StepSample(
            t + 1000 * i,
            i,
            rec.allocated_after,
            rec.reserved_after,
            data["independent_peak_allocated"] if i == 3 else peak_after,
            rec.reserved_after,
        )
        for i in range(3, steps + 1)
    ]
    cell_peak = max(data["independent_peak_allocated"], peak_after)
    light = replace(
        rec,
        windows=(window,),
        samples=tuple(samples),
        cell_peak_allocated=cell_peak,
        cell_peak_reserved=data["independent_peak_reserved"],
        end_blocks=(),
    )
    return light, data["independent_peak_allocated"]


def _report(rec: DeviceRecording) -> object:
    first = rec.windows[0].events[0]
    tags = (Tag(first.address, "activations", first.time_us, first.size),)
    cell = CellRecording(
        started_at=rec.windows[0].events[0].time_us / 1e6,
        wall_s=1.0,
        cuda_available=True,
        devices={0: rec},
        error=None,
        tags=tags,
        steps=10,
    )
    return build_report(cell)


def test_later_steps_that_repeat_the_pattern_keep_the_windows_breakdown() -> None:
    rec, window_peak = _light(peak_after=50_000_000)
    peaks = device_peaks(rec)
    assert peaks.source == "allocator-trace"
    assert peaks.peak_allocated == window_peak
    assert "steps 0-2" in (peaks.note or "") and "8 readings" in (peaks.note or "")
    report = _report(rec)
    d = report.devices[0]  # type: ignore[attr-defined]
    assert sum(d.breakdown.values()) == d.peak_allocated_bytes == window_peak
    assert d.timeline.peak_bytes == window_peak


def test_a_higher_peak_between_windows_is_exact_and_its_excess_unattributed() -> None:
    rec, window_peak = _light(peak_after=200_000_000)
    peaks = device_peaks(rec)
    assert peaks.peak_allocated == 200_000_000
    assert peaks.source == "counters"
    assert "around step 3" in (peaks.note or "")
    report = _report(rec)
    d = report.devices[0]  # type: ignore[attr-defined]
    assert d.peak_allocated_bytes == 200_000_000
    assert sum(d.breakdown.values()) == 200_000_000
    assert d.breakdown["unattributed"] >= 200_000_000 - window_peak
    assert d.peak_phase is None and d.peak_step == 3
    assert max(d.timeline.allocated_bytes) == 200_000_000


@pytest.mark.parametrize("steps", [3, 10])
def test_a_cell_that_ends_with_its_window_says_nothing_of_later_steps(steps: int) -> None:
    rec, _ = _light(peak_after=0, steps=steps)
    note = device_peaks(rec).note or ""
    assert ("steps 0-2" in note) == (steps > 3)
