"""Record what the CUDA caching allocator does while a cell runs.

The allocator's own trace (``torch.cuda.memory._record_memory_history``) is the
event source: it costs well under 1% of step time and sees every block. A cell
is bracketed by a layout snapshot at its start and the trace at its end, so the
replay in :mod:`jupyter_gpumem.analysis.replay` gives exact peaks however the
cell touches the allocator's counters.

The user's own recording is never disturbed: if they record history, the cell's
events are located in their trace and their recording is left as it was.

Known limitations:
- Recording enabled with ``enabled="state"`` (no trace) before the extension was
  loaded looks like no recording, and is switched off after the cell.
- A cell that switches recording off, or records more than ``max_entries``
  events, falls back to the counters (reported as such).
- Only the default allocator is traced; ``cudaMallocAsync`` falls back to counters.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from jupyter_gpumem.records import (
    SEGMENT_ACTIONS,
    BlockState,
    DeviceRecording,
    SegmentState,
    StepSample,
    TraceEvent,
    TraceWindow,
)
from jupyter_gpumem.tracking.counters import COUNTERS, Interval
from jupyter_gpumem.tracking.snapshot import (
    entry_key,
    new_blocks,
    private_pools,
    read_events,
    read_segments,
)
from jupyter_gpumem.tracking.workspaces import workspaces

MAX_ENTRIES = 2_000_000


class RecordingGuard:
    """Watches calls to ``torch.cuda.memory._record_memory_history``.

    Installed while the extension is loaded so that the tracker knows whether the
    user records history (and how) and never switches their recording off.
    """

    def __init__(self) -> None:
        self.user_enabled: bool | None = None  # None: never seen a call
        self.calls = 0
        self._original: Callable[..., Any] | None = None
        self._module: Any = None

    def install(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None or self._original is not None:
            return
        module = torch.cuda.memory
        original = module._record_memory_history

        def _record_memory_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            self.user_enabled = enabled not in (None, False)
            return original(enabled, *args, **kwargs)

        _record_memory_history.__wrapped__ = original  # type: ignore[attr-defined]
        _record_memory_history.__doc__ = original.__doc__
        module._record_memory_history = _record_memory_history
        self._original, self._module = original, module

    def uninstall(self) -> None:
        if self._original is not None:
            self._module._record_memory_history = self._original
        self._original = self._module = None

    @property
    def installed(self) -> bool:
        return self._original is not None

    def original(self) -> Callable[..., Any]:
        torch = sys.modules["torch"]
        return self._original or torch.cuda.memory._record_memory_history


GUARD = RecordingGuard()


Activity = tuple[Any, ...]  # the allocator's event counters: equal readings, the same layout


LayoutAfter = Callable[
    [Sequence[SegmentState], Sequence[TraceEvent]], "tuple[SegmentState, ...] | None"
]


class LayoutCache:
    """The allocator's layout as last known, per device, with its activity counters then.

    Reading the layout costs in proportion to every block the process holds (16 ms in torch
    for 21,700 blocks on an H100 host), however little a cell touches.
    When the counters read now equal those kept with a layout, the allocator has neither
    allocated nor freed since, so that layout is the layout now. A layout kept at a window's
    end is made only if a later window starts from it: parsed from a snapshot's entries, or
    replayed from the window's start and events where only the trace was read.
    """

    def __init__(self) -> None:
        self._layouts: dict[int, tuple[Activity, Any]] = {}

    def keep(self, device: int, activity: Activity, layout: Any) -> None:
        """``layout``: parsed segments, a snapshot's raw segment list, or a function that
        makes the segments (None where it cannot)."""
        self._layouts[device] = (activity, layout)

    def get(self, device: int, activity: Activity) -> tuple[SegmentState, ...] | None:
        kept = self._layouts.get(device)
        if kept is None or kept[0] != activity:
            return None
        layout = kept[1]
        if callable(layout):
            layout = layout()
            if layout is None:
                del self._layouts[device]
                return None
        elif not isinstance(layout, tuple):
            layout = read_segments(layout, device)
        self._layouts[device] = (activity, layout)
        return layout

    def clear(self) -> None:
        self._layouts.clear()


LAYOUTS = LayoutCache()


class TraceReader:
    """Reads the allocator's trace without its layout.

    torch hands the trace out only with a snapshot, and a whole snapshot costs per block
    the process holds. One filtered to a private pool of ours that never holds memory
    carries every trace entry and no segment: 0.8 ms where the whole one takes 16 ms
    (21,700 blocks, H100). Used with one visible device, where the pool exists on the only
    allocator that is asked; elsewhere, or where this torch has no pool filter, ``read``
    gives None and the caller reads the whole snapshot.
    """

    def __init__(self) -> None:
        self._pool: Any = None
        self._arg: tuple[int, ...] | None = None
        self.usable: bool | None = None  # None: not tried yet

    def read(self, torch: Any) -> Mapping[str, Any] | None:
        if self.usable is False or torch.cuda.device_count() != 1:
            return None
        try:
            if self._pool is None:
                self._pool = torch.cuda.MemPool()
            pool_id = tuple(self._pool.id)
            for arg in (self._arg,) if self._arg else ((*pool_id, True), pool_id):
                try:
                    snapshot = torch._C._cuda_memorySnapshot(arg)
                except TypeError:
                    continue
                if snapshot.get("segments"):  # the filter was not applied
                    break
                self._arg, self.usable = arg, True
                return snapshot  # type: ignore[no-any-return]
        except (AttributeError, RuntimeError):
            pass
        self.usable = False
        return None


TRACES = TraceReader()


@dataclass
class _WindowStart:
    segments: tuple[SegmentState, ...]
    allocated: int
    reserved: int
    trace_len: int
    trace_last: tuple[Any, ...] | None
    step: int
    started_us: int
    activity: Activity = ()


class CudaSession:
    """Brackets one cell: ``start()`` before it runs, ``finish()`` after, even if it raised.

    In between, ``end_window()`` and ``begin_window()`` switch the allocator trace off and
    on at step boundaries, and ``sample()`` reads the peak counters there; the cell's
    exact peak comes from independent peak counters whatever the trace covered.
    """

    def __init__(
        self,
        torch: Any,
        *,
        trace: bool,
        devices: Sequence[int] | None,
        counters_reason: str = "--no-trace: counters only",
        snapshot_path: str | None = None,
        digest: Callable[[TraceWindow], Any] | None = None,
        layout_after: LayoutAfter | None = None,
    ) -> None:
        self.snapshot_path = snapshot_path
        self.digest = digest  # made of a window that closes mid-cell, kept as its `replayed`
        self.layout_after = layout_after  # the layout a window left, from its start and events
        self.torch = torch
        self.trace = trace
        self.counters_reason = counters_reason
        self.devices = devices
        self._we_record = False
        self._user_records = False
        self._guard_calls = 0
        self._pending_start = False
        self._pid = os.getpid()
        self._before: dict[int, tuple[int, int]] = {}
        self._intervals: dict[int, Interval] = {}
        self._open: dict[int, _WindowStart] = {}  # the window being recorded, per device
        self._windows: dict[int, list[TraceWindow]] = {}
        self._samples: dict[int, list[StepSample]] = {}
        self._best: dict[int, int] = {}  # highest peak read from the counters so far
        self._snapshot: Mapping[str, Any] | None = None  # the last one, for --snapshot
        self.notes: list[str] = []

    @property
    def detailed(self) -> bool:
        """True while a window records every allocator event."""
        return bool(self._open)

    @property
    def ready(self) -> bool:
        """True once CUDA is up and the session has started recording."""
        return not self._pending_start and self.torch.cuda.is_initialized()

    # -- start -------------------------------------------------------------------
    def start(self) -> None:
        torch = self.torch
        GUARD.install()
        COUNTERS.install()
        self._guard_calls = GUARD.calls
        if not torch.cuda.is_initialized():
            # Never initialise CUDA ourselves: start when the cell does.
            self._pending_start = True
            torch.cuda._lazy_call(self._start_when_initialized)
            return
        for d in self._device_indices():
            self._before[d] = _current(torch, d)
            self._intervals[d] = COUNTERS.open(d)
        if self.trace:
            self._begin(step=0)

    def _start_when_initialized(self) -> None:
        # A forked child inherits torch's queue of calls to make when CUDA comes up: recording
        # is the parent's business, and the child's own CUDA must come up untouched.
        if not self._pending_start or os.getpid() != self._pid:
            return
        self._pending_start = False
        for d in self._device_indices():
            # Nothing was allocated before CUDA came up; the real peaks count from here.
            self._before[d] = (0, 0)
            self._intervals[d] = COUNTERS.adopt(d)
        if self.trace:
            self._user_records = bool(GUARD.user_enabled)
            for d in self._device_indices():
                self._open[d] = _WindowStart((), 0, 0, 0, None, 0, _now_us())
            if not self._user_records:
                self._enable()

    def _begin(self, step: int) -> None:
        torch = self.torch
        devices = self._device_indices()
        activity = {d: _activity(torch, d) for d in devices}
        kept = {d: self._kept_layout(d, activity[d]) for d in devices}
        traces: Sequence[Sequence[Mapping[str, Any]]] = []
        raw: Sequence[Mapping[str, Any]] = []
        if any(layout is None for layout in kept.values()):
            snapshot = torch.cuda.memory._snapshot()
            traces, raw = snapshot.get("device_traces", []), snapshot.get("segments", [])
            if not self._windows and not self._we_record:
                self._user_records = bool(GUARD.user_enabled) or any(traces)
        for d in devices:
            trace = traces[d] if d < len(traces) else []
            allocated, reserved = _current(torch, d)
            segments = kept[d]
            if segments is None:
                segments = read_segments(raw, d)
                if not self._user_records:
                    LAYOUTS.keep(d, activity[d], segments)
            self._open[d] = _WindowStart(
                segments=segments,
                allocated=allocated,
                reserved=reserved,
                trace_len=len(trace),
                trace_last=entry_key(trace[-1]) if trace else None,
                step=step,
                started_us=_now_us(),
                activity=activity[d],
            )
        if not self._user_records:
            self._enable()

    def _kept_layout(self, device: int, activity: Activity) -> tuple[SegmentState, ...] | None:
        """The kept layout where it is the layout now and no one else's trace is to be read."""
        if self._user_records or GUARD.user_enabled or self.snapshot_path:
            return None
        return LAYOUTS.get(device, activity)

    def _enable(self) -> None:
        GUARD.original()(
            "all", context="alloc", stacks="python", max_entries=MAX_ENTRIES, clear_history=True
        )
        self._we_record = True

    # -- at step boundaries --------------------------------------------------------
    def end_window(self, step: int) -> None:
        """Close the detailed window after ``step``; later steps are followed by counters."""
        if self.ready and self._open:
            self.sample(step)
            self._close(step)

    def begin_window(self, step: int) -> None:
        """Record every event again from ``step`` on (a new peak was seen)."""
        if self.ready and self.trace and not self._open and GUARD.calls == self._guard_calls:
            self._begin(step)

    def sample(self, step: int) -> bool:
        """Read the counters at a step boundary; True if a device passed its highest so far."""
        if not self.ready:
            return False
        now = _now_us()
        higher = False
        for d in self._intervals:
            r = COUNTERS.sample(d)
            self._samples.setdefault(d, []).append(
                StepSample(now, step, r.allocated, r.reserved, r.peak_allocated, r.peak_reserved)
            )
            best = self._best.get(d)
            higher = higher or (best is not None and r.peak_allocated > best)
            self._best[d] = max(best or 0, r.peak_allocated)
        return higher

    def _close(self, last_step: int | None) -> None:
        torch = self.torch
        user_changed = GUARD.calls != self._guard_calls
        activity = {d: _activity(torch, d) for d in self._open}
        # No allocator event on any device since the window began: its trace is empty and
        # its layout unchanged, so neither is read (the read costs per block the process holds).
        quiet = (
            not self.snapshot_path
            and not self._user_records
            and not user_changed
            and all(activity[d] == start.activity for d, start in self._open.items())
        )
        snapshot, whole = ({}, False) if quiet else self._read(torch)
        if self.snapshot_path:
            self._snapshot = snapshot
        if self._we_record and not user_changed:
            GUARD.original()(None, clear_history=True)  # nothing of ours for later reads
            self._we_record = False
        traces = snapshot.get("device_traces", [])
        for d, start in self._open.items():
            trace = traces[d] if d < len(traces) else []
            allocated, reserved = _current(torch, d)
            problem: str | None = None
            events: tuple[TraceEvent, ...] = ()
            first = 0 if quiet else self._window_start_index(start, trace)
            if first is None:
                problem = "the allocator trace wrapped (more events than it keeps)"
            elif len(trace) >= MAX_ENTRIES:
                problem = f"the cell made more than {MAX_ENTRIES} allocator events"
            elif user_changed and not trace:
                problem = "the cell switched memory history recording off"
            else:
                events = read_events(trace[first:])
            if not self._user_records and not user_changed:
                LAYOUTS.keep(d, activity[d], self._layout_now(snapshot, whole, start, events))
            self._windows.setdefault(d, []).append(
                TraceWindow(
                    segments_before=start.segments,
                    events=events,
                    allocated_start=start.allocated,
                    reserved_start=start.reserved,
                    allocated_end=allocated,
                    reserved_end=reserved,
                    first_step=start.step,
                    last_step=last_step,
                    problem=problem,
                    started_us=start.started_us,
                    private_pools=private_pools(snapshot.get("segments", ()), d, start.segments),
                )
            )
            if last_step is not None and problem is None and self.digest is not None:
                window = self._windows[d][-1]
                self._windows[d][-1] = replace(window, replayed=self.digest(window))
        self._open.clear()

    def _read(self, torch: Any) -> tuple[Mapping[str, Any], bool]:
        """The snapshot at a window's end, and whether it holds the layout.

        The trace alone, except for ``--snapshot`` and after a segment came or went (it
        may belong to a CUDA graph's pool, which only the layout tells).
        """
        if not self.snapshot_path:
            traces = TRACES.read(torch)
            if traces is not None and not any(
                e.get("action") in SEGMENT_ACTIONS for t in traces["device_traces"] for e in t
            ):
                return traces, False
        return torch.cuda.memory._snapshot(), True

    def _layout_now(
        self,
        snapshot: Mapping[str, Any],
        whole: bool,
        start: _WindowStart,
        events: Sequence[TraceEvent],
    ) -> Any:
        """What ``LAYOUTS`` keeps at a window's end: the snapshot's segments where it has
        them, else the window's start replayed through its events when a window needs it."""
        if whole:
            return snapshot["segments"]
        if not events:
            return start.segments
        layout_after = self.layout_after
        if layout_after is None:
            return lambda: None
        segments = start.segments
        return lambda: layout_after(segments, events)

    def _write_snapshot(self, path: str) -> None:
        """``--snapshot``: the last snapshot read, written whole or not at all; a failure (a
        full disk, a folder gone) is a note, and the counters are closed all the same."""
        if self._snapshot is None:
            self.notes.append(
                f"no snapshot was written to {path}: the allocator trace was not read"
            )
            return
        try:
            write_pickle(path, self._snapshot)
        except (OSError, pickle.PicklingError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            self.notes.append(f"no snapshot was written to {path}: {reason}")

    def _window_start_index(
        self, start: _WindowStart, trace: Sequence[Mapping[str, Any]]
    ) -> int | None:
        """Index of the window's first event in ``trace``; None if it was overwritten."""
        if not self._user_records or start.trace_len == 0:
            return 0
        n, key = start.trace_len, start.trace_last
        if n <= len(trace) and entry_key(trace[n - 1]) == key:
            return n
        for i in range(min(n, len(trace)) - 1, -1, -1):  # the ring dropped older entries
            if entry_key(trace[i]) == key:
                return i + 1
        return None

    # -- finish ------------------------------------------------------------------
    def close(self) -> None:
        """Stop recording and keep nothing: for a cell whose recording was cut short (Ctrl-C).

        Safe to call more than once, and after ``finish``.
        """
        self._pending_start = False
        for d in list(self._intervals):
            COUNTERS.close(self._intervals.pop(d))
        self._open.clear()
        if self._we_record:
            GUARD.original()(None, clear_history=True)
            self._we_record = False

    def finish(self, step: int = 0) -> dict[int, DeviceRecording]:
        """Close what is open; ``step`` is the loop step the cell ended in."""
        torch = self.torch
        self._pending_start = False
        if not torch.cuda.is_initialized():
            if self.snapshot_path:
                self.notes.append(
                    f"no snapshot was written to {self.snapshot_path}: the cell did not use CUDA"
                )
            return {}
        end_blocks: dict[int, tuple[BlockState, ...]] = {}
        if self._open:
            self._close(None)
        elif self._windows and GUARD.calls == self._guard_calls and self._past_windows(step):
            self.sample(step)  # the tail after the last boundary
            if self._moved_since_windows():
                # The cell ended holding other bytes than its last window left: read what
                # it left alive. Else the window's own list stands, with no read per block.
                layout = torch.cuda.memory._snapshot()
                for d, windows in self._windows.items():
                    end_blocks[d] = new_blocks(
                        layout.get("segments", []), d, windows[0].segments_before
                    )
        if self.snapshot_path:
            self._write_snapshot(self.snapshot_path)
        recordings = {}
        for d in self._device_indices():
            allocated_before, reserved_before = self._before.get(d, (0, 0))
            cell_peak: tuple[int, int] | tuple[None, None] = (None, None)
            if d in self._intervals:
                cell_peak = COUNTERS.close(self._intervals.pop(d))
            problem: str | None = None
            if not self.trace:
                problem = self.counters_reason
            elif not self._windows.get(d):
                problem = "the allocator trace was not recorded"
            stats = torch.cuda.memory.memory_stats_as_nested_dict(d)
            props = torch.cuda.get_device_properties(d)
            allocated_after, reserved_after = _current(torch, d)
            recordings[d] = DeviceRecording(
                index=d,
                name=props.name,
                total_bytes=int(props.total_memory),
                allocated_before=allocated_before,
                reserved_before=reserved_before,
                allocated_after=allocated_after,
                reserved_after=reserved_after,
                max_allocated_after=int(
                    stats.get("allocated_bytes", {}).get("all", {}).get("peak", 0)
                ),
                max_reserved_after=int(
                    stats.get("reserved_bytes", {}).get("all", {}).get("peak", 0)
                ),
                windows=tuple(self._windows.get(d, ())),
                samples=tuple(self._samples.get(d, ())),
                cell_peak_allocated=cell_peak[0],
                cell_peak_reserved=cell_peak[1],
                trace_problem=problem,
                end_blocks=end_blocks.get(d),
                workspaces=workspaces(torch, d),
            )
        return recordings

    def activity(self) -> tuple[Activity, ...] | None:
        """The allocator's event counters on every device; None before CUDA is up."""
        if not self.torch.cuda.is_initialized():
            return None
        return tuple(_activity(self.torch, d) for d in self._device_indices())

    def _moved_since_windows(self) -> bool:
        """True when a device held other bytes at the cell's last step boundary than when its
        last window closed at one (a steady loop's boundaries all hold the same)."""
        for d, windows in self._windows.items():
            boundaries = [s for s in self._samples.get(d, ())[:-1] if s.step > 0]
            if not boundaries or boundaries[-1].allocated != windows[-1].allocated_end:
                return True
        return False

    def _past_windows(self, step: int) -> bool:
        """True when the cell went on past its last window (not when it ended with it)."""
        last = [w.last_step for ws in self._windows.values() for w in ws]
        return any(s is None or s < step for s in last)

    def _device_indices(self) -> list[int]:
        count = self.torch.cuda.device_count()
        if self.devices is None:
            return list(range(count))
        return [d for d in self.devices if d < count]


_ACTIVITY_STATS = (
    "allocation", "segment", "active", "inactive_split",
    "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
)  # fmt: skip
_ACTIVITY_COUNTS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")


def _activity(torch: Any, device: int) -> Activity:
    """The allocator's counters of what it did: any allocation, free, split, merge or
    segment change moves one of them (a reset of the user's moves them too, to be safe)."""
    stats = torch._C._cuda_memoryStats(device)
    out: list[Any] = []
    for name in _ACTIVITY_STATS:
        counts = stats.get(name, {}).get("all", {})
        out += (counts.get("current"), counts.get("allocated"), counts.get("freed"))
    out += (stats.get(name) for name in _ACTIVITY_COUNTS)
    return tuple(out)


def _current(torch: Any, device: int) -> tuple[int, int]:
    """Allocated and reserved bytes now, read without our own stats wrapper."""
    stats = torch._C._cuda_memoryStats(device)
    return (
        int(stats.get("allocated_bytes", {}).get("all", {}).get("current", 0)),
        int(stats.get("reserved_bytes", {}).get("all", {}).get("current", 0)),
    )


def write_pickle(path: str | os.PathLike[str], obj: Any) -> None:
    """Pickle ``obj`` to ``path`` whole or not at all.

    Written to a new file beside ``path`` (same folder, same file system), synced, then renamed
    over it: on any error the new file is removed and ``path`` is as it was before.
    """
    folder, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())  # a full disk says so here, not after the rename
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _now_us() -> int:
    return time.time_ns() // 1000


def allocator_backend() -> str:
    """``native`` or ``cudaMallocAsync``, from the environment (no CUDA call)."""
    conf = (
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        + ","
        + os.environ.get("PYTORCH_ALLOC_CONF", "")
    )
    return "cudaMallocAsync" if "backend:cudaMallocAsync" in conf.replace(" ", "") else "native"
