"""Find models, optimizers and tensors in the user's namespace, and name their storages.

Nothing here registers anything: the user's namespace is read as it is, one level
into containers, so `model.fc.weight.grad` and `logits` get names without the user
telling us about them. Objects passed to :func:`jupyter_gpumem.track` are read too.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

from jupyter_gpumem.records import NamedStorage
from jupyter_gpumem.tracking import kept_names
from jupyter_gpumem.tracking.held_state import HELD
from jupyter_gpumem.tracking.kept_names import Source, Structure
from jupyter_gpumem.units import echoed_kind

MAX_CONTAINER_ITEMS = 256

_TRACKED: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
# Labels are numbered for the session, not by how many are tracked now: once a tracked
# object is gone, a count would hand its label again, to an object still tracked.
_NUMBERS = itertools.count()


def track(obj: Any, name: str | None = None) -> Any:
    """Make ``obj`` (a module, optimizer or tensor not in the namespace) known to `%%gpumem`.

    ``name`` labels it in reports (``tracked[N]`` when not given); tracking another object
    under a name already in use replaces the first. Only a weak reference is kept.
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(
            f"track() takes a name that is a string (or None for tracked[N]), got {echoed_kind(name)}"
        )
    try:
        weakref.ref(obj)
    except TypeError:
        raise TypeError(
            "track() needs an object that supports weak references (a module, an optimizer "
            f"or a tensor), got {echoed_kind(obj)}"
        ) from None
    label = name or _free_label()
    _TRACKED[label] = obj
    return obj


def _free_label() -> str:
    while True:
        label = f"tracked[{next(_NUMBERS)}]"
        if label not in _TRACKED:  # a user may have chosen it as a name
            return label


def roots(user_ns: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """Top-level user variables, then tracked objects."""
    for key, value in list(user_ns.items()):
        if key.startswith("_") or key in ("In", "Out", "exit", "quit", "get_ipython"):
            continue
        yield key, value
    yield from list(_TRACKED.items())


def modules_and_optimizers(
    user_ns: Mapping[str, Any],
) -> tuple[dict[int, tuple[str, Any]], dict[int, tuple[str, Any]]]:
    """Modules and optimizers by id(), with the name they are reachable under."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}, {}
    modules: dict[int, tuple[str, Any]] = {}
    optimizers: dict[int, tuple[str, Any]] = {}
    for name, value in roots(user_ns):
        if isinstance(value, torch.nn.Module):
            modules.setdefault(id(value), (name, value))
        elif isinstance(value, torch.optim.Optimizer):
            optimizers.setdefault(id(value), (name, value))
    return modules, optimizers


def named_storages(
    user_ns: Mapping[str, Any], held: list[Any] | None = None
) -> dict[int, NamedStorage]:
    """Every tensor storage reachable from the namespace, by storage address; first name wins.

    Each module's, optimizer's and variable's storages are named again only where it holds
    other tensors than at the last read (see :mod:`.kept_names`). ``held`` (when given)
    receives every tensor the namespace holds, as ``walk`` finds them (repeats included).
    """
    parts = [kept_names.SOURCES.named(source, held) for source in _sources(user_ns)]
    return kept_names.SOURCES.merged(parts)


class ModuleEdits:
    """Counts what modules register (parameters, buffers, submodules) while installed.

    torch calls its global registration hooks for every ``register_parameter``,
    ``register_buffer`` and ``add_module``, and for attribute assignments that make one,
    in any module: a count that has not moved says no model changed its shape.
    """

    def __init__(self) -> None:
        self.count = 0
        self._handles: list[Any] = []

    def install(self) -> bool:
        """True once the hooks are in (torch has them from 2.0)."""
        torch = sys.modules.get("torch")
        if torch is None or self._handles:
            return bool(self._handles)
        hooks = torch.nn.modules.module
        for name in (
            "register_module_parameter_registration_hook",
            "register_module_buffer_registration_hook",
            "register_module_module_registration_hook",
        ):
            register = getattr(hooks, name, None)
            if register is not None:
                self._handles.append(register(self._edited))
        return len(self._handles) == 3

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _edited(self, *args: Any) -> None:
        self.count += 1


EDITS = ModuleEdits()


class NamedMemo:
    """The namespace's named storages as last read, reused while nothing can have changed them.

    Naming every parameter and optimizer state of the models a kernel holds costs several
    milliseconds per read (4,500 tensors for three models). It is read again only when a
    variable is bound to another object, a module registered something, or the allocator
    allocated or freed (``activity``: its event counters); else the storages, their
    addresses and the paths to them are what they were.
    """

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._named: dict[int, NamedStorage] = {}

    def named(self, user_ns: Mapping[str, Any], activity: Any) -> dict[int, NamedStorage]:
        key = self._key_of(user_ns, activity)
        if key is None or key != self._key:
            self._named = named_storages(user_ns)
            self._key = key
        return self._named

    def clear(self) -> None:
        self._key, self._named = None, {}

    @staticmethod
    def _key_of(user_ns: Mapping[str, Any], activity: Any) -> tuple[Any, ...] | None:
        if activity is None or not EDITS.install():
            return None
        bound = tuple((name, id(value)) for name, value in roots(user_ns))
        return (activity, EDITS.count, HELD.count, bound)


NAMED = NamedMemo()


def walk(user_ns: Mapping[str, Any]) -> Iterator[tuple[Any, str, str | None]]:
    """(tensor, name, category) for parameters, buffers, gradients, optimizer state, then plain tensors.

    Optimizers held outside the namespace's variables (see :mod:`.held_state`) count too,
    with the parameters they step where no namespace module has them.
    """
    for source in _sources(user_ns):
        yield from source.entries()


def _sources(user_ns: Mapping[str, Any]) -> Iterator[Source]:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    modules, optimizers = modules_and_optimizers(user_ns)
    param_names: dict[int, str] = {}
    for mod_name, module in modules.values():
        kept = kept_names.STRUCTURE.of(module, mod_name)
        param_names.update(kept.param_names)
        yield _module_source(mod_name, kept)
    for opt_name, opt in optimizers.values():
        yield _optimizer_source(opt, opt_name, param_names, torch)
    for label, opt in HELD.known():
        if id(opt) not in optimizers:
            adopted = _adopt(opt, label, param_names)
            yield _optimizer_source(opt, label, param_names, torch, adopted)
    for name, value in roots(user_ns):
        yield _variable_source(name, value, torch)


def _variable_source(name: str, value: Any, torch: Any) -> Source:
    def held() -> tuple[list[Any], Any]:
        return [t for _, _, t in _tensors_in(value, torch)], None

    def entries() -> Iterator[tuple[Any, str, str | None]]:
        for path, key, t in _tensors_in(value, torch):
            yield t, name + path.format(key), None

    return Source(("variable", name), held, entries)


def _module_source(name: str, kept: Structure) -> Source:
    def held() -> tuple[list[Any], Any]:
        params = kept.params()
        return [*params, *(p.grad for p in params), *kept.buffers()], kept.paths

    def entries() -> Iterator[tuple[Any, str, str | None]]:
        for path, p in zip(kept.paths[0], kept.params(), strict=True):
            yield p, path, "parameters"
            if p.grad is not None:
                yield p.grad, f"{path}.grad", "gradients"
        for path, b in zip(kept.paths[1], kept.buffers(), strict=True):
            yield b, path, "parameters"

    return Source(("module", name), held, entries)


def _adopt(opt: Any, label: str, param_names: dict[int, str]) -> list[tuple[Any, str]]:
    """Name the parameters of a held optimizer that no namespace module names."""
    adopted = []
    for g, group in enumerate(opt.param_groups):
        for i, p in enumerate(group["params"]):
            if id(p) not in param_names:
                param_names[id(p)] = f"{label}.param_groups[{g}][{i}]"
                adopted.append((p, param_names[id(p)]))
    return adopted


def _optimizer_source(
    opt: Any,
    label: str,
    param_names: dict[int, str],
    torch: Any,
    adopted: list[tuple[Any, str]] | None = None,
) -> Source:
    """The gradients and state of ``opt``'s parameters (and the ``adopted`` parameters)."""
    params = [p for group in opt.param_groups for p in group["params"]]

    def held() -> tuple[list[Any], Any]:
        states = [opt.state.get(p) or {} for p in params]
        return [
            *(p for p, _ in adopted or ()),
            *(p.grad for p in params),
            *(v for state in states for v in state.values() if isinstance(v, torch.Tensor)),
        ], ([param_names.get(id(p)) for p in params], [len(state) for state in states])

    def entries() -> Iterator[tuple[Any, str, str | None]]:
        for p, pname in adopted or ():
            yield p, pname, "parameters"
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group["params"]):
                pname = param_names.get(id(p), f"{label}.param_groups[{g}][{i}]")
                if p.grad is not None:
                    yield p.grad, f"{pname}.grad", "gradients"
                for key, value in opt.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        yield value, f"{label}.state[{pname}][{key!r}]", "optimizer_state"

    return Source(("optimizer", id(opt), label, bool(adopted)), held, entries, owner=opt)


def _tensors_in(value: Any, torch: Any) -> Iterator[tuple[str, Any, Any]]:
    """(path format, key, tensor) for the tensors a variable holds: its path is the
    variable's name followed by ``format.format(key)`` (made only where it is named)."""
    if isinstance(value, torch.Tensor):
        yield "", None, value
        if value.is_leaf and value.grad is not None:
            yield ".grad", None, value.grad
    elif _is_cache(value):
        yield from _cache_tensors(value, "", torch)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value[:MAX_CONTAINER_ITEMS]):
            if isinstance(item, torch.Tensor):
                yield "[{}]", i, item
            elif _is_cache(item):
                yield from _cache_tensors(item, f"[{i}]", torch)
    elif isinstance(value, dict):
        for i, (key, item) in enumerate(value.items()):
            if i >= MAX_CONTAINER_ITEMS:
                break
            if isinstance(item, torch.Tensor):
                yield "[{!r}]", key, item
            elif _is_cache(item):
                # a generate output (a ModelOutput) reads as attributes: out.past_key_values
                named = isinstance(key, str) and getattr(value, key, None) is item
                path = f".{key}" if named else f"[{key!r}]"
                yield from _cache_tensors(item, path.replace("{", "{{").replace("}", "}}"), torch)


def _is_cache(value: Any) -> bool:
    """A transformers ``Cache`` (only where transformers is imported already)."""
    kind = getattr(sys.modules.get("transformers.cache_utils"), "Cache", None)
    return kind is not None and isinstance(value, kind)


def _cache_tensors(cache: Any, path: str, torch: Any) -> Iterator[tuple[str, Any, Any]]:
    """A KV cache's tensors, layer by layer: ``.layers[i].keys`` (transformers >= 4.56), else
    ``.key_cache[i]`` and ``.value_cache[i]``."""
    layers = getattr(cache, "layers", None)
    if isinstance(layers, list):
        for i, layer in enumerate(layers[:MAX_CONTAINER_ITEMS]):
            for attr in ("keys", "values"):
                t = getattr(layer, attr, None)
                if isinstance(t, torch.Tensor):
                    yield f"{path}.layers[{{}}].{attr}", i, t
        return
    for attr in ("key_cache", "value_cache"):
        held = getattr(cache, attr, None)
        if isinstance(held, list):
            for i, t in enumerate(held[:MAX_CONTAINER_ITEMS]):
                if isinstance(t, torch.Tensor):
                    yield f"{path}.{attr}[{{}}]", i, t
