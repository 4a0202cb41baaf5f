"""Find and free tensor memory that IPython, tracebacks, autograd graphs and cycles hold.

`find_leaks` measures; `free` releases what IPython holds. Both work on CPU and
CUDA tensors and never import torch (without torch imported there are no tensors).

Known limitations:
    - Tensors are found by walking containers and object ``__dict__``s (bounded depth and
      count); tensors reachable only through closures, C extensions or slots are missed.
    - Bytes are those of distinct storages, not the allocator's rounded blocks; a hint
      counts only storages that the user namespace does not also reference.
    - The autograd estimate counts saved tensors (``_raw_saved_*``, read without running
      unpack hooks) and tensors stored on custom Function contexts.
    - The cycle check is one ``gc.DEBUG_SAVEALL`` collection: weak references to cyclic
      garbage are cleared and finalizers run, as in any collection; the objects themselves
      are freed by the next collection.
"""

from __future__ import annotations

import gc
import re
import sys
import types
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jupyter_gpumem.analysis import leak_hints as analysis
from jupyter_gpumem.analysis.leak_hints import Freed, LeakHint

__all__ = ["Freed", "LeakHint", "find_leaks", "free", "namespace_bytes", "release"]

_Key = tuple[str, int]  # (device, storage data_ptr)
_HIDDEN = re.compile(r"^(_+|_\d+|_i+\d*|_[ido]h|In|Out|__\w+__)$")
_INTERNAL = ("IPython", "ipykernel", "jupyter_gpumem", "asyncio", "tornado", "runpy")
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), range)
_RUNTIME = (types.FrameType, types.TracebackType, types.CodeType, types.ModuleType, type)
_OPAQUE = (*_RUNTIME, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
_MAX_DEPTH = 8
_MAX_OBJECTS = 200_000


class _Walker:
    """Collects the distinct tensor storages reachable from some roots.

    With ``graphs``, a non-leaf tensor leads on to its autograd graph: the tensors each node
    saved for backward and the nodes after it (graph depth is not limited, only the count).
    """

    def __init__(
        self, torch: Any, *, graphs: bool, stop: Iterable[int] = (), weak: bool = False
    ) -> None:
        self.torch = torch
        self.graphs = graphs
        self.weak = weak  # keep a storage weak reference per CPU storage, for `release`
        self.storages: dict[_Key, int] = {}
        self.weakrefs: dict[_Key, Any] = {}
        self.graph_tensors: list[tuple[str, Any]] = []  # (where, tensor with grad_fn)
        self.tensors = 0  # tensors met, storage or not
        self.truncated = False
        self._stop = set(stop)  # ids of objects never to walk into (the shell, its namespaces)
        self._seen: set[int] = set()
        self._alive: list[object] = []  # visited objects stay alive so ids are not reused

    def walk(self, root: object, where: str = "") -> set[_Key]:
        """Walk ``root``; the storages it reaches that no earlier root reached."""
        before = set(self.storages)
        todo: list[tuple[object, int]] = [(root, 0)]
        while todo:
            obj, depth = todo.pop()
            if id(obj) in self._seen or id(obj) in self._stop or isinstance(obj, _ATOMS):
                continue
            if len(self._seen) >= _MAX_OBJECTS:
                self.truncated = True
                break
            self._seen.add(id(obj))
            self._alive.append(obj)
            todo.extend((child, depth + 1) for child in self._children(obj, where, depth))
        return set(self.storages) - before

    def _children(self, obj: object, where: str, depth: int) -> Iterator[object]:
        if isinstance(obj, self.torch.Tensor):
            yield from self._tensor(obj, where, depth)
        elif hasattr(type(obj), "next_functions"):  # an autograd graph node
            yield from self._node(obj)
        elif depth >= _MAX_DEPTH or isinstance(obj, _OPAQUE):
            return
        elif isinstance(obj, dict):
            yield from obj.keys()
            yield from obj.values()
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            yield from obj
        else:
            try:
                attrs = object.__getattribute__(obj, "__dict__")
            except (AttributeError, TypeError):
                return
            if isinstance(attrs, dict):
                yield attrs

    def _tensor(self, t: Any, where: str, depth: int) -> Iterator[object]:
        self.tensors += 1
        self._record(t)
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


_SAVED: dict[type, tuple[str, ...]] = {}


def _saved_names(node_type: type) -> tuple[str, ...]:
    """The ``_raw_saved_*`` attributes of an autograd node class, cached per class."""
    if node_type not in _SAVED:
        _SAVED[node_type] = tuple(n for n in dir(node_type) if n.startswith("_raw_saved_"))
    return _SAVED[node_type]


_Roots = list[tuple[str, object]]  # (where, what it holds)


def _stops(shell: Any) -> frozenset[int]:
    """Ids of IPython's own objects: walking into them would reach everything."""
    stop = [shell, shell.user_ns, getattr(shell, "user_global_ns", None)]
    stop.append(getattr(shell, "user_ns_hidden", None))
    for name in ("displayhook", "history_manager", "InteractiveTB", "last_execution_result"):
        stop.append(getattr(shell, name, None))
    stop.append(getattr(getattr(shell, "history_manager", None), "output_hist", None))
    return frozenset(id(s) for s in stop if s is not None)


def _exceptions(shell: Any) -> list[BaseException]:
    """The last exception and those chained to it, wherever sys and IPython keep them."""
    result = getattr(shell, "last_execution_result", None)
    todo = [getattr(sys, "last_value", None), getattr(sys, "last_exc", None)]
    todo.append(getattr(result, "error_in_exec", None))
    found: list[BaseException] = []
    while todo:
        exc = todo.pop()
        if isinstance(exc, BaseException) and all(exc is not e for e in found):
            found.append(exc)
            todo += [exc.__cause__, exc.__context__]
    return found


def _tracebacks(shell: Any) -> list[types.TracebackType]:
    tbs = [getattr(sys, "last_traceback", None), getattr(shell.InteractiveTB, "tb", None)]
    tbs += [e.__traceback__ for e in _exceptions(shell)]
    return [tb for tb in tbs if isinstance(tb, types.TracebackType)]


def _holders(shell: Any) -> tuple[_Roots, _Roots]:
    """What IPython holds: output-cache entries, and the locals of the last traceback."""
    outputs: _Roots = [(f"Out[{n}]", v) for n, v in shell.history_manager.output_hist.items()]
    for name in ("_", "__", "___"):
        outputs += [(name, getattr(shell.displayhook, name, None)), (name, shell.user_ns.get(name))]
    result = getattr(shell, "last_execution_result", None)
    outputs.append(("the last result", getattr(result, "result", None)))
    frames: _Roots = []
    seen: set[int] = set()
    for tb in _tracebacks(shell):
        cur: types.TracebackType | None = tb
        while cur is not None:
            frame = cur.tb_frame
            module = str(frame.f_globals.get("__name__", ""))
            top = frame.f_code.co_name == "<module>" and frame.f_globals is shell.user_ns
            if id(frame) not in seen and not top and module.split(".")[0] not in _INTERNAL:
                seen.add(id(frame))
                frames.append((f"{frame.f_code.co_name}() line {cur.tb_lineno}", frame.f_locals))
            cur = cur.tb_next
    return outputs, frames


def _matches(key: _Key, device: object) -> bool:
    want = f"cuda:{device}" if isinstance(device, int) else str(device)
    return device is None or key[0] == want or (want == "cuda" and key[0].startswith("cuda"))


def _cycles(torch: Any, weak: bool = False) -> tuple[_Walker, int]:
    """Tensors in cyclic garbage, found by one collection that saves instead of frees."""
    walker = _Walker(torch, graphs=True, weak=weak)
    flags, start = gc.get_debug(), len(gc.garbage)
    gc.set_debug(flags | gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        tensors = [o for o in gc.garbage[start:] if isinstance(o, torch.Tensor)]
        walker.walk(tensors)
        count = len(tensors)
    finally:
        del gc.garbage[start:]
        gc.set_debug(flags)
    walker._alive.clear()  # keep the counts and weak references, not the tensors
    walker.graph_tensors.clear()
    return walker, count


def _walk_namespace(shell: Any, torch: Any, stop: frozenset[int]) -> _Walker:
    """The tensors the user's own variables reach (IPython's names excluded)."""
    ns = _Walker(torch, graphs=False, stop=stop)
    hidden = getattr(shell, "user_ns_hidden", {})
    for name, value in list(shell.user_ns.items()):
        if name not in hidden and not _HIDDEN.match(name):
            ns.walk(value, name)
    if ns.truncated:
        msg = f"the namespace has over {_MAX_OBJECTS} objects; hints may count what it holds"
        warnings.warn(f"jupyter_gpumem: {msg}", stacklevel=3)
    return ns


def namespace_bytes(shell: Any, *, device: object = None) -> int:
    """Bytes of the distinct tensor storages that the user's variables reference.

    Where no allocator counter exists (CPU), this stands in for "allocated after" when
    re-runs of one cell are compared with `growth_hint`. 0 when torch is not imported.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    ns = _walk_namespace(shell, torch, _stops(shell))
    return sum(n for k, n in ns.storages.items() if _matches(k, device))


def find_leaks(shell: Any, *, device: object = None, cycles: bool = True) -> list[LeakHint]:
    """Hints for tensor memory held by IPython's output cache, the last traceback,
    stored outputs that keep an autograd graph alive, and reference cycles; largest first.

    ``device`` limits the count to one device (``0``, ``"cuda:1"``, ``"cpu"``). The cycle
    check is a full garbage collection (about 0.2 s once torch is imported): ``cycles=False``
    skips it.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    stop = _stops(shell)
    ns = _walk_namespace(shell, torch, stop)
    held = set(ns.storages)
    graphs = _Walker(torch, graphs=True, stop=stop)
    graph_names = [w for w, t in ns.graph_tensors if set(graphs.walk(t.grad_fn)) - held]
    graph_keys = set(graphs.storages) - held
    held |= graph_keys

    def measure(roots: _Roots) -> tuple[int, list[str]]:
        """Bytes only these roots hold, and every root that holds some of them."""
        names, found = [], {}
        for where, root in roots:
            walker = _Walker(torch, graphs=True, stop=stop)
            walker.walk(root)
            new = {
                k: n for k, n in walker.storages.items() if k not in held and _matches(k, device)
            }
            if new:
                names.append(where)
                found.update(new)
        return sum(found.values()), list(dict.fromkeys(names))

    outputs, frames = _holders(shell)
    hints = [
        analysis.output_cache_hint(*measure(outputs)),
        analysis.traceback_hint(*measure(frames)),
        analysis.graph_hint(
            sum(graphs.storages[k] for k in graph_keys if _matches(k, device)),
            list(dict.fromkeys(graph_names)),
        ),
    ]
    if cycles:
        garbage, count = _cycles(torch)
        keys = {k for k in garbage.storages if k not in held and _matches(k, device)}
        hints.append(analysis.cycles_hint(sum(garbage.storages[k] for k in keys), count))
    return sorted((h for h in hints if h is not None), key=lambda h: -h.bytes)


def _cuda(torch: Any) -> tuple[int, int] | None:
    """Allocated and reserved bytes over all devices; None when CUDA is not initialised."""
    if not torch.cuda.is_initialized():
        return None
    n = range(torch.cuda.device_count())
    allocated = sum(torch.cuda.memory_allocated(i) for i in n)
    return allocated, sum(torch.cuda.memory_reserved(i) for i in n)


def _clear_outputs(shell: Any, holds: Callable[[object], bool]) -> list[str]:
    """Drop the output-cache entries (``Out[n]``, ``_n``, ``_``...) that hold tensors.

    IPython keeps each value in ``Out``, in the user namespace and in ``user_ns_hidden``.
    """
    out, hook = shell.history_manager.output_hist, shell.displayhook
    spaces = [shell.user_ns, getattr(shell, "user_ns_hidden", {})]
    cleared = []
    for n, value in list(out.items()):
        if holds(value):
            del out[n]
            for space in spaces:
                if space.get(f"_{n}") is value:
                    del space[f"_{n}"]
            cleared.append(f"Out[{n}]")
    for name in ("_", "__", "___"):
        values = [getattr(hook, name, None)] + [space.get(name) for space in spaces]
        if any(holds(v) for v in values):
            setattr(hook, name, "")
            for space in spaces:
                if name in space:
                    space[name] = ""
            cleared.append(name)
    result = getattr(shell, "last_execution_result", None)
    if result is not None and (holds(result.result) or result.error_in_exec is not None):
        shell.last_execution_result = None
    return cleared


def _clear_traceback(shell: Any) -> list[str]:
    found = bool(_tracebacks(shell)) or hasattr(sys, "last_value")
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    if hasattr(shell.InteractiveTB, "tb"):
        del shell.InteractiveTB.tb
    return ["the last traceback"] if found else []


def _watch(shell: Any, torch: Any, stop: frozenset[int]) -> tuple[dict[_Key, Any], dict[_Key, int]]:
    """Weak references to what IPython's holders and cycles reach; no local outlives it."""
    outputs, frames = _holders(shell)
    walker = _Walker(torch, graphs=True, stop=stop, weak=True)
    for _, root in (*outputs, *frames):
        walker.walk(root)
    cycles, _ = _cycles(torch, weak=True)
    return {**walker.weakrefs, **cycles.weakrefs}, {**walker.storages, **cycles.storages}


def release(shell: Any) -> Freed:
    """Release what IPython holds: output-cache entries holding tensors, the last traceback,
    cyclic garbage; then return CUDA cache to the driver. Measures what came back."""
    torch = sys.modules.get("torch")
    if torch is None:
        cleared = _clear_outputs(shell, lambda v: False) + _clear_traceback(shell)
        gc.collect()
        return Freed(None, None, None, tuple(cleared))
    stop = _stops(shell)
    weakrefs, sizes = _watch(shell, torch, stop)

    def holds(value: object) -> bool:
        walker = _Walker(torch, graphs=False, stop=stop)
        walker.walk(value)
        return walker.tensors > 0

    before = _cuda(torch)
    cleared = _clear_outputs(shell, holds) + _clear_traceback(shell)
    gc.collect()
    mid = _cuda(torch)
    if mid is not None:
        torch.cuda.empty_cache()
    after = _cuda(torch)
    cpu = sum(sizes[k] for k, ref in weakrefs.items() if ref.expired())
    return Freed(
        cuda_bytes=None if before is None or mid is None else before[0] - mid[0],
        cpu_bytes=cpu,
        cache_returned_bytes=None if mid is None or after is None else mid[1] - after[1],
        cleared=tuple(cleared),
    )


def free(shell: Any) -> int:
    """`release`, returning the bytes of tensor memory that came back."""
    return release(shell).total_bytes
