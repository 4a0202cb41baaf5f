"""The peak by module: which module's calls hold which bytes when the peak is reached.

A block at the peak belongs to a module call by what says so most directly: the tag that
named its category (an activation is saved inside a call; a parameter, its gradient and
its optimizer state belong to the module owning the parameter), else the call running
when it was allocated (the scope marks), else to no module. Bytes outside every module,
library buffers and the allocator's slack stay with the root, so the root's entry is the
breakdown itself.

A module called more than once in one forward (a shared layer, a loop over one block)
reads ``name#k`` for its ``k``-th call, its children under each call.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jupyter_gpumem.records import ModuleCall, ScopeMark

ROOT = ""
OUTSIDE = -1
# Whose bytes these are is not a module's: they stay with the root.
NOT_A_MODULES = frozenset({"library_workspace", "cuda_graph_pool", "allocator_slack"})


@dataclass(frozen=True)
class ModuleBytes:
    """One module at the peak: bytes by category, its children's included."""

    path: str  # "transformer.h.3.attn"; "" the model; "blocks.0#1" the second call
    bytes: dict[str, int]  # category -> bytes, nonzero only
    children: tuple[ModuleBytes, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def own(self) -> dict[str, int]:
        """Bytes held by this module's code itself, its children's taken out."""
        out = dict(self.bytes)
        for child in self.children:
            for category, n in child.bytes.items():
                out[category] = out.get(category, 0) - n
        return {c: n for c, n in out.items() if n}

    def largest(self) -> ModuleBytes | None:
        """The module below this one whose own bytes are the most; None: no module holds any."""
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def ranked(self) -> list[ModuleBytes]:
        """The modules below this one that hold bytes themselves, the most first."""
        own = [(sum(m.own().values()), m) for m in self.walk()[1:]]
        return [m for n, m in sorted(own, key=lambda x: -x[0]) if n > 0]

    def walk(self) -> list[ModuleBytes]:
        """This module and every module under it, parents first."""
        out = [self]
        for child in self.children:
            out.extend(child.walk())
        return out

    def flat(self) -> dict[str, dict[str, int]]:
        """``{path: {category: bytes}}`` for every module that holds bytes."""
        return {m.path: dict(m.bytes) for m in self.walk() if m.bytes or m.path == ROOT}

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "bytes": dict(self.bytes),
            "children": [c.to_dict() for c in self.children],
        }


def module_bytes_from_dict(data: Mapping[str, object]) -> ModuleBytes:
    children = data.get("children") or ()
    return ModuleBytes(
        path=str(data.get("path", "")),
        bytes={str(k): int(v) for k, v in dict(data.get("bytes") or {}).items()},  # type: ignore[call-overload]
        children=tuple(module_bytes_from_dict(c) for c in children),  # type: ignore[attr-defined]
    )


@dataclass
class ModuleTally:
    """Collects, block by block, the bytes of each module call at the peak."""

    calls: Sequence[ModuleCall]
    marks: Sequence[ScopeMark]
    by_scope: dict[int, dict[str, int]] = field(default_factory=dict)
    _times: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._times = [m.time_us for m in self.marks]

    def scope_at(self, time_us: int) -> int:
        """The call running at ``time_us``; ``OUTSIDE`` before the first mark."""
        i = bisect.bisect_right(self._times, time_us) - 1
        return self.marks[i].scope if i >= 0 else OUTSIDE

    def add(self, scope: int, category: str, nbytes: int) -> None:
        if scope == OUTSIDE or category in NOT_A_MODULES or not 0 <= scope < len(self.calls):
            return
        into = self.by_scope.setdefault(scope, {})
        into[category] = into.get(category, 0) + nbytes


def module_tree(tally: ModuleTally, breakdown: Mapping[str, int]) -> ModuleBytes:
    """The tree of modules holding bytes at the peak; the root's entry is ``breakdown``."""
    labels = _labels(tally.calls)
    parents = _parents(tally.calls, labels)
    own: dict[str, dict[str, int]] = {}
    for scope, amounts in tally.by_scope.items():
        into = own.setdefault(labels[scope], {})
        for category, n in amounts.items():
            into[category] = into.get(category, 0) + n
    children: dict[str, list[str]] = {}
    calls_first = sorted(range(len(labels)), key=lambda i: tally.calls[i].call < 0)
    for label in dict.fromkeys(labels[i] for i in calls_first):  # the order they ran in
        if label != ROOT:
            children.setdefault(parents[label], []).append(label)

    seen: set[str] = set()
    kids = [_subtree(c, children, own, seen) for c in children.get(ROOT, ()) if c not in seen]
    # a label whose parents loop never hangs from the root's walk: it joins the root
    kids += [_subtree(c, children, own, seen) for c in own if c not in seen and c != ROOT]
    root = {c: n for c, n in breakdown.items() if n}
    return ModuleBytes(ROOT, root, tuple(k for k in kids if k is not None))


def _subtree(
    label: str,
    children: Mapping[str, list[str]],
    own: Mapping[str, dict[str, int]],
    seen: set[str],
) -> ModuleBytes | None:
    """``label``'s entry: its own bytes and its children's; None where it holds none."""
    seen.add(label)
    subtrees = (_subtree(c, children, own, seen) for c in children.get(label, ()) if c not in seen)
    kids = [k for k in subtrees if k is not None]
    total = dict(own.get(label, {}))
    for kid in kids:
        for category, n in kid.bytes.items():
            total[category] = total.get(category, 0) + n
    total = {c: n for c, n in total.items() if n}
    if not total:
        return None
    return ModuleBytes(label, total, tuple(kids))


def _labels(calls: Sequence[ModuleCall]) -> list[str]:
    """Each call's label: its name, with ``#k`` where the name was called more than once."""
    repeated = {c.name for c in calls if c.call > 0}
    return [f"{c.name}#{c.call}" if c.call >= 0 and c.name in repeated else c.name for c in calls]


def _parents(calls: Sequence[ModuleCall], labels: Sequence[str]) -> dict[str, str]:
    """Each label's parent: the enclosing call's label, first seen wins.

    An owner of parameters (not a call) hangs where its module's first call does, else under
    the longest dotted prefix that is a label, else the root.
    """
    out: dict[str, str] = {}
    for call, label in zip(calls, labels, strict=True):
        if call.call >= 0 and label not in out:
            out[label] = labels[call.parent] if call.parent >= 0 else ROOT
    known = set(out)
    for call, label in zip(calls, labels, strict=True):
        if label in out:
            continue
        first = f"{call.name}#0"
        if first in out:
            out[label] = out[first]
            continue
        parts = call.name.split(".")
        out[label] = next(
            (p for p in (".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)) if p in known),
            ROOT,
        )
    for label, parent in out.items():
        if parent == label:
            out[label] = ROOT
    return out
