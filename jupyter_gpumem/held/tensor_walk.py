"""The distinct tensor storages some objects reach, found within a budget of objects visited.

Never imports torch: the caller passes the module it already has.

Known limitations:
    - Tensors are found by walking containers and object ``__dict__``s (bounded depth);
      tensors reachable only through closures, C extensions or slots are missed.
    - With ``sample_large``, a container of more than ``LARGE`` items is first judged by
      ``SAMPLE`` of its items, spread over it (the first ones, for dicts and sets): when none
      of them leads to a tensor the container is skipped and listed in ``skipped``.
    - Bytes are those of distinct storages, not the allocator's rounded blocks.
"""

from __future__ import annotations

import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sized
from itertools import islice
from typing import Any

Key = tuple[str, int]  # (device, storage data_ptr)

ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), range)
RUNTIME = (types.FrameType, types.TracebackType, types.CodeType, types.ModuleType, type)
_OPAQUE = (*RUNTIME, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
_CONTAINERS = (list, tuple, set, frozenset, deque, dict)
MAX_DEPTH = 8
LARGE = 512  # containers longer than this are judged by a sample first (with sample_large)
SAMPLE = 16  # items of a large container looked at
_SAMPLE_BUDGET = 64  # objects visited below each sampled item


class Walker:
    """Collects the distinct tensor storages reachable from some roots.

    With ``graphs``, a non-leaf tensor leads on to its autograd graph: the tensors each node
    saved for backward and the nodes after it (graph depth is not limited, only the count).
    ``budget`` caps the objects visited over all walks; past it ``truncated`` is set.
    The optimizers met inside other objects are listed in ``optimizers``.
    """

    def __init__(
        self,
        torch: Any,
        *,
        graphs: bool,
        stop: Iterable[int] = (),
        weak: bool = False,
        budget: int | None = None,
        sample_large: bool = False,
        on_tensor: Callable[[Any], None] | None = None,
    ) -> None:
        self.torch = torch
        self.graphs = graphs
        self.weak = weak  # keep a storage weak reference per CPU storage, for `release`
        self.budget = budget
        self.sample_large = sample_large
        self.storages: dict[Key, int] = {}
        self.weakrefs: dict[Key, Any] = {}
        self.graph_tensors: list[tuple[str, Any]] = []  # (where, tensor with grad_fn)
        self.tensors = 0  # tensors met, storage or not
        self.visited = 0  # objects visited, samples of large containers included
        self.truncated = False
        self.skipped: list[tuple[str, int]] = []  # (where, items): large, tensor-free by sample
        self.optimizers: list[tuple[str, Any]] = []  # (where, optimizer) met on the way
        self.on_tensor = on_tensor  # called with each tensor met
        optim = getattr(torch, "optim", None)
        self._optimizer_type = getattr(optim, "Optimizer", None)
        self._stop = set(stop)  # ids of objects never to walk into (the shell, its namespaces)
        self._seen: set[int] = set()
        self._alive: list[object] = []  # visited objects stay alive so ids are not reused

    @property
    def exhausted(self) -> bool:
        return self.budget is not None and self.visited >= self.budget

    def walk(self, root: object, where: str = "") -> list[Key]:
        """Walk ``root``; the storages it reaches that no earlier root reached."""
        before = len(self.storages)  # new keys come after the old ones, in insertion order
        todo: list[tuple[object, int]] = [(root, 0)]
        while todo:
            obj, depth = todo.pop()
            if id(obj) in self._seen or id(obj) in self._stop or isinstance(obj, ATOMS):
                continue
            if self.exhausted:
                self.truncated = True
                break
            self._seen.add(id(obj))
            self._alive.append(obj)
            self.visited += 1
            todo.extend((child, depth + 1) for child in self._children(obj, where, depth))
        return list(islice(self.storages, before, None))

    def holds_tensors(self, items: Iterable[object]) -> bool:
        """True if any of ``items`` leads to a tensor, looking a few objects deep into each."""
        probe = Walker(self.torch, graphs=False, stop=self._stop)
        found = False
        for item in items:
            probe.budget = probe.visited + _SAMPLE_BUDGET
            probe.walk(item)
            if probe.tensors:
                found = True
                break
        self.visited += probe.visited
        return found

    def _children(self, obj: object, where: str, depth: int) -> Iterator[object]:
        if isinstance(obj, self.torch.Tensor):
            yield from self._tensor(obj, where, depth)
        elif hasattr(type(obj), "next_functions"):  # an autograd graph node
            yield from self._node(obj)
        elif depth >= MAX_DEPTH or isinstance(obj, _OPAQUE):
            return
        elif isinstance(obj, _CONTAINERS):
            if self.sample_large and len(obj) > LARGE and not self.holds_tensors(sample(obj)):
                self.skipped.append(
                    (where if depth == 0 else f"a container inside {where}", len(obj))
                )
                return
            if isinstance(obj, dict):
                yield from obj.keys()
                yield from obj.values()
            else:
                yield from obj
        else:
            if self._optimizer_type is not None and isinstance(obj, self._optimizer_type):
                self.optimizers.append((where, obj))
            try:
                attrs = object.__getattribute__(obj, "__dict__")
            except (AttributeError, TypeError):
                return
            if isinstance(attrs, dict):
                yield attrs

    def _tensor(self, t: Any, where: str, depth: int) -> Iterator[object]:
        self.tensors += 1
        self._record(t)
        if self.on_tensor is not None:
            self.on_tensor(t)
        if t.is_leaf:
            if t.grad is not None:
                yield t.grad
        elif t.grad_fn is not None:
            self.graph_tensors.append((where if depth == 0 else f"{where}[...]", t))
            if self.graphs:
                yield t.grad_fn

    def _node(self, node: Any) -> Iterator[object]:
        for name in _saved_names(type(node)):
            try:
                saved = getattr(node, name)
            except RuntimeError:  # already freed by backward()
                continue
            for item in saved if isinstance(saved, (list, tuple)) else [saved]:
                yield getattr(item, "data", None)  # the packed value: no unpack hook runs
        extra = getattr(node, "__dict__", None)  # tensors stored on a custom Function's ctx
        if isinstance(extra, dict):
            yield from extra.values()
        yield from (nxt for nxt, _ in node.next_functions)

    def _record(self, t: Any) -> None:
        try:
            storage = t.untyped_storage()
            ptr, nbytes, device = storage.data_ptr(), storage.nbytes(), str(storage.device)
        except (RuntimeError, NotImplementedError, TypeError):
            return  # sparse, fake or wrapper tensors own no plain storage
        if ptr == 0 or nbytes == 0 or device == "meta":
            return
        key = (device, ptr)
        self.storages[key] = nbytes
        if self.weak and device == "cpu" and key not in self.weakrefs:
            from torch.multiprocessing.reductions import StorageWeakRef

            self.weakrefs[key] = StorageWeakRef(storage)


def sample(container: Sized) -> list[object]:
    """``SAMPLE`` items spread over a sequence; the first ones of a dict (values) or set."""
    n = len(container)
    if isinstance(container, dict):
        return list(islice(container.values(), SAMPLE))
    if isinstance(container, (set, frozenset)):
        return list(islice(container, SAMPLE))
    assert isinstance(container, (list, tuple, deque))
    return [container[i * (n - 1) // (SAMPLE - 1)] for i in range(SAMPLE)] if n else []


_SAVED: dict[type, tuple[str, ...]] = {}


def _saved_names(node_type: type) -> tuple[str, ...]:
    """The ``_raw_saved_*`` attributes of an autograd node class, cached per class."""
    if node_type not in _SAVED:
        _SAVED[node_type] = tuple(n for n in dir(node_type) if n.startswith("_raw_saved_"))
    return _SAVED[node_type]
