"""What a spawned rank receives: the kernel's objects pickled by value, their tensors' bytes in
one block of shared host memory.

:func:`pack` pickles with cloudpickle, so a loss function, a model class or a step defined in
the notebook's ``__main__`` travels by value. Every tensor storage it meets is left out of
the pickle and copied once into a single shared-memory block on the host; a rank maps that
block (one file descriptor, whatever the number of tensors) and :func:`unpack` copies each
storage straight to where the rank runs it: storages from a GPU to the rank's GPU, host ones
to a host storage of its own. The kernel's tensors are only read: same values, devices,
addresses and objects afterwards.

Why a host copy rather than CUDA IPC handles: a rank on the kernel's own GPU would map the
kernel's parameters and, moving them to its device, train on them in place; IPC needs the
kernel to keep every sent block until each rank has let it go, does not work with every
allocator setting or platform (WSL, expandable segments in older releases), and cannot carry
host tensors. One host copy of the state, freed when the ranks end, works everywhere.

Known limitations:
- The kernel holds one host copy of every tensor the objects reach (the model's weights, the
  batch, tensors a loss function refers to) while the ranks run.
- A storage travels whole: a tensor that views part of a larger storage brings all of it.
- Objects that cannot be pickled (open files, locks, CUDA streams and events) cannot travel;
  :func:`pack` raises ``pickle.PicklingError`` or ``TypeError`` naming them.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any

ALIGN = 64  # bytes: each storage's place in the shared block starts on a cache line


@dataclass(frozen=True)
class Payload:
    """Pickled objects and the bytes of the storages they refer to."""

    pickled: bytes  # each storage in it is a reference to a place in ``shared``
    shared: Any  # a torch.UntypedStorage in shared host memory: every storage's bytes
    places: tuple[tuple[int, int, str], ...]  # (offset, bytes, device type) of each storage


def pack(obj: Any) -> Payload:
    """``obj`` pickled by value, its tensors' storages copied once into shared host memory."""
    import cloudpickle
    import torch
    import torch.multiprocessing  # registers the shared-storage reductions

    found: list[Any] = []  # untyped storages, in the order the pickle refers to them
    index: dict[int, int] = {}

    class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # untyped base
        def persistent_id(self, o: Any) -> Any:
            if isinstance(o, torch.storage.TypedStorage):
                untyped, dtype = o._untyped_storage, o.dtype
            elif isinstance(o, torch.UntypedStorage):
                untyped, dtype = o, None
            else:
                return None
            key = untyped._cdata  # one storage, however many tensors view it
            if key not in index:
                index[key] = len(found)
                found.append(untyped)
            return ("storage", index[key], dtype)

    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    places, offset = [], 0
    for s in found:
        places.append((offset, s.nbytes(), s.device.type))
        offset += -(-s.nbytes() // ALIGN) * ALIGN
    shared = torch.UntypedStorage._new_shared(max(offset, 1))
    block = _bytes(torch, shared)
    for s, (start, nbytes, _) in zip(found, places, strict=True):
        if nbytes:
            block[start : start + nbytes].copy_(_bytes(torch, s))
    return Payload(out.getvalue(), shared, tuple(places))


def unpack(payload: Payload, device: Any) -> Any:
    """The packed objects, each storage a copy of its own: GPU ones on ``device`` where it is
    a GPU, host ones on the host."""
    import torch

    block = _bytes(torch, payload.shared)
    made: dict[int, Any] = {}

    def storage(i: int) -> Any:
        if i not in made:
            start, nbytes, kind = payload.places[i]
            where = device if kind == "cuda" and device.type == "cuda" else torch.device(kind)
            own = torch.empty(nbytes, dtype=torch.uint8, device=where)
            own.copy_(block[start : start + nbytes])
            made[i] = own.untyped_storage()
        return made[i]

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            _, i, dtype = pid
            untyped = storage(i)
            if dtype is None:
                return untyped
            return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)

    try:
        return _Unpickler(io.BytesIO(payload.pickled)).load()
    finally:
        # a class made here is in a reference cycle with this frame's closure: left to the
        # collector, ``made`` would hold every storage, the ones a strategy replaces included
        made.clear()


def _bytes(torch: Any, storage: Any) -> Any:
    """A flat uint8 tensor over all of ``storage``."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
