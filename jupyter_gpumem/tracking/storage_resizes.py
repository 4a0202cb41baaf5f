"""Storages resized outside any op: ``UntypedStorage.resize_`` called from Python.

FSDP2 frees each unsharded parameter after its block's forward with ``storage.resize_(0)``
and fills it again before the block's backward with ``storage.resize_(n)``. No ATen op runs,
so a dispatch mode never sees either; the CUDA allocator does (a free, then a new block).
While a listener is installed, every such call is passed to it after the resize, with the
storage's size before it, so that the CPU source and the fake run follow these storages as the
allocator does.

Known limitations: calls from C++ (``at::Storage::set_nbytes``) and on storage classes that
do not inherit ``UntypedStorage.resize_`` are not seen.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# called after the resize, with the storage and its bytes before it
Listener = Callable[[Any, int], None]

_LOCK = threading.Lock()
_LISTENERS: list[Listener] = []
_ORIGINAL: list[Any] = []  # the method replaced while any listener is installed


def listen(torch: Any, listener: Listener) -> None:
    """Pass every ``UntypedStorage.resize_`` to ``listener`` until :func:`unlisten`."""
    with _LOCK:
        if not _LISTENERS:
            original = torch.UntypedStorage.resize_
            _ORIGINAL.append(original)

            def resize_(storage: Any, size: int) -> Any:
                before = storage.nbytes()
                out = original(storage, size)
                for each in list(_LISTENERS):
                    each(storage, before)
                return out

            torch.UntypedStorage.resize_ = resize_
        _LISTENERS.append(listener)


def unlisten(torch: Any, listener: Listener) -> None:
    """Stop passing resizes to ``listener``; the method is torch's own again after the last."""
    with _LOCK:
        if listener in _LISTENERS:
            _LISTENERS.remove(listener)
        if not _LISTENERS and _ORIGINAL:
            torch.UntypedStorage.resize_ = _ORIGINAL.pop()
