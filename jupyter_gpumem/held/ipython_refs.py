"""Find and free tensor memory that IPython, tracebacks, autograd graphs and cycles hold.

`find_leaks` measures; `free` releases what IPython holds. Both work on CPU and
CUDA tensors and never import torch (without torch imported there are no tensors).

What the user's variables hold comes from the shell's :class:`NamespaceScan`, which keeps
one summary per variable and spends a fixed budget per cell; graphs and IPython's holders
are walked within budgets of their own. A check therefore costs a few milliseconds however
much the kernel holds, and says in its notes what it could not look at.

Known limitations:
    - Tensors are found by walking containers and object ``__dict__``s (bounded depth and
      count; see :mod:`jupyter_gpumem.held.tensor_walk`); large containers are judged by a sample.
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
import sys
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.analysis import leak_hints as analysis
from jupyter_gpumem.analysis.leak_hints import Freed, LeakHint
from jupyter_gpumem.held.namespace_scan import NamespaceScan, NamespaceView
from jupyter_gpumem.held.tensor_walk import Key, Walker
from jupyter_gpumem.tracking.held_state import HELD

__all__ = [
    "Freed",
    "LeakCheck",
    "LeakHint",
    "check_leaks",
    "find_leaks",
    "free",
    "namespace_bytes",
    "release",
]

_INTERNAL = ("IPython", "ipykernel", "jupyter_gpumem", "asyncio", "tornado", "runpy")
GRAPH_BUDGET = 4_000  # autograd nodes and saved tensors visited per check
HOLDER_BUDGET = 2_000  # objects visited per check in what IPython holds


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


def _matches(key: Key, device: object) -> bool:
    want = f"cuda:{device}" if isinstance(device, int) else str(device)
    return device is None or key[0] == want or (want == "cuda" and key[0].startswith("cuda"))


def _cycles(torch: Any, weak: bool = False) -> tuple[Walker, int]:
    """Tensors in cyclic garbage, found by one collection that saves instead of frees."""
    walker = Walker(torch, graphs=True, weak=weak)
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


_SCANS: weakref.WeakKeyDictionary[Any, NamespaceScan] = weakref.WeakKeyDictionary()


def _scan(shell: Any) -> NamespaceScan:
    scan = _SCANS.get(shell)
    if scan is None:
        scan = _SCANS[shell] = NamespaceScan(on_optimizer=HELD.found)
    return scan


def scan_namespace(shell: Any, torch: Any, stop: frozenset[int]) -> NamespaceView:
    """The user's variables as this shell's scan sees them now (IPython's names excluded)."""
    return _scan(shell).update(shell.user_ns, getattr(shell, "user_ns_hidden", {}), torch, stop)


def namespace_bytes(shell: Any, *, device: object = None) -> int:
    """Bytes of the distinct tensor storages that the user's variables reference.

    Where no allocator counter exists (CPU), this stands in for "allocated after" when
    re-runs of one cell are compared with `growth_hint`. 0 when torch is not imported.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    held = scan_namespace(shell, torch, _stops(shell)).storages()
    return sum(n for k, n in held.items() if _matches(k, device))


@dataclass(frozen=True)
class LeakCheck:
    """The hints of one check, what it could not look at, and what it cost."""

    hints: list[LeakHint]
    notes: tuple[str, ...]  # facts about what was not checked, each said once per kernel
    visited: int  # objects visited: the namespace scan's, graphs' and holders'


def find_leaks(shell: Any, *, device: object = None, cycles: bool = True) -> list[LeakHint]:
    """Hints for tensor memory held by IPython's output cache, the last traceback,
    stored outputs that keep an autograd graph alive, and reference cycles; largest first.

    ``device`` limits the count to one device (``0``, ``"cuda:1"``, ``"cpu"``). The cycle
    check is a full garbage collection (about 0.2 s once torch is imported): ``cycles=False``
    skips it.
    """
    return check_leaks(shell, device=device, cycles=cycles).hints


def check_leaks(shell: Any, *, device: object = None, cycles: bool = True) -> LeakCheck:
    """`find_leaks`, with the notes and the number of objects visited."""
    torch = sys.modules.get("torch")
    if torch is None:
        return LeakCheck([], (), 0)
    stop = _stops(shell)
    view = scan_namespace(shell, torch, stop)
    notes = list(view.notes)
    graphs = Walker(torch, graphs=True, stop=stop, budget=GRAPH_BUDGET)
    graph_names = []
    for where, t in view.graph_tensors():
        if any(not view.holds(k) for k in graphs.walk(t.grad_fn)):
            graph_names.append(where)
        if graphs.exhausted:
            notes += _scan(shell).once(
                "graphs",
                "leak hints: the autograd graphs your variables keep are too large to check "
                "whole; the hint about them counts the part that was checked",
            )
            break
    graph_keys = {k for k in graphs.storages if not view.holds(k)}
    spent = [0]  # objects visited in IPython's holders, all roots together
    truncated = [False]

    def measure(roots: _Roots) -> tuple[int, list[str]]:
        """Bytes only these roots hold, and every root that holds some of them."""
        names, found = [], {}
        for where, root in roots:
            budget = HOLDER_BUDGET - spent[0]
            walker = Walker(torch, graphs=True, stop=stop, budget=budget, sample_large=True)
            walker.walk(root)
            spent[0] += walker.visited
            truncated[0] = truncated[0] or walker.truncated
            new = {
                k: n
                for k, n in walker.storages.items()
                if k not in graph_keys and not view.holds(k) and _matches(k, device)
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
    if truncated[0]:
        notes += _scan(shell).once(
            "holders",
            "leak hints: IPython's output cache and last traceback are too large to check "
            "whole; the hints count the part that was checked",
        )
    if cycles:
        garbage, count = _cycles(torch)
        keys = {k for k in garbage.storages if not view.holds(k) and _matches(k, device)}
        hints.append(analysis.cycles_hint(sum(garbage.storages[k] for k in keys), count))
    found = sorted((h for h in hints if h is not None), key=lambda h: -h.bytes)
    visited = view.visited + graphs.visited + spent[0]
    return LeakCheck(found, tuple(notes), visited)


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


def _watch(shell: Any, torch: Any, stop: frozenset[int]) -> tuple[dict[Key, Any], dict[Key, int]]:
    """Weak references to what IPython's holders and cycles reach; no local outlives it."""
    outputs, frames = _holders(shell)
    walker = Walker(torch, graphs=True, stop=stop, weak=True)
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
        walker = Walker(torch, graphs=False, stop=stop)
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
