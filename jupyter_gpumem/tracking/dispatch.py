"""Record CPU tensor memory as allocator-style events, through a ``TorchDispatchMode``.

Where there is no CUDA trace, every ATen op still passes through Python dispatch
modes. The recorder watches op outputs: a storage it has not seen before is an
``alloc`` (address ``untyped_storage().data_ptr()``, size ``nbytes()``), and a
weakref callback on the ``UntypedStorage`` object, which torch keeps alive
exactly as long as the storage itself, emits ``free_requested`` and
``free_completed`` when it dies. The events are the CUDA trace's
:class:`~jupyter_gpumem.analysis.replay.TraceEvent` records, so one analysis
serves both; replay them with :func:`~jupyter_gpumem.analysis.replay.replay_exact`.

Storages alive at ``start()`` are invisible to a dispatch mode, so the recorder
starts from an empty set: the cell's accounting starts at ``allocated_start=0``
and the events cover only storages the cell created (and freed).

Importing this module does not import torch; ``start()`` does.

Known limitations:
- Memory that no op allocates is not seen: storages shared with numpy
  (``torch.from_numpy``, ``torch.as_tensor``, ``torch.frombuffer``), shared-memory
  storages from DataLoader workers, ``UntypedStorage.resize_`` called directly
  (seen only when the storage is next an op's output).
- Autograd's buffers are seen, because the engine makes them with ops; memory
  inside kernels (oneDNN scratch, allocator caching of the CPU allocator) is not.
- No caching and no rounding: sizes are exact storage bytes, reserved == allocated.
- Dispatch modes live per thread: only the thread that called ``start()`` (and
  autograd's workers, which inherit its modes) record allocations. Frees are
  recorded on whatever thread drops the last reference. ``stop()`` must run on
  the starting thread.
- Tensor subclasses are given the op first (the mode returns ``NotImplemented``),
  so their inner plain tensors are what is recorded. Storages without data
  (meta, fake) get their ``StorageImpl`` address; only ``devices`` are recorded.
- CUDA tensors are ignored: the CUDA allocator trace covers them.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from jupyter_gpumem.analysis.replay import TraceEvent

DEVICES = frozenset({"cpu", "meta"})
_MAX_WALK = 64  # frames walked to find max_frames user frames
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(slots=True)
class _Tracked:
    address: int
    size: int
    ref: weakref.ref[Any]


class DispatchRecorder:
    """Records alloc/free events of CPU (and meta) tensor storages while started.

    Use as ``with DispatchRecorder() as rec: ...`` then ``rec.events``, or call
    ``start()`` and ``stop()``; ``stop()`` returns the events. One recorder can be
    started again; each start begins with no known storages.
    """

    def __init__(self, *, devices: tuple[str, ...] = ("cpu",), max_frames: int = 8) -> None:
        unknown = set(devices) - DEVICES
        if unknown:
            raise ValueError(
                f"devices {sorted(unknown)} cannot be recorded here; allowed: {sorted(DEVICES)}"
            )
        if max_frames < 0:
            raise ValueError(f"max_frames must be >= 0, got {max_frames}")
        self.devices = frozenset(devices)
        self.max_frames = max_frames
        self._lock = threading.RLock()  # frees arrive from any thread, and re-enter via GC
        self._live: dict[int, _Tracked] = {}  # keyed by the StorageImpl address (_cdata)
        self._events: list[TraceEvent] = []
        self._mode: Any = None
        self._thread: int | None = None
        self._internal: dict[str, bool] = {}  # filename -> skipped in frames

    # -- lifecycle -----------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._mode is not None

    @property
    def events(self) -> tuple[TraceEvent, ...]:
        with self._lock:
            return tuple(self._events)

    def start(self) -> None:
        if self._mode is not None:
            raise RuntimeError("DispatchRecorder is already started; call stop() first")
        with self._lock:
            self._live.clear()
            self._events.clear()
        mode = _mode_class()(self)
        mode.__enter__()
        self._mode, self._thread = mode, threading.get_ident()

    def stop(self) -> tuple[TraceEvent, ...]:
        """Leave the mode (even if modes were pushed above it) and return the events."""
        mode = self._mode
        if mode is None:
            return self.events
        if threading.get_ident() != self._thread:
            raise RuntimeError("DispatchRecorder.stop() must run on the thread that started it")
        with self._lock:
            self._mode = None
            self._live.clear()  # drops the weakrefs: later frees are no longer reported
        _exit_mode(mode)
        return self.events

    def __enter__(self) -> DispatchRecorder:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- recording -----------------------------------------------------------------
    def _record(
        self, out: Any, args: Any, kwargs: Mapping[str, Any] | None, *, lifted: bool
    ) -> None:
        """Called by the mode after each op with its outputs; ``lifted`` for ``lift_fresh``."""
        inputs: set[int] | None = None
        for t in _tensors(out):
            if t.device.type not in self.devices:
                continue
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError):  # storage-less subclasses
                continue
            key = st._cdata
            tracked = self._live.get(key)
            if tracked is not None:
                self._check_resized(tracked, st)
                continue
            if lifted:
                # torch.tensor()/from_numpy() build the tensor outside dispatch and lift it;
                # only storages torch allocated itself (resizable) are new memory.
                if not st.resizable():
                    continue
            else:
                if inputs is None:
                    inputs = _storage_keys(args, kwargs)
                if key in inputs:  # a view or in-place result of a storage older than us
                    continue
            self._add(key, st)

    def _add(self, key: int, st: Any) -> None:
        size = st.nbytes()
        address = st.data_ptr() or key
        with self._lock:
            if self._mode is None:
                return
            ref = weakref.ref(st, functools.partial(self._on_free, key))
            self._live[key] = _Tracked(address, size, ref)
            if size:
                self._events.append(TraceEvent("alloc", address, size, _now(), self._frames()))

    def _check_resized(self, tracked: _Tracked, st: Any) -> None:
        """An in-place or ``out=`` op may have reallocated a storage we know."""
        size = st.nbytes()
        address = st.data_ptr() or st._cdata
        if size == tracked.size and address == tracked.address:
            return
        with self._lock:
            frames = self._frames()
            now = _now()
            if tracked.size:
                self._events.append(
                    TraceEvent("free_requested", tracked.address, tracked.size, now, frames)
                )
                self._events.append(
                    TraceEvent("free_completed", tracked.address, tracked.size, now, frames)
                )
            if size:
                self._events.append(TraceEvent("alloc", address, size, now, frames))
            tracked.address, tracked.size = address, size

    def _on_free(self, key: int, ref: weakref.ref[Any]) -> None:
        with self._lock:
            if self._mode is None:
                return
            tracked = self._live.get(key)
            if tracked is None or tracked.ref is not ref:
                return
            del self._live[key]
            if tracked.size:
                frames, now = self._frames(), _now()
                for action in ("free_requested", "free_completed"):
                    self._events.append(
                        TraceEvent(action, tracked.address, tracked.size, now, frames)
                    )

    def _frames(self) -> tuple[dict[str, Any], ...]:
        """The innermost user frames, skipping torch's and this package's."""
        out: list[dict[str, Any]] = []
        frame = sys._getframe(1)
        internal = self._internal
        for _ in range(_MAX_WALK):
            if frame is None or len(out) >= self.max_frames:
                break
            code = frame.f_code
            skip = internal.get(code.co_filename)
            if skip is None:
                skip = internal[code.co_filename] = _is_internal(code.co_filename)
            if not skip:
                out.append(
                    {"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name}
                )
            frame = frame.f_back
        return tuple(out)


def _now() -> int:
    return time.time_ns() // 1000


def _tensors(obj: Any) -> Iterator[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)


def _storage_keys(args: Any, kwargs: Mapping[str, Any] | None) -> set[int]:
    keys: set[int] = set()
    for t in _tensors((args, tuple(kwargs.values()) if kwargs else ())):
        try:
            keys.add(t.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            continue
    return keys


@functools.cache
def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__))


def _is_internal(filename: str) -> bool:
    path = os.path.abspath(filename) if os.path.isabs(filename) else filename
    return path.startswith((_torch_dir() + os.sep, _PACKAGE_DIR + os.sep))


def _exit_mode(mode: Any) -> None:
    """Pop ``mode`` from this thread's dispatch stack, keeping any user modes above it."""
    from torch.utils._python_dispatch import (
        _get_current_dispatch_mode_stack,
        _pop_mode,
        _push_mode,
    )

    if not any(m is mode for m in _get_current_dispatch_mode_stack()):
        return  # someone already popped it
    above = []
    while _get_current_dispatch_mode_stack()[-1] is not mode:
        above.append(_pop_mode())
    mode.__exit__(None, None, None)
    for m in reversed(above):
        _push_mode(m)


@functools.cache
def _mode_class() -> type:
    """The mode class, defined on first use so that importing this module needs no torch."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    lift_fresh = torch.ops.aten.lift_fresh.default

    class _RecordingMode(TorchDispatchMode):
        def __init__(self, recorder: DispatchRecorder) -> None:
            super().__init__()
            self.recorder = recorder

        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: Any = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            if types:
                # A subclass runs first and desugars into plain ops, which come back here.
                return NotImplemented
            out = func(*args, **(kwargs or {}))
            self.recorder._record(out, args, kwargs, lifted=func is lift_fresh)
            return out

    return _RecordingMode
