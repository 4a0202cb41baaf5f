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

import os
import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.analysis.replay import BlockState, SegmentState, TraceEvent

MAX_ENTRIES = 2_000_000
_STATES = {"active_allocated": "allocated", "active_awaiting_free": "pending", "inactive": "free"}


@dataclass(frozen=True)
class DeviceRecording:
    """Everything recorded on one device for one cell; input to the analysis."""

    index: int
    name: str
    total_bytes: int
    allocated_before: int
    reserved_before: int
    allocated_after: int
    reserved_after: int
    max_allocated_after: int  # the allocator's (resettable) peak counters at the end
    max_reserved_after: int
    segments_before: tuple[SegmentState, ...]
    events: tuple[TraceEvent, ...]
    trace_problem: str | None  # why the trace cannot be used; None when it can
    peak_counters_reset: bool  # True when we reset the peak counters ourselves (--no-trace)


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


class CudaSession:
    """Brackets one cell: ``start()`` before it runs, ``finish()`` after, even if it raised."""

    def __init__(
        self,
        torch: Any,
        *,
        trace: bool,
        devices: Sequence[int] | None,
        counters_reason: str = "--no-trace: counters only",
        snapshot_path: str | None = None,
    ) -> None:
        self.snapshot_path = snapshot_path
        self.torch = torch
        self.trace = trace
        self.counters_reason = counters_reason
        self.devices = devices
        self._initialized_at_start = False
        self._we_record = False
        self._user_records = False
        self._start_len: dict[int, int] = {}
        self._start_last: dict[int, tuple[Any, ...]] = {}
        self._before: dict[int, tuple[int, int, tuple[SegmentState, ...]]] = {}
        self._guard_calls = 0
        self._pending_start = False
        self.notes: list[str] = []

    # -- start -------------------------------------------------------------------
    def start(self) -> None:
        torch = self.torch
        GUARD.install()
        self._guard_calls = GUARD.calls
        self._initialized_at_start = torch.cuda.is_initialized()
        if not self._initialized_at_start:
            # Never initialise CUDA ourselves: start recording when the cell does.
            if self.trace:
                self._pending_start = True
                torch.cuda._lazy_call(self._start_when_initialized)
            return
        if not self.trace:
            for d in self._device_indices():
                self._before[d] = (
                    torch.cuda.memory_allocated(d),
                    torch.cuda.memory_reserved(d),
                    (),
                )
                torch.cuda.reset_peak_memory_stats(d)
            return
        snapshot = torch.cuda.memory._snapshot()
        traces = snapshot.get("device_traces", [])
        self._user_records = bool(GUARD.user_enabled) or any(traces)
        for d in self._device_indices():
            segments = _segments(snapshot.get("segments", []), d)
            self._before[d] = (
                torch.cuda.memory_allocated(d),
                torch.cuda.memory_reserved(d),
                segments,
            )
            trace = traces[d] if d < len(traces) else []
            self._start_len[d] = len(trace)
            if trace:
                self._start_last[d] = _entry_key(trace[-1])
        if not self._user_records:
            self._enable()

    def _start_when_initialized(self) -> None:
        if not self._pending_start:
            return
        self._pending_start = False
        self._user_records = bool(GUARD.user_enabled)
        if not self._user_records:
            self._enable()

    def _enable(self) -> None:
        GUARD.original()(
            "all", context="alloc", stacks="python", max_entries=MAX_ENTRIES, clear_history=True
        )
        self._we_record = True

    # -- finish ------------------------------------------------------------------
    def finish(self) -> dict[int, DeviceRecording]:
        torch = self.torch
        self._pending_start = False
        if not torch.cuda.is_initialized():
            return {}
        user_changed = GUARD.calls != self._guard_calls
        snapshot: Mapping[str, Any] = {}
        if self.trace and (self._we_record or self._user_records):
            snapshot = torch.cuda.memory._snapshot()
            if self.snapshot_path:
                with open(self.snapshot_path, "wb") as f:
                    pickle.dump(snapshot, f)
            if self._we_record and not user_changed:
                GUARD.original()(None)
        traces = snapshot.get("device_traces", [])
        recordings = {}
        for d in self._device_indices():
            if d in self._before:
                allocated_before, reserved_before, segments = self._before[d]
            else:  # CUDA came up during the cell: nothing was allocated before it
                allocated_before, reserved_before, segments = 0, 0, ()
            events: tuple[TraceEvent, ...] = ()
            problem: str | None = None
            if not self.trace:
                problem = self.counters_reason
            elif not (self._we_record or self._user_records):
                problem = "the allocator trace was not recorded"
            else:
                trace = traces[d] if d < len(traces) else []
                start = self._cell_start(d, trace)
                if start is None:
                    problem = "the allocator trace wrapped (more events than it keeps)"
                elif self._we_record and len(trace) >= MAX_ENTRIES:
                    problem = f"the cell made more than {MAX_ENTRIES} allocator events"
                elif user_changed and self._we_record and not trace:
                    problem = "the cell switched memory history recording off"
                else:
                    events = tuple(_event(e) for e in trace[start:])
            props = torch.cuda.get_device_properties(d)
            recordings[d] = DeviceRecording(
                index=d,
                name=props.name,
                total_bytes=int(props.total_memory),
                allocated_before=allocated_before,
                reserved_before=reserved_before,
                allocated_after=torch.cuda.memory_allocated(d),
                reserved_after=torch.cuda.memory_reserved(d),
                max_allocated_after=torch.cuda.max_memory_allocated(d),
                max_reserved_after=torch.cuda.max_memory_reserved(d),
                segments_before=segments,
                events=events,
                trace_problem=problem,
                peak_counters_reset=not self.trace and d in self._before,
            )
        return recordings

    def _cell_start(self, device: int, trace: Sequence[Mapping[str, Any]]) -> int | None:
        """Index of the cell's first event in ``trace``; None if it was overwritten."""
        if not self._user_records or self._start_len.get(device, 0) == 0:
            return 0
        n = self._start_len[device]
        key = self._start_last[device]
        if n <= len(trace) and _entry_key(trace[n - 1]) == key:
            return n
        for i in range(min(n, len(trace)) - 1, -1, -1):  # the ring dropped older entries
            if _entry_key(trace[i]) == key:
                return i + 1
        return None

    def _device_indices(self) -> list[int]:
        count = self.torch.cuda.device_count()
        if self.devices is None:
            return list(range(count))
        return [d for d in self.devices if d < count]


def allocator_backend() -> str:
    """``native`` or ``cudaMallocAsync``, from the environment (no CUDA call)."""
    conf = (
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        + ","
        + os.environ.get("PYTORCH_ALLOC_CONF", "")
    )
    return "cudaMallocAsync" if "backend:cudaMallocAsync" in conf.replace(" ", "") else "native"


def _segments(raw: Sequence[Mapping[str, Any]], device: int) -> tuple[SegmentState, ...]:
    return tuple(
        SegmentState(
            address=int(seg["address"]),
            total_size=int(seg["total_size"]),
            is_small=seg.get("segment_type") == "small",
            blocks=tuple(
                BlockState(int(b["address"]), int(b["size"]), _STATES.get(b["state"], "allocated"))
                for b in seg.get("blocks", ())
            ),
        )
        for seg in raw
        if seg.get("device", 0) == device
    )


def _event(entry: Mapping[str, Any]) -> TraceEvent:
    return TraceEvent(
        action=entry["action"],
        address=int(entry.get("addr", 0)),
        size=int(entry.get("size", 0)),
        time_us=int(entry.get("time_us", 0)),
        frames=entry.get("frames", ()),
    )


def _entry_key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    return (entry.get("action"), entry.get("addr"), entry.get("size"), entry.get("time_us"))
