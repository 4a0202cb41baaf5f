"""Per-device peak numbers for one cell, from the trace replay or, failing that, the counters."""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_gpumem.analysis.replay import Replay, replay
from jupyter_gpumem.tracking.cuda import DeviceRecording


@dataclass(frozen=True)
class DevicePeaks:
    """The peak numbers of one device and where they came from."""

    peak_allocated: int
    peak_reserved: int
    source: str  # "allocator-trace" or "counters"
    note: str | None  # why the counters were used, if they were
    replay: Replay | None  # the exact replay, when the trace was usable


def device_peaks(rec: DeviceRecording) -> DevicePeaks:
    """Exact peaks from the trace replay; the allocator's counters when the replay is unusable.

    The replay must end on the counters read after the cell, to the byte, or it is
    not trusted.
    """
    problem = rec.trace_problem
    result: Replay | None = None
    if problem is None:
        result = replay(
            rec.segments_before,
            rec.events,
            allocated_start=rec.allocated_before,
            reserved_start=rec.reserved_before,
        )
        if not result.exact:
            problem = f"trace replay stopped: {result.reason}"
        elif (result.allocated_end, result.reserved_end) != (
            rec.allocated_after,
            rec.reserved_after,
        ):
            problem = (
                f"trace replay ended at {result.allocated_end}/{result.reserved_end} bytes "
                f"allocated/reserved, counters say {rec.allocated_after}/{rec.reserved_after}"
            )
    if problem is None and result is not None:
        return DevicePeaks(
            result.peak_allocated, result.peak_reserved, "allocator-trace", None, result
        )
    if rec.peak_counters_reset or (rec.allocated_before == 0 and rec.reserved_before == 0):
        note = f"{problem}; peaks from the allocator's counters"
    else:
        note = (
            f"{problem}; peaks from the allocator's counters, which may include a higher peak "
            "from before the cell"
        )
    peak_a = max(rec.max_allocated_after, rec.allocated_before, rec.allocated_after)
    peak_r = max(rec.max_reserved_after, rec.reserved_before, rec.reserved_after)
    return DevicePeaks(peak_a, peak_r, "counters", note, None)
