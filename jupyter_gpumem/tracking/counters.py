"""Independent peak counters on top of the CUDA caching allocator's own.

The allocator keeps one peak per statistic and device, reset by
``torch.cuda.reset_peak_memory_stats``. A cell needs the peak of its own interval
(pytorch issue 16266 has asked for independent peak counters since 2019), and so
does each stretch of a long cell that is not traced in detail. :class:`PeakCounters`
gives any number of open intervals their own exact peak by resetting the real counters
and folding the peak reached so far into every open interval first, whoever resets:
us, or the user through ``torch.cuda.reset_peak_memory_stats``.

What the user sees is left as it was: while installed, the peak values that
``torch.cuda.memory_stats`` and everything built on it (``max_memory_allocated``,
``memory_summary``) report are the larger of the real counter and the peak that our
own resets took away since the user's last reset.

Known limitations:
- A reset made without ``torch.cuda.reset_peak_memory_stats`` (a C++ extension, or
  ``torch._C._cuda_resetPeakMemoryStats`` called directly) is not seen: the open
  intervals then lose the peak before it. The trace replay, where it ran, still
  has the exact peak of its window, and the report takes the larger of the two.
- Only the peaks of the native caching allocator's statistics are kept apart.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

_PATCHED = ("reset_peak_memory_stats", "memory_stats_as_nested_dict")


@dataclass
class Interval:
    """An open interval on one device; ``allocated``/``reserved`` are peaks folded so far."""

    device: int
    allocated: int
    reserved: int
    open: bool = True


@dataclass(frozen=True)
class Reading:
    """Counters read at one moment: current values and the peaks of the last bucket."""

    allocated: int
    reserved: int
    peak_allocated: int  # since the last reset of the real counters
    peak_reserved: int


class PeakCounters:
    """Open intervals with their own peaks; installed while the extension is loaded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._intervals: list[Interval] = []
        self._held: dict[int, dict[tuple[str, ...], int]] = {}  # the user's peaks we reset away
        self._paths: dict[int, list[tuple[str, ...]]] = {}  # where the peaks are in the stats
        self._originals: list[tuple[Any, str, Callable[..., Any]]] = []
        self._torch: Any = None

    # -- install -----------------------------------------------------------------------
    def install(self, torch: Any = None) -> None:
        """Wrap torch's reset and stats functions; ``torch`` defaults to the imported one."""
        torch = torch or sys.modules.get("torch")
        if torch is None or self._originals:
            return
        self._torch = torch
        modules = (torch.cuda.memory, torch.cuda)
        for module in modules:
            for name in _PATCHED:
                original = getattr(module, name, None)
                if original is None:
                    continue
                original = getattr(original, "__wrapped__", original)
                wrapper = (
                    self._wrap_reset(original)
                    if name.startswith("reset")
                    else self._wrap_stats(original)
                )
                wrapper.__wrapped__ = original  # type: ignore[attr-defined]
                wrapper.__doc__ = original.__doc__
                wrapper.__name__ = original.__name__
                self._originals.append((module, name, original))
                setattr(module, name, wrapper)

    def uninstall(self) -> None:
        for module, name, original in self._originals:
            setattr(module, name, original)
        self._originals.clear()
        self._held.clear()
        self._intervals.clear()

    @property
    def installed(self) -> bool:
        return bool(self._originals)

    # -- intervals ---------------------------------------------------------------------
    def open(self, device: int) -> Interval:
        """Start an interval now: its peak starts at the current allocation."""
        self.install()
        with self._lock:
            reading = self._reset(device)
            interval = Interval(device, reading.allocated, reading.reserved)
            self._intervals.append(interval)
        return interval

    def adopt(self, device: int) -> Interval:
        """Start an interval at the moment CUDA comes up, when every counter is still zero."""
        self.install()
        with self._lock:
            interval = Interval(device, 0, 0)
            self._intervals.append(interval)
        return interval

    def sample(self, device: int) -> Reading:
        """Current values and the peaks since the previous sample (or reset), then reset."""
        with self._lock:
            return self._reset(device)

    def close(self, interval: Interval) -> tuple[int, int]:
        """The interval's exact peak allocated and reserved; the interval ends."""
        with self._lock:
            if interval.open:
                try:
                    stats = self._raw(interval.device)
                    allocated = _get(stats, "allocated_bytes", "peak")
                    reserved = _get(stats, "reserved_bytes", "peak")
                    interval.allocated = max(interval.allocated, allocated)
                    interval.reserved = max(interval.reserved, reserved)
                finally:  # an interrupt while reading still ends the interval
                    interval.open = False
                    self._intervals = [i for i in self._intervals if i is not interval]
        return interval.allocated, interval.reserved

    # -- internals ---------------------------------------------------------------------
    def _raw(self, device: int) -> dict[str, Any]:
        return self._torch._C._cuda_memoryStats(device)  # type: ignore[no-any-return]

    def _reset(self, device: int) -> Reading:
        """Fold the peaks into the open intervals and the user's view, then reset the real ones."""
        stats = self._raw(device)
        reading = Reading(
            allocated=_get(stats, "allocated_bytes", "current"),
            reserved=_get(stats, "reserved_bytes", "current"),
            peak_allocated=_get(stats, "allocated_bytes", "peak"),
            peak_reserved=_get(stats, "reserved_bytes", "peak"),
        )
        self._fold(device, reading)
        held = self._held.setdefault(device, {})
        paths = self._paths.get(device)
        if paths is None:  # the stats' shape is fixed: find the peaks once per device
            paths = self._paths[device] = [path for path, _ in _peaks(stats)]
        for path in paths:
            node: Any = stats
            for key in path:
                node = node.get(key, 0) if isinstance(node, dict) else 0
            if isinstance(node, int) and node > held.get(path, 0):
                held[path] = node
        self._torch._C._cuda_resetPeakMemoryStats(device)
        return reading

    def _fold(self, device: int, reading: Reading) -> None:
        for interval in self._intervals:
            if interval.device == device:
                interval.allocated = max(interval.allocated, reading.peak_allocated)
                interval.reserved = max(interval.reserved, reading.peak_reserved)

    def _device(self, device: Any) -> int:
        return int(self._torch.cuda.memory._get_device_index(device, optional=True))

    def _wrap_reset(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def reset_peak_memory_stats(device: Any = None) -> Any:
            if self._torch.cuda.is_initialized():
                index = self._device(device)
                with self._lock:
                    stats = self._raw(index)
                    self._fold(
                        index,
                        Reading(
                            0,
                            0,
                            _get(stats, "allocated_bytes", "peak"),
                            _get(stats, "reserved_bytes", "peak"),
                        ),
                    )
                    self._held.pop(index, None)
            return original(device)

        return reset_peak_memory_stats

    def _wrap_stats(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def memory_stats_as_nested_dict(device: Any = None) -> Any:
            stats = original(device)
            if not self._held or not stats:
                return stats
            held = self._held.get(self._device(device))
            if held:
                for path, value in held.items():
                    node = stats
                    for key in path[:-1]:
                        node = node.get(key, {})
                    if isinstance(node, dict) and node.get("peak", value) < value:
                        node["peak"] = value
            return stats

        return memory_stats_as_nested_dict


def _get(stats: dict[str, Any], name: str, key: str) -> int:
    return int(stats.get(name, {}).get("all", {}).get(key, 0))


def _peaks(
    stats: dict[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], int]]:
    """(path to a stat dict + ("peak",), value) for every peak in a nested stats dict."""
    for key, value in stats.items():
        if isinstance(value, dict):
            yield from _peaks(value, (*path, key))
        elif key == "peak" and isinstance(value, int):
            yield (*path, key), value


COUNTERS = PeakCounters()
