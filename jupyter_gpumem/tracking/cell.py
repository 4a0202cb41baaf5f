"""Bracket one cell: which event source applies, when it starts, what it hands over."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from jupyter_gpumem.tracking.cuda import CudaSession, DeviceRecording, allocator_backend


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


class CellTracker:
    """``start()`` before the cell, ``stop(error)`` after it; never imports torch itself."""

    def __init__(self, options: CellOptions) -> None:
        self.options = options
        self._session: CudaSession | None = None
        self._notes: list[str] = []
        self._t0 = 0.0
        self._started_at = 0.0
        self._torch_at_start = False

    def start(self) -> None:
        torch = sys.modules.get("torch")
        self._torch_at_start = torch is not None
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
        self._started_at = time.time()
        self._t0 = time.perf_counter()

    def stop(self, error: BaseException | None) -> CellRecording:
        wall_s = time.perf_counter() - self._t0
        torch = sys.modules.get("torch")
        cuda = torch is not None and torch.cuda.is_available()
        devices: dict[int, DeviceRecording] = {}
        if cuda and self._session is None and torch.cuda.is_initialized():
            # torch arrived with the cell, so CUDA was not initialised before it.
            self._session = CudaSession(
                torch,
                trace=False,
                devices=self.options.devices,
                counters_reason="torch was imported inside the cell",
            )
        if self._session is not None:
            devices = self._session.finish()
        return CellRecording(
            started_at=self._started_at,
            wall_s=wall_s,
            cuda_available=bool(cuda),
            devices=devices,
            error=error,
            notes=tuple(self._notes),
        )
