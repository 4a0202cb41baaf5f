"""Find models, optimizers and tensors in the user's namespace, and name their storages.

Nothing here registers anything: the user's namespace is read as it is, one level
into containers, so `model.fc.weight.grad` and `logits` get names without the user
telling us about them. Objects passed to :func:`jupyter_gpumem.track` are read too.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable, Iterator, Mapping
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
    """Every tensor storage reachable from the namespace, by storage address; first name wins."""
    return named_of(walk(user_ns))


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
    torch = sys.modules.get("torch")
    if torch is None:
        return
    modules, optimizers = modules_and_optimizers(user_ns)
    param_names: dict[int, str] = {}
    for mod_name, module in modules.values():
        for pname, p in module.named_parameters():
            param_names[id(p)] = f"{mod_name}.{pname}"
            yield p, f"{mod_name}.{pname}", "parameters"
            if p.grad is not None:
                yield p.grad, f"{mod_name}.{pname}.grad", "gradients"
        for bname, b in module.named_buffers():
            yield b, f"{mod_name}.{bname}", "parameters"
    for opt_name, opt in optimizers.values():
        yield from _optimizer_tensors(opt, opt_name, param_names, torch)
    for label, opt in HELD.known():
        if id(opt) not in optimizers:
            yield from _optimizer_tensors(opt, label, param_names, torch, params=True)
    for name, value in roots(user_ns):
        for path, t in _tensors_in(value, name, torch):
            yield t, path, None


def _optimizer_tensors(
    opt: Any, label: str, param_names: dict[int, str], torch: Any, params: bool = False
) -> Iterator[tuple[Any, str, str | None]]:
    """The gradients and state of ``opt``'s parameters (and, with ``params``, the parameters
    no namespace module named)."""
    for g, group in enumerate(opt.param_groups):
        for i, p in enumerate(group["params"]):
            pname = param_names.get(id(p))
            if pname is None:
                pname = f"{label}.param_groups[{g}][{i}]"
                if params:
                    param_names[id(p)] = pname
                    yield p, pname, "parameters"
            if p.grad is not None:
                yield p.grad, f"{pname}.grad", "gradients"
            for key, value in opt.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    yield value, f"{label}.state[{pname}][{key!r}]", "optimizer_state"


def _tensors_in(value: Any, name: str, torch: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, torch.Tensor):
        yield name, value
        if value.is_leaf and value.grad is not None:
            yield f"{name}.grad", value.grad
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value[:MAX_CONTAINER_ITEMS]):
            if isinstance(item, torch.Tensor):
                yield f"{name}[{i}]", item
    elif isinstance(value, dict):
        for i, (key, item) in enumerate(value.items()):
            if i >= MAX_CONTAINER_ITEMS:
                break
            if isinstance(item, torch.Tensor):
                yield f"{name}[{key!r}]", item
