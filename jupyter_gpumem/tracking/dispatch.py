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
and the events cover only storages the cell created (and freed). An op output
that shares a storage with one of the op's inputs (a view, an in-place or
``out=`` result) is never a new allocation; one the recorder knows whose size or
address changed (``out=``, ``resize_``) is a free and an alloc. ``frames`` are
the innermost user frames of the allocation (notebook cells and the user's own
files; torch, this package, the stdlib and installed libraries are skipped);
frees carry none, as in the CUDA trace recorded with ``context="alloc"``.

Importing this module does not import torch; ``start()`` does.

Cost: about 8 us per allocating op and 2 us per other op, on top of the 4-5 us
any Python dispatch mode costs (a 3-layer MLP with Adam on one CPU thread:
+40% step time at width 512, +200% at width 64, where ops are tiny). The recorder therefore
follows a cell in detail for a while only: ``deadline_us`` and ``on_deadline`` let its owner
decide when to step aside (see :mod:`.safe_point`).

Known limitations:
- Memory that no op allocates is not seen: storages shared with numpy
  (``torch.from_numpy``, ``torch.as_tensor``, ``torch.frombuffer``; ``torch.tensor``
  is seen, through ``lift_fresh``), shared-memory storages from DataLoader
  workers, scratch memory that kernels allocate and free inside one op.
  ``UntypedStorage.resize_`` called from Python is seen (FSDP2 frees and refills its
  unsharded parameters so, see :mod:`.storage_resizes`): on a followed storage it is a
  free and an alloc, and a storage grown from nothing is new.
- Storages older than ``start()`` are not followed: a cell that deletes an old
  tensor shows no drop. Frees after ``stop()`` are not reported.
- Autograd's buffers (gradients, saved tensors) are seen: the engine makes them
  with ops, and the engine's worker threads inherit the mode.
- No caching and no rounding: sizes are exact storage bytes (a reduction's
  0-d result may own a 512-byte buffer), reserved == allocated.
- Dispatch modes live per thread: only the thread that called ``start()`` (and
  autograd's workers) record allocations; other threads (DataLoader pin-memory,
  the user's own) are not recorded and do not break. Frees are recorded on
  whatever thread drops the last reference. ``stop()`` must run on the starting
  thread; it removes only this mode, even if the cell left its own modes above.
- Traceable wrapper subclasses (DTensor, TwoTensor) run first (the mode returns
  ``NotImplemented``), so their inner plain tensors are what is recorded. Fake
  tensors are recorded on their fake device with exact sizes; storages without
  data (meta, fake) get their ``StorageImpl`` address. CUDA tensors are ignored:
  the CUDA allocator trace covers them.
- ``torch.compile``d code: buffers its generated kernels allocate without going
  through Python dispatch (inductor's) may be missed; not measured.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import FrameType, TracebackType
from typing import Any

from jupyter_gpumem.records import COMMUNICATION, PASS_THROUGH, TraceEvent, frame_role
from jupyter_gpumem.tracking import storage_resizes
from jupyter_gpumem.tracking.composites import is_composite, run_as_parts
from jupyter_gpumem.tracking.dynamo_skip import run_plainly

DEVICES = frozenset({"cpu", "meta"})
_MAX_WALK = 64  # frames walked to find max_frames user frames
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _StorageRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to a recorded storage, carrying what its free event needs."""

    __slots__ = ("address", "key", "size")

    address: int
    key: int
    size: int


# Raw records kept while recording, with action "alloc" or "free", and each one's frames in a
# list beside them; expanded into TraceEvents when read.
_Frame = tuple[str, int, str]  # filename, line, name
_Raw = tuple[str, int, int, int]  # action, address, size, time_us


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
        self._cpu, self._meta = "cpu" in self.devices, "meta" in self.devices
        self.max_frames = max_frames
        self._lock = threading.RLock()  # frees arrive from any thread, and re-enter via GC
        self._live: dict[int, _StorageRef] = {}  # keyed by the StorageImpl address (_cdata)
        # An event's numbers and its frames apart: the collector untracks a tuple of numbers
        # at once, so the events of a long cell never reach an older generation.
        self._raw: list[_Raw] = []
        self._raw_frames: list[tuple[_Frame, ...]] = []
        self._mode: Any = None
        self._following = False  # frees are recorded from start() to stop(), paused or not
        self._thread: int | None = None
        self._internal: dict[str, bool] = {}  # filename -> skipped in frames
        self._roles: dict[str, str] = {}  # filename -> records.frame_role, or ours: pass-through
        self._tensor_type: type = object
        # One bound method shared by every weakref, and the same object to listen and
        # unlisten; made at start and dropped at stop, so that a stopped recorder holds no
        # cycle through them.
        self._on_free_cb: Callable[[weakref.ref[Any]], None] | None = None
        self._on_resize_cb: storage_resizes.Listener | None = None
        # Called once, from inside the first op at or after the deadline (time_ns // 1000);
        # the owner decides there whether the recording should step aside.
        self.deadline_us: int | None = None
        self.on_deadline: Callable[[], None] | None = None

    # -- lifecycle -----------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._mode is not None

    @property
    def events(self) -> tuple[TraceEvent, ...]:
        """The events so far, in the CUDA trace's form: a free is two events."""
        with self._lock:
            raw = list(zip(self._raw, self._raw_frames, strict=True))
        events: list[TraceEvent] = []
        as_dicts: dict[tuple[_Frame, ...], tuple[dict[str, Any], ...]] = {}
        for (action, address, size, time_us), raw_frames in raw:
            frames = as_dicts.get(raw_frames)
            if frames is None:
                frames = as_dicts[raw_frames] = tuple(
                    {"filename": f, "line": line, "name": name} for f, line, name in raw_frames
                )
            if action == "alloc":
                events.append(TraceEvent("alloc", address, size, time_us, frames))
            else:
                events.append(TraceEvent("free_requested", address, size, time_us, frames))
                events.append(TraceEvent("free_completed", address, size, time_us, frames))
        return tuple(events)

    def start(self, existing: Iterable[Any] = ()) -> tuple[tuple[int, int], ...]:
        """Start recording; ``existing`` tensors' storages are followed for frees.

        Returns (address, bytes) of those existing storages, the interval's starting point.
        """
        if self._mode is not None:
            raise RuntimeError("DispatchRecorder is already started; call stop() first")
        import torch

        with self._lock:
            self._live.clear()
            self._raw.clear()
            self._raw_frames.clear()
        self._thread = threading.get_ident()
        self._following = True  # from here stop() undoes the start, even a start cut short
        self._on_free_cb = self._on_free
        self._on_resize_cb = on_resize = self._on_resize
        self._tensor_type = torch.Tensor
        known = []
        live, on_free = self._live, self._on_free_cb
        plain = (torch.Tensor, torch.nn.Parameter)  # no wrapped tensors to look into
        for held in existing:
            for t in (held,) if type(held) in plain else plain_tensors(held):
                if not isinstance(t, torch.Tensor):
                    continue
                meta = t.is_meta
                if not ((self._meta and meta) or (self._cpu and not meta and t.is_cpu)):
                    continue
                try:
                    st = t.untyped_storage()
                except (RuntimeError, NotImplementedError):
                    continue
                key, size = st._cdata, st.nbytes()
                if key in live or not size:
                    continue
                ref = _StorageRef(st, on_free)
                ref.key, ref.size = key, size
                ref.address = key if meta else st.data_ptr() or key
                live[key] = ref
                known.append((ref.address, size))
        mode_class = _mode_class()
        run_plainly(mode_class.__torch_dispatch__, on_free, on_resize)  # see dynamo_skip
        mode = mode_class(self)
        mode.__enter__()
        self._mode = mode  # from here stop() exits it, even if the rest is cut short
        storage_resizes.listen(torch, on_resize)
        return tuple(known)

    def pause(self) -> None:
        """Leave the mode: no new storages are seen, frees of known ones still are."""
        mode = self._mode
        if mode is None:
            return
        if threading.get_ident() != self._thread:
            raise RuntimeError("DispatchRecorder.pause() must run on the thread that started it")
        _exit_mode(mode)  # first: a pause cut short leaves the mode for stop() to exit
        with self._lock:
            self._mode = None

    def stop(self) -> tuple[TraceEvent, ...]:
        """Leave the mode (even if modes were pushed above it) and return the events."""
        mode = self._mode
        if mode is None and not self._following:
            return self.events
        if threading.get_ident() != self._thread:
            raise RuntimeError("DispatchRecorder.stop() must run on the thread that started it")
        # Each step is undone before it is marked undone: a stop cut short is finished by
        # calling stop() again.
        if self._on_resize_cb is not None:
            storage_resizes.unlisten(sys.modules["torch"], self._on_resize_cb)
            self._on_resize_cb = None
        if mode is not None:
            _exit_mode(mode)
        with self._lock:
            self._mode = None
            self._following = False
            self._live.clear()  # drops the weakrefs: later frees are not reported
        self._on_free_cb = None
        self.on_deadline = None  # holds its owner
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
        deadline = self.deadline_us
        if deadline is not None and _now() >= deadline and self.on_deadline is not None:
            self.deadline_us = None  # every op, allocating or not (in-place loops allocate nothing)
            self.on_deadline()
        tensor = self._tensor_type
        if isinstance(out, tensor):
            outputs: Any = (out,)
        elif isinstance(out, (tuple, list)):
            outputs = _flatten(out, tensor, [])
        else:  # None, scalars, script objects
            return
        inputs: set[int] | None = None
        for t in outputs:
            if not ((self._cpu and t.is_cpu) or (self._meta and t.is_meta)):
                continue
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError):  # storage-less subclasses
                continue
            key = st._cdata
            ref = self._live.get(key)
            if ref is not None:
                self._check_resized(ref, st)
                continue
            if lifted:
                # torch.tensor()/from_numpy() build the tensor outside dispatch and lift it;
                # only storages torch allocated itself (resizable) are new memory.
                if not st.resizable():
                    continue
            else:
                if inputs is None:
                    inputs = _storage_keys(_inputs(args, kwargs, tensor))
                if key in inputs:  # a view or in-place result of a storage older than us
                    continue
            self._add(key, st)

    def _add(self, key: int, st: Any) -> None:
        size = st.nbytes()
        address = key if st.device.type == "meta" else st.data_ptr() or key
        ref = _StorageRef(st, self._on_free_cb)
        ref.key, ref.address, ref.size = key, address, size
        with self._lock:
            if self._mode is None:
                return
            self._live[key] = ref
            if size:
                self._append("alloc", address, size, _now(), self._frames())

    def _append(
        self, action: str, address: int, size: int, time_us: int, frames: tuple[_Frame, ...]
    ) -> None:
        """One event; the caller holds the lock."""
        self._raw.append((action, address, size, time_us))
        self._raw_frames.append(frames)

    def _check_resized(self, ref: _StorageRef, st: Any) -> None:
        """An in-place or ``out=`` op may have reallocated a storage we know."""
        size = st.nbytes()
        address = ref.key if st.device.type == "meta" else st.data_ptr() or ref.key
        if size == ref.size and address == ref.address:
            return
        with self._lock:
            now = _now()
            if ref.size:
                self._append("free", ref.address, ref.size, now, ())
            if size:
                self._append("alloc", address, size, now, self._frames())
            ref.address, ref.size = address, size

    def _on_resize(self, st: Any, before: int) -> None:
        """``UntypedStorage.resize_`` from Python: a followed storage's new block, or a new one."""
        kind = st.device.type
        if not ((self._cpu and kind == "cpu") or (self._meta and kind == "meta")):
            return
        with self._lock:
            ref = self._live.get(st._cdata)
            if ref is not None:
                self._check_resized(ref, st)
            elif before == 0 and st.nbytes() and self._mode is not None:
                self._add(st._cdata, st)

    def _on_free(self, ref: weakref.ref[Any]) -> None:
        assert isinstance(ref, _StorageRef)
        with self._lock:
            if not self._following or self._live.get(ref.key) is not ref:
                return
            del self._live[ref.key]
            if ref.size:  # no frames on frees, as in the CUDA trace with context="alloc"
                self._append("free", ref.address, ref.size, _now(), ())

    def _frames(self) -> tuple[_Frame, ...]:
        """The innermost user frames: notebook cells and the user's own files.

        The allocation's innermost caller is kept too when it is torch.distributed code,
        so that the analysis can tell communication buffers from the model's tensors.
        """
        out: list[_Frame] = []
        frame: FrameType | None = sys._getframe(1)
        internal, roles = self._internal, self._roles
        caller_found = False
        for _ in range(_MAX_WALK):
            if frame is None or len(out) >= self.max_frames:
                break
            code = frame.f_code
            name = code.co_filename
            skip = internal.get(name)
            if skip is None:
                skip = internal[name] = is_library_file(name)
            if not caller_found:
                role = roles.get(name)
                if role is None:
                    role = roles[name] = (
                        PASS_THROUGH if name.startswith(_PACKAGE_DIR) else frame_role(name)
                    )
                caller_found = role != PASS_THROUGH
                if role == COMMUNICATION and skip:
                    out.append((name, frame.f_lineno, code.co_name))
            if not skip:
                out.append((name, frame.f_lineno, code.co_name))
            frame = frame.f_back
        return tuple(out)


def _now() -> int:
    return time.time_ns() // 1000


def plain_tensors(t: Any) -> Iterator[Any]:
    """``t`` itself, or for a traceable wrapper subclass (DTensor) the plain tensors it wraps."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is None or _is_fake(t):
        yield t
        return
    for name in flatten(t)[0]:
        inner = getattr(t, name, None)
        if isinstance(inner, sys.modules["torch"].Tensor):
            yield from plain_tensors(inner)


def _is_fake(t: Any) -> bool:
    fake = sys.modules.get("torch._subclasses.fake_tensor")
    return fake is not None and isinstance(t, fake.FakeTensor)


def _flatten(obj: Any, tensor: type, into: list[Any]) -> list[Any]:
    """Tensors in ``obj`` and its nested tuples, lists and dict values."""
    if isinstance(obj, dict):
        obj = obj.values()
    for item in obj:
        if isinstance(item, tensor):
            into.append(item)
        elif isinstance(item, (tuple, list, dict)):
            _flatten(item, tensor, into)
    return into


def _inputs(args: Any, kwargs: Mapping[str, Any] | None, tensor: type) -> list[Any]:
    found = [a for a in args if isinstance(a, tensor)]
    if len(found) < len(args):
        for a in args:
            if isinstance(a, (tuple, list)):
                _flatten(a, tensor, found)
    if kwargs:
        _flatten(kwargs, tensor, found)
    return found


def _storage_keys(tensors: list[Any]) -> set[int]:
    keys: set[int] = set()
    for t in tensors:
        try:
            keys.add(t.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            continue
    return keys


@functools.cache
def _internal_dirs() -> tuple[str, ...]:
    """torch, this package, and installed libraries and the stdlib (IPython's frames too)."""
    import torch

    dirs = {os.path.dirname(os.path.abspath(torch.__file__)), _PACKAGE_DIR}
    paths = sysconfig.get_paths()
    dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths)
    return tuple(os.path.abspath(d) + os.sep for d in dirs)


def is_library_file(filename: str) -> bool:
    """Code of torch, this package, the stdlib or an installed library: not the user's."""
    if filename.startswith("<frozen"):
        return True
    return os.path.isabs(filename) and os.path.abspath(filename).startswith(_internal_dirs())


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
def _mode_class() -> type[Any]:
    """The mode class, defined on first use so that importing this module needs no torch."""
    import torch
    from torch.utils._python_dispatch import (
        TorchDispatchMode,
        is_traceable_wrapper_subclass_type,
    )

    lift_fresh = torch.ops.aten.lift_fresh.default
    wrappers: dict[type, bool] = {}  # type -> is a traceable wrapper subclass

    class _RecordingMode(TorchDispatchMode):
        def __init__(self, recorder: DispatchRecorder) -> None:
            super().__init__()
            self.recorder = recorder

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            # torch.compile compiles as in the plain cell (a mode that does not ignore them
            # makes it fall back to eager); the compiled code's own ops then run unseen.
            return True

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # Dynamo skips this handler by its code's mark (see dynamo_skip), so it needs no
            # dynamo-disabled wrapper, which would put two more frames of torch's under a
            # failing op.
            return False

        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: Any = (),
            kwargs: Mapping[str, Any] | None = None,
        ) -> Any:
            for t in types:
                wrapper = wrappers.get(t)
                if wrapper is None:
                    wrapper = wrappers[t] = is_traceable_wrapper_subclass_type(t)
                if wrapper:
                    # The subclass runs first and desugars into plain ops, which come back
                    # here; other subclasses (FakeTensor) expect the mode to run the op.
                    return NotImplemented
            if is_composite(torch, func):  # under inference_mode: its parts allocate
                out = run_as_parts(self, func, args, kwargs)
                if out is not NotImplemented:
                    return out
            out = func(*args, **(kwargs or {}))
            self.recorder._record(out, args, kwargs, lifted=func is lift_fresh)
            return out

    return _RecordingMode
