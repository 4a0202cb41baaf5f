"""The tensors the user's variables hold, kept up to date within a budget per cell.

A kernel that has run for an hour holds millions of objects: walking them on every cell
would cost seconds. A :class:`NamespaceScan` lives as long as the shell and keeps one summary
per variable (the storages it reaches and the tensors in it that carry an autograd graph),
keyed by the identity of its value. Each cell it visits at most ``budget`` objects:

- a variable whose value is unchanged (same object; same length, for a container) costs a
  lookup; a list that grew is walked from where the last walk stopped, so a list that keeps
  a loss per step costs only its new items;
- a container of more than ``LARGE`` items is judged by a sample of them first: when none
  leads to a tensor (a dataset as a list of dicts) it is skipped whole;
- a module is summarised by its parameters, buffers and gradients, an optimizer by its state;
- what the budget does not reach this cell waits for the next one, oldest first.

What could not be checked is said once, as notes, when it is first found (containers judged
by a sample from ``SAY_SAMPLED`` items: below that, a sample of 16 that holds no tensor is
taken as the container's answer without a note).

Known limitations:
    - An item replaced in place in a list (``xs[0] = y``) or a tensor stored as a plain
      attribute of an ``nn.Module`` is not seen until the variable is reassigned.
    - A variable walked in part (its list longer than the budget allows in one cell) is
      finished over the next cells; until then hints may count what its rest holds.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpumem.held.tensor_walk import LARGE, Key, Walker, sample

SCAN_BUDGET = 500  # objects visited per cell: about 3 ms on a 2-core host
SAY_SAMPLED = 10_000  # a container judged by a sample is named in the notes from this size
HIDDEN = re.compile(r"^(_+|_\d+|_i+\d*|_[ido]h|In|Out|__\w+__)$")

_Fingerprint = tuple[Any, ...]


@dataclass
class Summary:
    """What one variable's value reaches, as of the cell it was scanned in."""

    fingerprint: _Fingerprint
    storages: dict[Key, int] = field(default_factory=dict)
    graphs: list[tuple[str, weakref.ref[Any]]] = field(default_factory=list)
    done: int = 0  # items of a sequence walked so far (the rest waits for later cells)
    cut: bool = False  # the budget ran out inside the value (or inside one of a list's items)
    skipped: list[tuple[str, int]] = field(default_factory=list)  # (where, items) by sample
    scanned_at: int = 0


@dataclass(frozen=True)
class NamespaceView:
    """The namespace's tensors as one cell sees them."""

    summaries: tuple[Summary, ...]
    visited: int  # objects visited this cell
    notes: tuple[str, ...]  # what could not be checked, said the first time it is found

    held: _Held

    def holds(self, key: Key) -> bool:
        return key in self.held.keys(self.summaries)

    def storages(self) -> dict[Key, int]:
        out: dict[Key, int] = {}
        for s in self.summaries:
            out.update(s.storages)
        return out

    def graph_tensors(self) -> Iterator[tuple[str, Any]]:
        """(where, tensor) for each live tensor that carries an autograd graph."""
        for s in self.summaries:
            for where, ref in s.graphs:
                t = ref()
                if t is not None and t.grad_fn is not None:
                    yield where, t


class _Held:
    """The union of the summaries' storage keys, made when first asked for, and kept until a
    summary changes."""

    def __init__(self) -> None:
        self.version = 0  # bumped whenever a summary is added, replaced or dropped
        self._made_at = -1
        self._keys: frozenset[Key] = frozenset()

    def keys(self, summaries: tuple[Summary, ...]) -> frozenset[Key]:
        if self._made_at != self.version:
            self._keys = frozenset(k for s in summaries for k in s.storages)
            self._made_at = self.version
        return self._keys


class NamespaceScan:
    """Per-variable summaries of a namespace, refreshed within ``budget`` objects per cell."""

    def __init__(
        self, budget: int = SCAN_BUDGET, on_optimizer: Callable[[Any, str], None] | None = None
    ) -> None:
        self.budget = budget
        self.on_optimizer = on_optimizer  # told of each optimizer met inside a variable
        self._summaries: dict[str, Summary] = {}
        self._said: set[tuple[str, str, int]] = set()
        self._held = _Held()
        self._cell = 0

    def update(self, user_ns: Any, hidden: Any, torch: Any, stop: frozenset[int]) -> NamespaceView:
        """Bring the summaries up to date with ``user_ns`` (names in ``hidden`` left out)."""
        self._cell += 1
        names = {
            name: value
            for name, value in list(user_ns.items())
            if name not in hidden and not HIDDEN.match(name)
        }
        for gone in self._summaries.keys() - names.keys():
            del self._summaries[gone]
            self._held.version += 1
        stale: list[tuple[int, str, _Fingerprint]] = []
        for name, value in names.items():
            fp = fingerprint(value, torch)
            old = self._summaries.get(name)
            if old is None or not _continues(old, fp) or _unfinished(old, value):
                stale.append((old.scanned_at if old is not None else -1, name, fp))
        visited = 0
        for _, name, fp in sorted(stale, key=lambda s: s[0]):
            if visited >= self.budget:
                break
            value = names[name]
            old = self._summaries.get(name)
            base = old if old is not None and _continues(old, fp) else None
            summary, cost = self._scan(name, value, fp, base, self.budget - visited, torch, stop)
            visited += cost
            self._summaries[name] = summary
            self._held.version += 1
        return NamespaceView(tuple(self._summaries.values()), visited, self._notes(), self._held)

    def _scan(
        self,
        name: str,
        value: Any,
        fp: _Fingerprint,
        base: Summary | None,
        budget: int,
        torch: Any,
        stop: frozenset[int],
    ) -> tuple[Summary, int]:
        walker = Walker(torch, graphs=False, stop=stop, budget=budget, sample_large=True)
        summary = Summary(fp, scanned_at=self._cell)
        if isinstance(value, (list, tuple)) and (base is not None or len(value) > LARGE):
            summary = self._scan_sequence(name, value, fp, base, walker)
        else:
            for root in _roots(value, torch):
                walker.walk(root, name)
            summary.cut = walker.truncated
        summary.storages.update(walker.storages)
        summary.graphs.extend((w, weakref.ref(t)) for w, t in walker.graph_tensors)
        summary.skipped.extend(walker.skipped)
        if self.on_optimizer is not None:
            for where, optimizer in walker.optimizers:
                self.on_optimizer(optimizer, where)
        return summary, walker.visited

    def _scan_sequence(
        self, name: str, value: Any, fp: _Fingerprint, base: Summary | None, walker: Walker
    ) -> Summary:
        """A list walked item by item from where the last walk stopped, as far as the budget goes.

        The last walk's summary goes on in place: copying it would cost as much as it holds.
        """
        if base is not None:
            summary = base
            summary.fingerprint, summary.scanned_at = fp, self._cell
        else:
            summary = Summary(fp, scanned_at=self._cell)
        if base is None and not walker.holds_tensors(sample(value)):
            walker.skipped.append((name, len(value)))
            summary.done = len(value)
            return summary
        n = len(value)
        while summary.done < n and not walker.exhausted:
            walker.walk(value[summary.done], f"{name}[...]")
            summary.cut = summary.cut or walker.truncated  # an item larger than what was left
            summary.done += 1
        return summary

    def once(self, key: str, note: str) -> list[str]:
        """``[note]`` the first time ``key`` is said in this kernel, ``[]`` after."""
        said = (key, "once", 0)
        if said in self._said:
            return []
        self._said.add(said)
        return [note]

    def _notes(self) -> tuple[str, ...]:
        notes = []
        for name, s in self._summaries.items():
            for where, n in s.skipped:
                key = (where, "sampled", n)
                if n >= SAY_SAMPLED and key not in self._said:
                    self._said.add(key)
                    notes.append(
                        f"leak hints: {where} ({n:,} items) was checked by a sample of its "
                        "items, which hold no tensor"
                    )
            partial = s.done > 0 and s.done < s.fingerprint[2]
            for kind, fact in (
                (
                    "partial",
                    "it is checked a part per cell, so a hint about it may come a few "
                    f"cells later ({s.done:,} items checked so far)",
                ),
                ("cut", "a hint may miss tensors held deep inside it"),
            ):
                key = (name, kind, s.fingerprint[0])
                if (partial if kind == "partial" else s.cut) and key not in self._said:
                    self._said.add(key)
                    notes.append(
                        f"leak hints: {name} is too large to check whole in one cell; {fact}"
                    )
        return tuple(notes)


def fingerprint(value: Any, torch: Any) -> _Fingerprint:
    """What must stay the same for a variable's summary to stay valid."""
    kind = type(value)
    if isinstance(value, (list, tuple)):  # the first item too: ids are reused after a `del`
        return (id(value), kind, len(value), id(value[0]) if value else None)
    if isinstance(value, dict):
        return (id(value), kind, len(value), id(next(iter(value.values()), None)))
    if isinstance(value, (set, frozenset)):
        return (id(value), kind, len(value))
    if isinstance(value, torch.nn.Module):
        first = next(value.parameters(), None)
        grad = None if first is None else first.grad
        return (id(value), kind, _param_count(value), _ptr(first), id(grad), _ptr(grad))
    if isinstance(value, torch.optim.Optimizer):
        return (id(value), kind, len(value.state))
    if isinstance(value, torch.Tensor):
        grad = value.grad if value.is_leaf else None  # a non-leaf's .grad warns
        return (id(value), kind, id(grad), value.grad_fn is not None, _ptr(value))
    attrs = getattr(value, "__dict__", None)
    return (id(value), kind, len(attrs) if isinstance(attrs, dict) else None)


def _continues(old: Summary, fp: _Fingerprint) -> bool:
    """True if ``fp`` is ``old``'s value, unchanged or (a list) grown past what was walked."""
    if old.fingerprint == fp:
        return True
    was = old.fingerprint
    same = was[:2] == fp[:2] and was[3:] == fp[3:]  # the same list, by its first item too
    return same and fp[1] in (list, tuple) and fp[2] >= old.done > 0


def _unfinished(old: Summary, value: Any) -> bool:
    return isinstance(value, (list, tuple)) and old.done < len(value) and old.done > 0


def _roots(value: Any, torch: Any) -> list[object]:
    """What to walk for a variable: a module's tensors, an optimizer's state, else itself."""
    if isinstance(value, torch.nn.Module):
        return [*value.parameters(), *value.buffers()]
    if isinstance(value, torch.optim.Optimizer):
        return [v for state in value.state.values() for v in state.values()]
    return [value]


def _param_count(module: Any) -> int:
    return sum(1 for _ in module.parameters())


def _ptr(t: Any) -> int | None:
    if t is None:
        return None
    try:
        return int(t.data_ptr())
    except (RuntimeError, NotImplementedError):
        return None
