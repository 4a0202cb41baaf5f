"""`%gpumem monitor`: live GPU gauges fed from the kernel, for frontends without the sidebar.

Per GPU: a used/total bar, a text line and a bqplot sparkline of the last minutes. A background
thread in the kernel (the sampler of `jupyter_gpumem.nvml.sampler`) reads NVML and updates the
widgets' traits after each read.

Known limitations:
    - The thread stops when the widget is closed (``widget.close()``, or the frontend closing
      its comm) or the kernel exits. Clearing the cell output does not close a widget, so a
      cleared monitor keeps sampling until then.
    - Devices are numbered as this kernel's ``CUDA_VISIBLE_DEVICES`` would number them.
    - NVML errors are shown in the widget only: they are logged to ``LOG``, which has no handler
      and does not propagate (add a handler to see them). In a kernel, a warning that reaches
      logging's last-resort handler is a second, red copy of the reason on stderr.
"""

from __future__ import annotations

import atexit
import html
import logging
import operator
import os
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import ipywidgets as widgets
from bqplot import Figure, LinearScale, Lines

from jupyter_gpumem.nvml.library import NvmlBackend
from jupyter_gpumem.nvml.readings import DeviceRecord, Sample
from jupyter_gpumem.nvml.sampler import MIN_INTERVAL_S, Backend, Sampler, check_interval
from jupyter_gpumem.units import echoed, format_bytes

__all__ = ["GpuMonitor", "show"]

THREAD_NAME = "jupyter-gpumem-monitor"
LOG = logging.getLogger(__name__)
LOG.addHandler(logging.NullHandler())
LOG.propagate = False
GiB = 2**30
MAX_INTERVAL_S = 3600.0  # the sampler waits this long between reads: longer is no live gauge
MAX_HISTORY_S = 86_400.0  # a day of sparkline


class _DeviceView:
    """The widgets of one device, and the points of its sparkline."""

    def __init__(self, device: DeviceRecord, points: int) -> None:
        self.index = device.index
        kind = "MIG" if device.is_mig else "GPU"
        self.title = widgets.Label(f"{kind} {device.index}: {device.name or 'unknown device'}")
        self.bar = widgets.FloatProgress(min=0.0, max=1.0, layout=widgets.Layout(width="100%"))
        self.text = widgets.Label()
        total = device.memory_total_bytes
        self.times: deque[float] = deque(maxlen=points)
        self.used_gib: deque[float] = deque(maxlen=points)
        self.line = Lines(
            x=[],
            y=[],
            scales={"x": LinearScale(), "y": LinearScale(min=0.0, max=(total or GiB) / GiB)},
        )
        self.figure = Figure(
            marks=[self.line],
            fig_margin={"top": 2, "bottom": 2, "left": 2, "right": 2},
            layout=widgets.Layout(height="60px", width="100%"),
        )
        self.box = widgets.VBox([self.title, self.bar, self.text, self.figure])

    def update(self, device: DeviceRecord, time: float) -> None:
        used, total = device.memory_used_bytes, device.memory_total_bytes
        fraction = used / total if used is not None and total else 0.0
        own = sum(p.memory_bytes or 0 for p in device.processes if p.pid == os.getpid())
        parts = [f"{format_bytes(used)} / {format_bytes(total)}"]
        if used is not None and total:
            parts[0] += f" ({fraction:.0%})"
        if device.utilization_percent is not None:
            parts.append(f"{device.utilization_percent}% busy")
        if own:
            parts.append(f"this kernel {format_bytes(own)}")
        if used is None:
            parts.append(device.reasons.get("memory_used_bytes", "unknown"))
        if used is not None:
            self.times.append(time)
            self.used_gib.append(used / GiB)
        with self.line.hold_sync():
            self.line.x = list(self.times)
            self.line.y = list(self.used_gib)
        self.bar.value = fraction
        self.bar.bar_style = "danger" if fraction > 0.9 else "warning" if fraction > 0.75 else ""
        self.text.value = " · ".join(parts)


class GpuMonitor(widgets.VBox):
    """The monitor widget; `stop` (or ``close``) ends its sampling thread."""

    def __init__(
        self,
        backend: Backend,
        *,
        interval_s: float,
        devices: Sequence[int] | None,
        history_s: float,
    ) -> None:
        self.interval_s = check_interval(interval_s)
        self._backend = backend
        self._sampler: Sampler | None = None
        self.status = widgets.HTML()
        self.views: list[_DeviceView] = []
        first = backend.read(self.interval_s)
        super().__init__([self.status])
        if not first.available:
            backend.close()
            self._apply(first)
            return
        try:
            self._wanted = self._check_devices(first, devices)
        except ValueError:
            backend.close()
            raise
        points = max(2, int(history_s / self.interval_s))
        self.views = [_DeviceView(d, points) for d in first.devices if d.index in self._wanted]
        self.children = (self.status, *(view.box for view in self.views))
        self._apply(first)
        self.observe(self._on_comm_change, names="comm")
        if self.comm is not None:
            self.comm.on_close(lambda _msg: self.stop())
        atexit.register(self.stop)
        self._sampler = Sampler(
            backend,
            interval_s=self.interval_s,
            history_s=self.interval_s,  # the sparklines keep their own points
            log=LOG,
            on_sample=self._apply,
            thread_name=THREAD_NAME,
        )
        self._sampler.start(first)

    @staticmethod
    def _check_devices(sample: Sample, devices: Sequence[int] | None) -> set[int]:
        known = [d.index for d in sample.devices]
        if devices is None:
            return set(known)
        unknown = sorted(set(devices) - set(known))
        if unknown:
            raise ValueError(f"no device {echoed(unknown)} here; devices are {known or 'none'}")
        return set(devices)

    @property
    def thread(self) -> threading.Thread | None:
        return self._sampler.thread if self._sampler is not None else None

    def _apply(self, sample: Sample) -> None:
        if not sample.available:
            reason = html.escape(sample.reason or "unknown")
            self.status.value = f"<b>GPU monitor:</b> NVML unavailable: {reason}"
            return
        self.status.value = ""
        by_index = {d.index: d for d in sample.devices}
        for view in self.views:
            if view.index in by_index:
                view.update(by_index[view.index], sample.time)

    def _on_comm_change(self, change: dict[str, Any]) -> None:
        if change["new"] is None:
            self.stop()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling and wait for the thread; idempotent, safe from any thread."""
        atexit.unregister(self.stop)
        if self._sampler is not None:
            self._sampler.stop(timeout_s)


def show(
    interval_s: float = 1.0,
    devices: Sequence[int] | None = None,
    *,
    history_s: float = 300.0,
    backend: Backend | None = None,
) -> GpuMonitor:
    """A live per-GPU memory gauge and sparkline, refreshed every ``interval_s`` seconds.

    ``devices`` limits it to those device indices; ``history_s`` is how far back the sparklines
    reach; ``backend`` (tests) replaces real NVML. Each is checked before NVML starts: a
    TypeError or ValueError says what is allowed.
    """
    interval_s = _seconds("interval_s", interval_s, MIN_INTERVAL_S, MAX_INTERVAL_S)
    history_s = _seconds("history_s", history_s, interval_s, MAX_HISTORY_S)
    return GpuMonitor(
        backend if backend is not None else NvmlBackend(log=LOG),
        interval_s=interval_s,
        devices=_devices(devices),
        history_s=history_s,
    )


def _seconds(name: str, value: Any, low: float, high: float) -> float:
    allowed = f"{name} takes seconds from {low:g} to {high:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{allowed}, got {type(value).__name__} {echoed(value)}")
    if not low <= value <= high:  # NaN fails too
        raise ValueError(f"{allowed}, got {echoed(value)}")
    return float(value)


def _devices(devices: Any) -> tuple[int, ...] | None:
    allowed = "devices takes device indices (0, 1, ...), e.g. [0, 1], or None for every device"
    if devices is None:
        return None
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Iterable):
        raise TypeError(f"{allowed}; got {type(devices).__name__} {echoed(devices)}")
    indices: list[int] = []
    for d in devices:
        if isinstance(d, bool) or not hasattr(type(d), "__index__"):
            raise TypeError(f"{allowed}; got {type(d).__name__} {echoed(d)} among them")
        index = operator.index(d)
        if index < 0:
            raise ValueError(f"{allowed}; got {echoed(index)} among them")
        indices.append(index)
    return tuple(indices)
