"""What a fake step allocates: each fake storage's birth, death, size, tag and phase, on one clock.

:class:`StorageLog` is filled by the recording mode of :mod:`~jupyter_gpumem.tuner.estimation.fake_step`
and read by :mod:`~jupyter_gpumem.tuner.estimation.fake_peaks`.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections.abc import Mapping
from types import FrameType
from typing import Any

from jupyter_gpumem.records import CALLER, PASS_THROUGH, PhaseMark, frame_role
from jupyter_gpumem.tracking.dispatch import plain_tensors


@functools.cache
def fake_class() -> type:
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


def tensors_in(obj: Any, tensor: type, into: list[Any]) -> list[Any]:
    """Tensors in ``obj`` and its nested tuples, lists and dict values."""
    if isinstance(obj, dict):
        obj = list(obj.values())
    if not isinstance(obj, (tuple, list)):
        return into
    for item in obj:
        if isinstance(item, tensor):
            into.append(item)
        elif isinstance(item, (tuple, list, dict)):
            tensors_in(item, tensor, into)
    return into


class _Ref(weakref.ref):  # type: ignore[type-arg]
    __slots__ = ("index", "key", "size")

    index: int
    key: int
    size: int


class StorageLog:
    """Fake storages of one device: births, deaths, tags and phase marks on a shared clock."""

    def __init__(self, torch: Any, device: Any, mode: Any) -> None:
        self.torch = torch
        self.device = device
        self.mode = mode  # the fake mode, to find the fakes it made of real inputs
        self.sizes: list[int] = []
        self.real: dict[int, int] = {}
        self.existing: list[int] = []
        self.events: list[tuple[str, int, int]] = []
        self.tags: list[tuple[int, str]] = []
        self.marks: list[PhaseMark] = []
        self.recording = False
        self.pool = False  # whether storages made now are made in a CUDA graph's private pool
        self.pooled: set[int] = set()  # the storages made so
        self.emptied: list[int] = []  # clocks at which the default pool's cache was emptied
        self.cleared: list[int] = []  # clocks at which torch freed every cuBLAS workspace
        self.left_out: set[int] = set()  # storages outside PyTorch's allocator (see leave_out)
        self.communication: dict[int, tuple[dict[str, Any], ...]] | None = None  # when parallel
        self.loading: dict[int, tuple[tuple[str, int], ...]] = {}  # see :meth:`loaded`
        self.step = 0
        self.clock = 0
        self._live: dict[int, _Ref] = {}  # StorageImpl address -> its weakref
        self._freed: set[int] = set()  # storages whose free was written early (block replay)
        self.then_free: dict[int, list[int]] = {}  # storage -> storages freed right after it
        self._summing: tuple[_Ref, _Ref] | None = None  # (a gradients' sum, its old buffer)
        self.sums_in_place = 0  # the engine's sums of gradients placed in their old buffers
        self._lock = threading.RLock()  # frees arrive from autograd's threads
        self._on_free_cb = self._on_free

    # -- storages ------------------------------------------------------------------------
    def adopt(self, tensor: Any, real_address: int | None, category: str | None) -> None:
        """A fake storage that stands for a real one, alive before the run."""
        if tensor.device != self.device:
            return
        st = tensor.untyped_storage()
        if st._cdata in self._live:
            index = self._live[st._cdata].index
        else:
            index = self._add(st, event=False)
            self.existing.append(index)
            if real_address:
                self.real[index] = real_address
        if category is not None:
            self.tags.append((index, category))

    def loaded(self, script: list[tuple[str, Any]]) -> None:
        """How adopted storages came to be, for the allocator to place them as loading did.

        ``script`` steps are ``("alloc", bytes)`` for a buffer the loading made and let go,
        ``("place", tensor)`` for an adopted tensor's storage and ``("free", k)`` for the
        script's ``k``-th buffer; it runs where its first placed storage would be placed.
        """
        steps: list[tuple[str, int]] = []
        for action, value in script:
            if action == "place":
                ref = self._live.get(value.untyped_storage()._cdata)
                if ref is None:  # not this log's device
                    return
                value = ref.index
            steps.append((action, int(value)))
        first = next(v for a, v in steps if a == "place")
        self.loading[first] = tuple(steps)

    def record(self, out: Any, args: Any, kwargs: Mapping[str, Any] | None) -> None:
        """After an op: its output storages that no input shares are new."""
        tensor = self.torch.Tensor
        outputs = [out] if isinstance(out, tensor) else tensors_in(out, tensor, [])
        inputs: set[int] | None = None
        for t in outputs:
            if t.device != self.device:
                continue
            try:
                st = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            ref = self._live.get(st._cdata)
            if ref is not None:
                self._renew(ref, st)  # an out= op may have resized it in place
                continue
            if inputs is None:
                inputs = self._input_keys(args, kwargs)
            if st._cdata not in inputs:
                self._add(st, event=True)

    def summed(self, out: Any, old: Any) -> None:
        """``out`` is the autograd engine's sum of the gradient buffer ``old`` and another
        (:mod:`.grad_sums`), just recorded: where ``old`` dies before anything else happens
        (nothing else held it), the sum was made in place, in ``old``'s block."""
        with self._lock:
            made = self._live.get(out.untyped_storage()._cdata)
            was = self._live.get(old.untyped_storage()._cdata)
            if made is None or was is None or made.size != was.size or was.index in self.real:
                return
            if was.index not in self._freed:  # the sum's own allocation is checked as was dies
                self._summing = (made, was)

    def resized(self, st: Any, before: int) -> None:
        """``UntypedStorage.resize_`` from Python (FSDP2 frees and refills its unsharded
        parameters so): a known storage's new block, or a new storage grown from nothing."""
        with self._lock:
            ref = self._live.get(st._cdata)
            if ref is not None:
                self._renew(ref, st)
            elif before == 0 and st.nbytes() and self.recording:
                self._add(st, event=True)

    def _renew(self, ref: _Ref, st: Any) -> None:
        """A known storage of another size now: its block freed, a new one allocated."""
        if st.nbytes() != ref.size:
            self._drop(ref)
            self._add(st, event=True)

    def leave_out(self, tensor: Any) -> None:
        """``tensor``'s storage is not the allocator's (a paged optimizer's state, in unified
        memory): the run's figures leave it out."""
        ref = self._live.get(tensor.untyped_storage()._cdata)
        if ref is not None:
            self.left_out.add(ref.index)

    def tag(self, value: Any, category: str) -> None:
        if not isinstance(value, self.torch.Tensor):
            return
        plain = list(plain_tensors(value))
        if len(plain) != 1 or plain[0] is not value:  # a DTensor: its memory is its local shard
            for t in plain:
                self.tag(t, category)
            return
        if value.device != self.device:
            return
        try:
            ref = self._live.get(value.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            return
        if ref is not None:
            self.tags.append((ref.index, category))

    def remake_communication(self) -> None:
        """The live communication buffers given up and made anew, of the same sizes.

        DDP's one rebuild of its buckets, which a fake rank does not run (see
        :class:`~jupyter_gpumem.techniques.parallel.FakeReducer`): the new ones come before
        the old ones go, and the fake storages stand for the new ones from then on.
        """
        if self.communication is None:
            return
        with self._lock:
            for ref in [r for r in self._live.values() if r.index in self.communication]:
                old, new = ref.index, len(self.sizes)
                self.sizes.append(ref.size)
                self.communication[new] = self.communication[old]
                ref.index = new
                if self.recording:
                    self.clock += 1
                    self.events.append(("alloc", new, self.clock))
                    self.clock += 1
                    self.events.append(("free", old, self.clock))

    def live(self) -> dict[int, int]:
        """Storage index by StorageImpl address, for the storages alive now."""
        with self._lock:
            freed = self._freed
            return {key: ref.index for key, ref in self._live.items() if ref.index not in freed}

    def mark(self, phase: str) -> None:
        with self._lock:
            self.clock += 1  # after every event so far, before every later one
            self.marks.append(PhaseMark(self.clock, phase, self.step))

    def _add(self, st: Any, *, event: bool) -> int:
        with self._lock:
            self._summing = None
            index = len(self.sizes)
            self.sizes.append(st.nbytes())
            ref = _Ref(st, self._on_free_cb)
            ref.index, ref.key, ref.size = index, st._cdata, st.nbytes()
            self._live[ref.key] = ref
            if event and self.recording and ref.size:  # an empty storage holds no block
                self.clock += 1
                self.events.append(("alloc", index, self.clock))
                if self.pool:
                    self.pooled.add(index)
                if self.communication is not None:
                    frame = _communication_frame()
                    if frame is not None:
                        self.communication[index] = (frame,)
            return index

    def empty_cache(self) -> None:
        """The default pool's cache emptied now (``torch.cuda.empty_cache()``)."""
        with self._lock:
            if self.recording:
                self.clock += 1
                self.emptied.append(self.clock)

    def clear_workspaces(self) -> None:
        """Every cuBLAS workspace freed now (``torch._C._cuda_clearCublasWorkspaces()``)."""
        with self._lock:
            if self.recording:
                self.clock += 1
                self.cleared.append(self.clock)

    def index_of(self, tensor: Any) -> int | None:
        """The storage index of ``tensor``, if the log follows its storage."""
        ref = self._live.get(tensor.untyped_storage()._cdata)
        return None if ref is None else ref.index

    def virtual_alloc(self, size: int) -> int:
        """A storage no tensor holds, allocated now (a replayed block's)."""
        with self._lock:
            index = len(self.sizes)
            self.sizes.append(size)
            if self.recording and size:
                self.clock += 1
                self.events.append(("alloc", index, self.clock))
                if self.pool:
                    self.pooled.add(index)
            return index

    def early_free(self, index: int) -> None:
        """Storage ``index`` freed now; when a tensor still holding it dies, nothing more."""
        with self._lock:
            self._freed.add(index)
            if self.recording and self.sizes[index]:
                self.clock += 1
                self.events.append(("free", index, self.clock))
            self._then(index)

    def _then(self, index: int) -> None:
        for other in self.then_free.pop(index, ()):
            if other not in self._freed:
                self.early_free(other)

    def _drop(self, ref: _Ref) -> None:
        with self._lock:
            if self._live.get(ref.key) is not ref:
                return
            del self._live[ref.key]
            summing, self._summing = self._summing, None
            if summing is not None and summing[1] is ref and self._in_place(*summing):
                return
            if ref.index in self._freed:
                return
            if self.recording and ref.size:
                self.clock += 1
                self.events.append(("free", ref.index, self.clock))
            if self.then_free:
                self._then(ref.index)

    def _in_place(self, made: _Ref, was: _Ref) -> bool:
        """The sum ``made`` takes the block of ``was``, which dies now: the sum's own
        allocation is struck out, and ``was``'s storage index lives on in the sum's storage."""
        last = self.events[-1] if self.events else None
        if last is None or last[:2] != ("alloc", made.index) or was.index in self.then_free:
            return False
        self.events.pop()
        made.index = was.index
        self.sums_in_place += 1
        return True

    def _on_free(self, ref: weakref.ref[Any]) -> None:
        assert isinstance(ref, _Ref)
        self._drop(ref)

    def _input_keys(self, args: Any, kwargs: Mapping[str, Any] | None) -> set[int]:
        tensor, fake = self.torch.Tensor, fake_class()
        found = tensors_in(args, tensor, [])
        if kwargs:
            tensors_in(kwargs, tensor, found)
        keys = set()
        for t in found:
            if not isinstance(t, fake):  # a real tensor: the op saw the fake made of it
                t = self.mode.from_tensor(t)
            try:
                keys.add(t.untyped_storage()._cdata)
            except (RuntimeError, NotImplementedError):
                continue
        return keys


_OURS = ("/jupyter_gpumem/tuner/", "/jupyter_gpumem/tracking/", "/torch/_subclasses/")


def _communication_frame() -> dict[str, Any] | None:
    """The frame of torch.distributed's code that asked for the op now running, if it was one.

    The rule is the analysis's (:func:`~jupyter_gpumem.records.frame_role`) on the same
    Python stack the allocator trace records, past this run's own frames.
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if not any(part in name for part in _OURS):
            role = frame_role(name)
            if role != PASS_THROUGH:
                if role == CALLER:
                    return None
                return {"filename": name, "line": frame.f_lineno, "name": frame.f_code.co_name}
        frame = frame.f_back
    return None
