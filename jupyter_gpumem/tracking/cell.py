"""Bracket one cell: which event sources apply, when they start, what they hand over."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpumem.analysis.replay import TraceEvent
from jupyter_gpumem.tracking.cuda import CudaSession, DeviceRecording, allocator_backend
from jupyter_gpumem.tracking.namespace import NamedStorage, named_storages, walk
from jupyter_gpumem.tracking.tags import PhaseMark, Tag, Tagger

log = logging.getLogger(__name__)
_FAILED = object()


@dataclass(frozen=True)
class CellOptions:
    """The parsed `%%gpumem` options that affect recording."""

    trace: bool = True
    devices: Sequence[int] | None = None  # None: every device the cell touched
    all_devices: bool = False
    snapshot_path: str | None = None


@dataclass(frozen=True)
class CellRecording:
    """What was recorded while one cell ran; the analysis turns it into a report."""

    started_at: float
    wall_s: float
    cuda_available: bool
    devices: dict[int, DeviceRecording]
    error: BaseException | None
    notes: tuple[str, ...] = field(default=())
    tags: tuple[Tag, ...] = ()
    marks: tuple[PhaseMark, ...] = ()
    named: Mapping[int, NamedStorage] = field(default_factory=dict)
    cpu_events: tuple[TraceEvent, ...] | None = None  # the CPU source's events, when it ran
    cpu_start: tuple[
        tuple[int, int], ...
    ] = ()  # (address, bytes) of CPU storages alive at the start


class CellTracker:
    """``start()`` before the cell, ``stop(error)`` after it; never imports torch itself.

    A failure of a tag or event source is logged and noted, never raised into the cell.
    """

    def __init__(self, options: CellOptions, user_ns: Mapping[str, Any] | None = None) -> None:
        self.options = options
        self.user_ns: Mapping[str, Any] = user_ns if user_ns is not None else {}
        self._session: CudaSession | None = None
        self._tagger: Tagger | None = None
        self._cpu: Any = None
        self._cpu_start: tuple[tuple[int, int], ...] = ()
        self._notes: list[str] = []
        self._t0 = 0.0
        self._started_at = 0.0

    def start(self) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            trace = self.options.trace
            if trace and allocator_backend() != "native":
                trace = False
                self._notes.append("the cudaMallocAsync backend keeps no trace: counters only")
            self._session = CudaSession(
                torch,
                trace=trace,
                devices=self.options.devices,
                snapshot_path=self.options.snapshot_path,
            )
            self._session.start()
        elif torch is not None and self.options.trace:
            started = self._guarded("CPU tensor source", lambda: _start_cpu_source(self.user_ns))
            if started is not _FAILED:
                self._cpu, self._cpu_start = started
        if torch is not None and self.options.trace:
            self._tagger = Tagger(torch, self.user_ns)
            if self._guarded("tags", self._tagger.start) is _FAILED:
                self._tagger = None
        self._started_at = time.time()
        self._t0 = time.perf_counter()

    def stop(self, error: BaseException | None) -> CellRecording:
        wall_s = time.perf_counter() - self._t0
        tags: tuple[Tag, ...] = ()
        marks: tuple[PhaseMark, ...] = ()
        if self._tagger is not None:
            stopped = self._guarded("tags", self._tagger.stop)
            if stopped is not _FAILED:
                tags, marks = stopped
        cpu_events = None
        if self._cpu is not None:
            events = self._guarded("CPU tensor source", self._cpu.stop)
            cpu_events = None if events is _FAILED else events
        torch = sys.modules.get("torch")
        cuda = torch is not None and torch.cuda.is_available()
        devices: dict[int, DeviceRecording] = {}
        if torch is not None and cuda and self._session is None and torch.cuda.is_initialized():
            # torch arrived with the cell, so CUDA was not initialised before it.
            self._session = CudaSession(
                torch,
                trace=False,
                devices=self.options.devices,
                counters_reason="torch was imported inside the cell",
            )
        if self._session is not None:
            devices = self._session.finish()
        named = named_storages(self.user_ns) if torch is not None else {}
        return CellRecording(
            started_at=self._started_at,
            wall_s=wall_s,
            cuda_available=bool(cuda),
            devices=devices,
            error=error,
            notes=tuple(self._notes),
            tags=tags,
            marks=marks,
            named=named,
            cpu_events=cpu_events,
            cpu_start=self._cpu_start,
        )

    def _guarded(self, what: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:
            log.warning("jupyter_gpumem: %s failed", what, exc_info=True)
            self._notes.append(f"{what} unavailable: {exc!r}")
            return _FAILED


def _start_cpu_source(user_ns: Mapping[str, Any]) -> tuple[Any, tuple[tuple[int, int], ...]]:
    """The CPU stand-in for the allocator trace, following the namespace's tensors for frees."""
    from jupyter_gpumem.tracking.dispatch import DispatchRecorder

    recorder = DispatchRecorder()
    start = recorder.start(t for t, _, _ in walk(user_ns))
    return recorder, start
