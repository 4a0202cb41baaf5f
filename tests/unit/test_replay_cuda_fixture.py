"""The replay against a trace recorded from the real CUDA allocator (torch 2.11, H200).

The fixture was made by ``bench/record_trace_fixture.py`` on the GPU machine: a
fragmented starting layout, two Adam steps and a large temporary. Its counters
were read independently from ``torch.cuda.max_memory_*``.
"""

import json
from pathlib import Path

from jupyter_gpumem.analysis.peaks import device_peaks
from jupyter_gpumem.analysis.replay import layout_after, replay
from jupyter_gpumem.records import (
    BlockState,
    CellRecording,
    DeviceRecording,
    SegmentState,
    TraceEvent,
    TraceWindow,
)
from jupyter_gpumem.report.build import build_report
from tests.support.cycles import collected

FIXTURE = Path(__file__).parent.parent / "fixtures" / "cuda_trace_train_step.json"


def _recording() -> tuple[DeviceRecording, dict]:
    data = json.loads(FIXTURE.read_text())
    segments = tuple(
        SegmentState(
            s["address"],
            s["total_size"],
            s["is_small"],
            tuple(BlockState(**b) for b in s["blocks"]),
        )
        for s in data["segments_before"]
    )
    events = tuple(TraceEvent(**e) for e in data["events"])
    window = TraceWindow(
        segments_before=segments,
        events=events,
        allocated_start=data["allocated_before"],
        reserved_start=data["reserved_before"],
        allocated_end=data["allocated_after"],
        reserved_end=data["reserved_after"],
        first_step=0,
        last_step=None,
    )
    fields = {k: v for k, v in data.items() if k in DeviceRecording.__dataclass_fields__}
    fields.update(windows=(window,))
    return DeviceRecording(**fields), data


def test_replay_reproduces_the_allocator_peaks_to_the_byte() -> None:
    rec, data = _recording()
    peaks = device_peaks(rec)
    assert peaks.source == "allocator-trace", peaks.note
    assert peaks.peak_allocated == data["independent_peak_allocated"]
    assert peaks.peak_reserved == data["independent_peak_reserved"]
    assert peaks.replay is not None
    assert peaks.replay.allocated_end == rec.allocated_after


def test_a_truncated_trace_is_not_trusted() -> None:
    rec, _ = _recording()
    from dataclasses import replace

    cut = replace(
        rec, windows=(replace(rec.windows[0], events=rec.events[: len(rec.events) // 2]),)
    )
    peaks = device_peaks(cut)
    assert peaks.source == "counters"
    assert "trace replay ended at" in (peaks.note or "")


def test_requested_sizes_alone_would_not_match() -> None:
    """Why the block model exists: summing requested sizes misses the allocator's rounding."""
    rec, data = _recording()
    level = peak = rec.allocated_before
    live: dict[int, int] = {}
    for e in rec.events:
        if e.action == "alloc":
            live[e.address] = e.size
            level += e.size
        elif e.action == "free_requested":
            level -= live.pop(e.address, 0)
        peak = max(peak, level)
    assert peak != data["independent_peak_allocated"]


def test_the_replay_and_the_report_leave_no_cycle_for_the_collector() -> None:
    rec, _ = _recording()
    (window,) = rec.windows

    def analyse() -> None:
        replay(window.segments_before, window.events)
        layout_after(window.segments_before, window.events)
        cell = CellRecording(
            started_at=0.0, wall_s=1.0, cuda_available=True, devices={0: rec}, error=None
        )
        report = build_report(cell)  # the whole analysis of a GPU cell, its text and HTML
        assert report.peak_allocated_bytes == rec.max_allocated_after
        assert "text/html" in report._repr_mimebundle_()

    assert collected(analyse) == {}
