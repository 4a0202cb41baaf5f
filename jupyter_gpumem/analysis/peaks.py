"""Per-device peak numbers for one cell: independent counters, cross-checked by the trace replay."""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_gpumem.analysis.replay import Replay, replay
from jupyter_gpumem.records import DeviceRecording, StepSample, TraceWindow


@dataclass(frozen=True)
class WindowReplay:
    """A detailed window whose replay ended on the counters read when it closed."""

    window: TraceWindow
    replay: Replay


@dataclass(frozen=True)
class DevicePeaks:
    """The peak numbers of one device and where they came from."""

    peak_allocated: int
    peak_reserved: int
    source: str  # "allocator-trace" when a replayed window reached the peak, else "counters"
    note: str | None  # why the trace was not used, or which steps it covered
    replay: Replay | None  # the replay of the window with the highest peak
    window: TraceWindow | None = None
    windows: tuple[WindowReplay, ...] = ()  # every usable window, in order
    peak_step: int | None = None  # the step whose sample held the peak, when no window did


def device_peaks(rec: DeviceRecording) -> DevicePeaks:
    """Exact peaks: the cell's own peak counters, and every detailed window's replay.

    Both are exact where they apply; the larger wins, so a reset made behind the
    counters' back still leaves the replay's peak. A window's replay must end on the
    counters read when it closed, to the byte, or it is not used.
    """
    usable: list[WindowReplay] = []
    problems: list[str] = []
    if rec.trace_problem is not None:
        problems.append(rec.trace_problem)
    else:
        for w in rec.windows:
            if w.problem is not None:
                problems.append(w.problem)
                continue
            result = replay_window(w)
            problem = _replay_problem(w, result)
            if problem is None:
                usable.append(WindowReplay(w, result))
            else:
                problems.append(problem)
    best = max(usable, key=lambda u: u.replay.peak_allocated, default=None)
    if rec.cell_peak_allocated is None and best is None:
        return _from_counters(rec, problems[0] if problems else "no trace was recorded")
    peak_a = max([rec.cell_peak_allocated or 0, *(u.replay.peak_allocated for u in usable)])
    peak_r = max([rec.cell_peak_reserved or 0, *(u.replay.peak_reserved for u in usable)])
    if best is None:
        reason = problems[0] if problems else "no trace was recorded"
        note = f"{reason}; exact peaks from the cell's own allocator counters, without a breakdown"
        return DevicePeaks(peak_a, peak_r, "counters", note, None)
    notes = [f"{p}; that stretch is covered by the allocator's counters" for p in problems]
    light = len(rec.windows) > 1 or past_windows(rec)
    if light:
        notes.append(_coverage(usable, rec.samples))
    reached = best.replay.peak_allocated == peak_a
    step = None
    if not reached:
        step = _sample_step(rec.samples, peak_a)
        where = f"around step {step}" if step is not None else "between the recorded steps"
        notes.append(
            f"the peak came {where}, outside the steps recorded in detail; the breakdown is of "
            f"the highest recorded step, {peak_a - best.replay.peak_allocated} bytes lower, and "
            "the difference is shown as unattributed"
        )
    return DevicePeaks(
        peak_allocated=peak_a,
        peak_reserved=peak_r,
        source="allocator-trace" if reached else "counters",
        note="; ".join(notes) or None,
        replay=best.replay,
        window=best.window,
        windows=tuple(usable),
        peak_step=step,
    )


def replay_window(w: TraceWindow) -> Replay:
    """The window's replay: the one made when it closed mid-cell, else made now."""
    if isinstance(w.replayed, Replay):
        return w.replayed
    return replay(
        w.segments_before,
        w.events,
        allocated_start=w.allocated_start,
        reserved_start=w.reserved_start,
    )


def _replay_problem(w: TraceWindow, result: Replay) -> str | None:
    if not result.exact:
        return f"trace replay stopped: {result.reason}"
    if (result.allocated_end, result.reserved_end) != (w.allocated_end, w.reserved_end):
        return (
            f"trace replay ended at {result.allocated_end}/{result.reserved_end} bytes "
            f"allocated/reserved, counters say {w.allocated_end}/{w.reserved_end}"
        )
    return None


def _coverage(usable: list[WindowReplay], samples: tuple[StepSample, ...]) -> str:
    """Which steps the breakdown, phases and timeline events come from."""
    spans = []
    for u in usable:
        first, last = u.window.first_step, u.window.last_step
        if last is None:
            spans.append(f"{first} to the end")
        else:
            spans.append(f"{first}" if last - 1 <= first else f"{first}-{last - 1}")
    steps = " and ".join(spans)
    return (
        f"every allocator event recorded for steps {steps}; the other steps were followed "
        f"by the allocator's peak counters ({len(samples)} readings) and matched that pattern"
    )


def _sample_step(samples: tuple[StepSample, ...], peak: int) -> int | None:
    for s in samples:
        if s.peak_allocated >= peak:
            return max(0, s.step - 1)  # a reading after step n covers the steps up to it
    return None


def _from_counters(rec: DeviceRecording, problem: str) -> DevicePeaks:
    if rec.allocated_before == 0 and rec.reserved_before == 0:
        note = f"{problem}; peaks from the allocator's counters"
    else:
        note = (
            f"{problem}; peaks from the allocator's counters, which may include a higher peak "
            "from before the cell"
        )
    peak_a = max(rec.max_allocated_after, rec.allocated_before, rec.allocated_after)
    peak_r = max(rec.max_reserved_after, rec.reserved_before, rec.reserved_after)
    return DevicePeaks(peak_a, peak_r, "counters", note, None)


def past_windows(rec: DeviceRecording) -> bool:
    """True when the cell ran steps after its last detailed window."""
    ends = [w.last_step for w in rec.windows]
    closed = [e for e in ends if e is not None]
    return (
        bool(ends) and len(closed) == len(ends) and any(s.step > max(closed) for s in rec.samples)
    )
