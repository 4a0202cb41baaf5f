"""Find models, optimizers and tensors in the user's namespace, and name their storages.

Nothing here registers anything: the user's namespace is read as it is, one level
into containers, so `model.fc.weight.grad` and `logits` get names without the user
telling us about them. Objects passed to :func:`jupyter_gpumem.track` are read too.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import is_
from typing import Any

from jupyter_gpumem.records import NamedStorage
from jupyter_gpumem.tracking.held_state import HELD

MAX_CONTAINER_ITEMS = 256

_TRACKED: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def track(obj: Any, name: str | None = None) -> Any:
    """Make ``obj`` (a module, optimizer or tensor not in the namespace) known to `%%gpumem`."""
    label = name or f"tracked[{len(_TRACKED)}]"
    try:
        _TRACKED[label] = obj
    except TypeError as exc:
        raise TypeError(
            f"track() needs an object that supports weak references, got {type(obj).__name__}"
        ) from exc
    return obj


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


def named_storages(user_ns: Mapping[str, Any]) -> dict[int, NamedStorage]:
    """Every tensor storage reachable from the namespace, by storage address; first name wins.

    Each module's, optimizer's and variable's storages are named again only where it holds
    other tensors than at the last read (see :class:`_SourceNames`).
    """
    parts = [_SOURCES.named(source) for source in _sources(user_ns)]
    return _SOURCES.merged(parts)


def named_of(found: Iterable[tuple[Any, str, str | None]]) -> dict[int, NamedStorage]:
    """The storages of ``walk``'s (tensor, name, category), by address; first name wins."""
    out: dict[int, NamedStorage] = {}
    for t, name, category in found:
        named = _NAMES.get(t, name, category)
        if named is not None and named.address not in out:
            out[named.address] = named
    return out


class _NameCache:
    """Each tensor's record as last made, reused while the tensor keeps its data and name.

    A kernel holding several models names thousands of parameters and optimizer states on
    every cell; reading each one's storage again is most of that cost. Keyed by ``id`` with
    a weak reference to check it (a tensor's ``==`` is elementwise, so tensors cannot be keys).
    """

    def __init__(self) -> None:
        self._made: dict[int, tuple[weakref.ref[Any], int, NamedStorage | None]] = {}
        self._live = 0  # entries left by the last pruning

    def get(self, t: Any, name: str, category: str | None) -> NamedStorage | None:
        kept = self._made.get(id(t))
        try:
            ptr = t.data_ptr()
        except (RuntimeError, NotImplementedError):
            ptr = 0
        unchanged = kept is not None and kept[0]() is t and kept[1] == ptr
        if unchanged:
            assert kept is not None
            named = kept[2]
            if named is None:
                return None
            same = named.name == name and named.category == category
            if same and named.shape == tuple(t.shape):
                return named
        named = _named(t, name, category)
        if len(self._made) > max(_PRUNE_AT, 2 * self._live):  # drop the dead, amortised
            self._made = {k: v for k, v in self._made.items() if v[0]() is not None}
            self._live = len(self._made)
        self._made[id(t)] = (weakref.ref(t), ptr, named)
        return named


_PRUNE_AT = 10_000
_NAMES = _NameCache()


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


def _named(t: Any, name: str, category: str | None) -> NamedStorage | None:
    if t.is_meta or getattr(t, "is_sparse", False):
        return None
    try:
        storage = t.untyped_storage()
        address = storage.data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (functional wrappers)
        return None
    if not address:
        return None
    return NamedStorage(
        address,
        storage.nbytes(),
        name,
        category,
        tuple(t.shape),
        str(t.dtype).removeprefix("torch."),
        str(t.device),
    )


def walk(user_ns: Mapping[str, Any]) -> Iterator[tuple[Any, str, str | None]]:
    """(tensor, name, category) for parameters, buffers, gradients, optimizer state, then plain tensors.

    Optimizers held outside the namespace's variables (see :mod:`.held_state`) count too,
    with the parameters they step where no namespace module has them.
    """
    for source in _sources(user_ns):
        yield from source.entries()


@dataclass(frozen=True)
class _Source:
    """One module, optimizer or variable: its tensors with the facts their names depend on,
    read cheaply, and the tensors with their names and categories, made only when named."""

    key: tuple[Any, ...]  # where its names are kept
    held: Callable[[], tuple[list[Any], Any]]  # its tensors (None where absent), and the facts
    entries: Callable[[], Iterable[tuple[Any, str, str | None]]]


def _sources(user_ns: Mapping[str, Any]) -> Iterator[_Source]:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    modules, optimizers = modules_and_optimizers(user_ns)
    param_names: dict[int, str] = {}
    for mod_name, module in modules.values():
        kept = _STRUCTURE.of(module, mod_name)
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


def _variable_source(name: str, value: Any, torch: Any) -> _Source:
    def held() -> tuple[list[Any], Any]:
        return [t for _, _, t in _tensors_in(value, torch)], None

    def entries() -> Iterator[tuple[Any, str, str | None]]:
        for path, key, t in _tensors_in(value, torch):
            yield t, name + path.format(key), None

    return _Source(("variable", name), held, entries)


def _module_source(name: str, kept: _Structure) -> _Source:
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

    return _Source(("module", name), held, entries)


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
) -> _Source:
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

    return _Source(("optimizer", id(opt), label, bool(adopted)), held, entries)


def _no_object() -> None:
    return None


def _refs(objects: Iterable[Any]) -> list[Any]:
    """Weak references to ``objects`` (None stays None): kept, they hold nothing alive."""
    return [_no_object if o is None else weakref.ref(o) for o in objects]


def _dead(ref: Any) -> bool:
    return ref is not _no_object and ref() is None


def _same(objects: list[Any], refs: list[Any]) -> bool:
    """Whether ``objects`` are, in order, the very objects ``refs`` were made of."""
    return len(objects) == len(refs) and all(map(is_, [r() for r in refs], objects))


@dataclass(frozen=True)
class _Structure:
    """A module's parameters and buffers, with their paths from the variable that holds it,
    and what each of its submodules held when they were listed; weakly."""

    param_refs: list[Any]
    buffer_refs: list[Any]
    paths: tuple[list[str], list[str]]  # of the parameters, of the buffers
    param_names: dict[int, str]  # id(parameter) -> path, while it holds
    module_refs: list[Any]  # the module and its submodules
    holding_refs: list[Any]  # what they held: parameters, buffers, children, in order
    counts: list[int]  # how many of each, per submodule

    def params(self) -> list[Any]:
        return [r() for r in self.param_refs]

    def buffers(self) -> list[Any]:
        return [r() for r in self.buffer_refs]

    def holds(self) -> bool:
        """Whether every submodule still holds the parameters, buffers and children it held."""
        modules = [r() for r in self.module_refs]
        if any(m is None for m in modules):
            return False
        counts, held = _holdings(modules)
        return counts == self.counts and _same(held, self.holding_refs)


def _holdings(modules: list[Any]) -> tuple[list[int], list[Any]]:
    dicts = [d for m in modules for d in (m._parameters, m._buffers, m._modules)]
    return [len(d) for d in dicts], [v for d in dicts for v in d.values()]


class _ModuleStructure:
    """Each module's parameters and buffers with their paths, listed again only when one of
    its submodules holds other parameters, buffers or children than at the last listing.

    Walking a model's submodules by name is most of what naming its storages costs;
    checking what each submodule holds, by identity, costs a third of that. Assignments
    that bypass registration (FSDP2, fake-tensor swaps) are seen as well.
    """

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Any, str, _Structure]] = {}

    def of(self, module: Any, name: str) -> _Structure:
        kept = self._kept.get(id(module))
        if kept is not None and kept[0]() is module and kept[1] == name and kept[2].holds():
            return kept[2]
        params = list(module.named_parameters())
        buffers = list(module.named_buffers())
        modules = list(module.modules())
        counts, held = _holdings(modules)
        param_paths = [f"{name}.{pname}" for pname, _ in params]
        made = _Structure(
            param_refs=_refs(p for _, p in params),
            buffer_refs=_refs(b for _, b in buffers),
            paths=(param_paths, [f"{name}.{bname}" for bname, _ in buffers]),
            param_names={id(p): path for (_, p), path in zip(params, param_paths, strict=True)},
            module_refs=_refs(modules),
            holding_refs=_refs(held),
            counts=counts,
        )
        if len(self._kept) > _PRUNE_AT:
            self._kept = {k: v for k, v in self._kept.items() if v[0]() is not None}
        self._kept[id(module)] = (weakref.ref(module), name, made)
        return made


_STRUCTURE = _ModuleStructure()


@dataclass(frozen=True)
class _Kept:
    refs: list[Any]  # weak references to the source's tensors
    pointers: list[int] | None
    facts: Any
    named: list[NamedStorage]


class _SourceNames:
    """Each source's named storages as last made, reused while it holds the very same
    tensors on the same storages, and the facts its names depend on are the same.

    A kernel holding several models with their optimizers holds thousands of tensors;
    checking their identities (by weak reference: an id can be reused) and data pointers in
    bulk costs a fraction of naming each. A shape changed in place on the same storage
    (``resize_`` to fewer elements) keeps its old shape in the name.
    """

    def __init__(self) -> None:
        self._kept: dict[tuple[Any, ...], _Kept] = {}
        self._merged: tuple[list[list[NamedStorage]], dict[int, NamedStorage]] | None = None

    def named(self, source: _Source) -> list[NamedStorage]:
        tensors, facts = source.held()
        pointers: list[int] | None
        try:
            pointers = [0 if t is None else t.data_ptr() for t in tensors]
        except (RuntimeError, NotImplementedError):  # a tensor without storage: name each
            pointers = None
        kept = self._kept.get(source.key)
        if (
            kept is not None
            and pointers is not None
            and kept.pointers == pointers
            and kept.facts == facts
            and _same(tensors, kept.refs)
        ):
            return kept.named
        named = [n for t, name, cat in source.entries() if (n := _NAMES.get(t, name, cat))]
        if len(self._kept) > _PRUNE_AT:
            self._kept = {k: v for k, v in self._kept.items() if not any(map(_dead, v.refs))}
        self._kept[source.key] = _Kept(_refs(tensors), pointers, facts, named)
        return named

    def merged(self, parts: list[list[NamedStorage]]) -> dict[int, NamedStorage]:
        """The sources' storages by address, first name winning; the last merge where
        every source gave the very lists it gave then."""
        last = self._merged
        if last is not None and len(last[0]) == len(parts) and all(map(is_, last[0], parts)):
            return last[1]
        out: dict[int, NamedStorage] = {}
        for part in parts:
            for named in part:
                if named.address not in out:
                    out[named.address] = named
        self._merged = (parts, out)  # holding the lists keeps their identities unique
        return out


_SOURCES = _SourceNames()


def _tensors_in(value: Any, torch: Any) -> Iterator[tuple[str, Any, Any]]:
    """(path format, key, tensor) for the tensors a variable holds: its path is the
    variable's name followed by ``format.format(key)`` (made only where it is named)."""
    if isinstance(value, torch.Tensor):
        yield "", None, value
        if value.is_leaf and value.grad is not None:
            yield ".grad", None, value.grad
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value[:MAX_CONTAINER_ITEMS]):
            if isinstance(item, torch.Tensor):
                yield "[{}]", i, item
    elif isinstance(value, dict):
        for i, (key, item) in enumerate(value.items()):
            if i >= MAX_CONTAINER_ITEMS:
                break
            if isinstance(item, torch.Tensor):
                yield "[{!r}]", key, item
