"""Names kept across reads: each tensor's record, each module's structure, each source's names.

A kernel holding several models with their optimizers holds thousands of tensors, and a
`%%gpumem` cell names them at its start and end. What was named is kept and checked in bulk,
by weak reference and data pointer, so a read costs per tensor a check, and a name only where
something changed. Nothing kept holds a tensor or a module alive.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import is_
from typing import Any

from jupyter_gpumem.records import NamedStorage

PRUNE_AT = 64  # kept modules or sources before the first pruning of the dead


def named(t: Any, name: str, category: str | None) -> NamedStorage | None:
    """The record of ``t``'s storage under ``name``; None for a tensor without one."""
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


class NameCache:
    """Each tensor's record as last made, reused while the tensor keeps its data and name.

    A kernel holding several models names thousands of parameters and optimizer states on
    every cell; reading each one's storage again is most of that cost. Keyed by ``id`` with
    a weak reference to check it (a tensor's ``==`` is elementwise, so tensors cannot be keys);
    a tensor's entry goes when the tensor does.
    """

    def __init__(self) -> None:
        self._made: dict[int, tuple[weakref.KeyedRef, int, NamedStorage | None]] = {}

    def __len__(self) -> int:
        return len(self._made)

    def get(self, t: Any, name: str, category: str | None) -> NamedStorage | None:
        kept = self._made.get(id(t))
        try:
            ptr = t.data_ptr()
        except (RuntimeError, NotImplementedError):
            ptr = 0
        unchanged = kept is not None and kept[0]() is t and kept[1] == ptr  # not narrowing t
        if unchanged:
            assert kept is not None
            record = kept[2]
            if record is None:
                return None
            same = record.name == name and record.category == category
            if same and record.shape == tuple(t.shape):
                return record
        made = named(t, name, category)
        self._made[id(t)] = (weakref.KeyedRef(t, self._forget, id(t)), ptr, made)
        return made

    def _forget(self, ref: weakref.KeyedRef) -> None:
        kept = self._made.get(ref.key)
        if kept is not None and kept[0] is ref:
            del self._made[ref.key]


NAMES = NameCache()


@dataclass(frozen=True)
class Source:
    """One module, optimizer or variable: its tensors with the facts their names depend on,
    read cheaply, and the tensors with their names and categories, made only when named."""

    key: tuple[Any, ...]  # where its names are kept
    held: Callable[[], tuple[list[Any], Any]]  # its tensors (None where absent), and the facts
    entries: Callable[[], Iterable[tuple[Any, str, str | None]]]
    owner: Any = None  # the optimizer whose id is in ``key``: its entry goes with it


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
class Structure:
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


class ModuleStructure:
    """Each module's parameters and buffers with their paths, listed again only when one of
    its submodules holds other parameters, buffers or children than at the last listing.

    Walking a model's submodules by name is most of what naming its storages costs;
    checking what each submodule holds, by identity, costs a third of that. Assignments
    that bypass registration (FSDP2, fake-tensor swaps) are seen as well.
    """

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Any, str, Structure]] = {}
        self._live = 0  # entries left by the last pruning

    def of(self, module: Any, name: str) -> Structure:
        kept = self._kept.get(id(module))
        if kept is not None and kept[0]() is module and kept[1] == name and kept[2].holds():
            return kept[2]
        params = list(module.named_parameters())
        buffers = list(module.named_buffers())
        modules = list(module.modules())
        counts, held = _holdings(modules)
        param_paths = [f"{name}.{pname}" for pname, _ in params]
        made = Structure(
            param_refs=_refs(p for _, p in params),
            buffer_refs=_refs(b for _, b in buffers),
            paths=(param_paths, [f"{name}.{bname}" for bname, _ in buffers]),
            param_names={id(p): path for (_, p), path in zip(params, param_paths, strict=True)},
            module_refs=_refs(modules),
            holding_refs=_refs(held),
            counts=counts,
        )
        if len(self._kept) > max(PRUNE_AT, 2 * self._live):  # drop the dead, amortised
            self._kept = {k: v for k, v in self._kept.items() if v[0]() is not None}
            self._live = len(self._kept)
        self._kept[id(module)] = (weakref.ref(module), name, made)
        return made


STRUCTURE = ModuleStructure()


@dataclass(frozen=True)
class _Kept:
    refs: list[Any]  # weak references to the source's owner and tensors
    pointers: list[int] | None
    facts: Any
    named: list[NamedStorage]


class SourceNames:
    """Each source's named storages as last made, reused while it holds the very same
    tensors on the same storages, and the facts its names depend on are the same.

    A kernel holding several models with their optimizers holds thousands of tensors;
    checking their identities (by weak reference: an id can be reused) and data pointers in
    bulk costs a fraction of naming each. A shape changed in place on the same storage
    (``resize_`` to fewer elements) keeps its old shape in the name.
    """

    def __init__(self) -> None:
        self._kept: dict[tuple[Any, ...], _Kept] = {}
        self._live = 0  # entries left by the last pruning
        self._merged: tuple[list[list[NamedStorage]], dict[int, NamedStorage]] | None = None

    def __len__(self) -> int:
        return len(self._kept)

    def named(self, source: Source, held: list[Any] | None = None) -> list[NamedStorage]:
        """``source``'s named storages; ``held`` (when given) receives the tensors it holds."""
        tensors, facts = source.held()
        if held is not None:
            held.extend(t for t in tensors if t is not None)
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
            and _same([source.owner, *tensors], kept.refs)
        ):
            return kept.named
        named = [n for t, name, cat in source.entries() if (n := NAMES.get(t, name, cat))]
        if len(self._kept) > max(PRUNE_AT, 2 * self._live):  # drop the stale, amortised
            self._kept = {k: v for k, v in self._kept.items() if not any(map(_dead, v.refs))}
            self._live = len(self._kept)
        self._kept[source.key] = _Kept(_refs([source.owner, *tensors]), pointers, facts, named)
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


SOURCES = SourceNames()
