"""Which module call the cell is in, recorded while the tag hooks run.

The tagger's global module hooks enter and leave a call for every module forward; each
call becomes a :class:`~jupyter_gpumem.records.ModuleCall` and each change of the
innermost call a :class:`~jupyter_gpumem.records.ScopeMark`, so an allocation's time says
which module made it. Tags carry the call directly where the hook knows it: an activation
is saved inside its module's forward, and a parameter, its gradient and its optimizer state
belong to the module that owns the parameter.

Backward runs no module hooks here. A saved activation carries its call into backward
(the saved-tensors pack hook keeps the index beside the tensor), and unpacking it says that
call's backward is running: what backward allocates from then on is that module's.

Names are qualified within the model (``transformer.h.3.attn``; ``""`` the model itself).
The first model with parameters that a cell calls is the root; other top-level modules
(a second model, a loss module) are named by their variable in the namespace, else their
class. A checkpointed block's recomputation, in backward, counts as the call it repeats.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from jupyter_gpumem.records import ModuleCall, ScopeMark

OUTSIDE = -1  # no module call: code outside every module


def _now_us() -> int:
    return time.time_ns() // 1000


class ModuleScopes:
    """Module calls, their nesting, and the call each moment is in."""

    def __init__(self, user_ns: Mapping[str, Any]) -> None:
        self.user_ns = user_ns
        # Plain tuples while the cell runs (see Tagger); typed by ``records()``.
        self._calls: list[tuple[str, int, int]] = []
        self._marks: list[tuple[int, int]] = []
        self._names: dict[int, str] = {}  # id(module) -> qualified name
        self._roots: set[int] = set()  # top-level modules whose names are read
        self._has_root = False  # a model with parameters took the name ""
        self._stack: list[int] = []
        self._counts: dict[str, int] = {}  # calls of each name in the current forward
        self._last: dict[int, int] = {}  # id(module) -> its latest call, for recomputation
        self._owners: dict[int, int] = {}  # id(module) -> its owner record
        self._params: dict[int, int] = {}  # id(parameter) -> its owner record
        self._idle = OUTSIDE  # the scope when no forward call is open: backward's module

    # -- forward -------------------------------------------------------------------------
    def begin_forward(self, module: Any) -> None:
        """A top-level forward begins: name its modules once, count calls afresh."""
        if id(module) not in self._roots:
            self._name_root(module)
        self._counts.clear()
        self._stack.clear()
        self._idle = OUTSIDE

    def enter(self, module: Any, recomputing: bool) -> None:
        """A module's forward begins (``recomputing``: inside backward, a checkpoint's)."""
        scope = self._last.get(id(module)) if recomputing else None
        if scope is None:
            name = self._names.get(id(module))
            if name is None:
                name = self._names[id(module)] = type(module).__name__
            k = self._counts.get(name, 0)
            self._counts[name] = k + 1
            scope = len(self._calls)
            self._calls.append((name, k, self._stack[-1] if self._stack else OUTSIDE))
            self._last[id(module)] = scope
        self._stack.append(scope)
        self._marks.append((_now_us(), scope))

    def leave(self) -> None:
        """The innermost open forward ends."""
        if self._stack:
            self._stack.pop()
        self._marks.append((_now_us(), self.current))

    @property
    def current(self) -> int:
        """The innermost open call, else the module whose backward runs, else ``OUTSIDE``."""
        return self._stack[-1] if self._stack else self._idle

    # -- backward and the step -----------------------------------------------------------
    def backward_of(self, scope: int) -> None:
        """Backward unpacked a tensor saved in call ``scope``: that call's backward runs."""
        if scope != self._idle and not self._stack:
            self._idle = scope
            self._marks.append((_now_us(), scope))

    def outside(self) -> None:
        """Code outside every module runs now (the optimizer step, the rest of the cell)."""
        self._stack.clear()
        if self._idle != OUTSIDE or not self._marks or self._marks[-1][1] != OUTSIDE:
            self._idle = OUTSIDE
            self._marks.append((_now_us(), OUTSIDE))

    def records(self) -> tuple[tuple[ModuleCall, ...], tuple[ScopeMark, ...]]:
        """The calls and scope marks recorded so far."""
        return tuple(map(ModuleCall._make, self._calls)), tuple(map(ScopeMark._make, self._marks))

    # -- owners of parameters ------------------------------------------------------------
    def own(self, module: Any, parameters: Any) -> int:
        """The owner record of ``module``; ``parameters`` are remembered as its own."""
        record = self._owners.get(id(module))
        if record is None:
            name = self._names.get(id(module), type(module).__name__)
            record = self._owners[id(module)] = len(self._calls)
            self._calls.append((name, -1, OUTSIDE))
        for p in parameters:  # a tied weight belongs to its first owner, as in named_parameters()
            self._params.setdefault(id(p), record)
        return record

    def owner_of(self, parameter: Any) -> int:
        return self._params.get(id(parameter), OUTSIDE)

    # -- names ---------------------------------------------------------------------------
    def _name_root(self, module: Any) -> None:
        self._roots.add(id(module))
        if not self._has_root and next(module.parameters(), None) is not None:
            self._has_root = True
            prefix = ""
        else:
            prefix = self._variable(module) or type(module).__name__
        for name, sub in module.named_modules(remove_duplicate=True):
            full = f"{prefix}.{name}" if prefix and name else (prefix or name)
            self._names.setdefault(id(sub), full)

    def _variable(self, module: Any) -> str | None:
        for key, value in self.user_ns.items():
            if value is module and not key.startswith("_"):
                return key
        return None
