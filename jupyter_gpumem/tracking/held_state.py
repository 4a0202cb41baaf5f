"""Optimizers the kernel holds anywhere, not only under a variable of the namespace.

A library keeps its training state where the user never names it: HF ``Trainer`` at
``trainer.optimizer`` (an accelerate wrapper around the torch optimizer), Lightning inside
its trainer, a user's own class in an attribute. Their state still counts as optimizer
state, and their parameters' ``.grad`` as gradients, in every later cell. They are found
from what the extension sees anyway, never by attribute names:

- a global optimizer step hook, installed while the extension is loaded: every optimizer
  that steps, in a `%%gpumem` cell or not, is known from its first step on;
- the namespace scan's bounded walk (:mod:`jupyter_gpumem.held.namespace_scan`) reports the
  optimizers it meets inside the variables it walks, with the variable that holds them.

Only weak references are kept: a known optimizer never outlives the user's last reference.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from typing import Any


class HeldOptimizers:
    """Every optimizer seen stepping or found by the scan, with where it was found."""

    def __init__(self) -> None:
        self._where: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._hook: Any = None
        self.count = 0  # moves whenever an optimizer is added or relabelled

    def install(self) -> None:
        """Hear every optimizer step from now on (once torch is imported)."""
        torch = sys.modules.get("torch")
        if torch is None or self._hook is not None:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._hook = register_optimizer_step_post_hook(self._stepped)

    def uninstall(self) -> None:
        if self._hook is not None:
            self._hook.remove()
        self._hook = None

    @property
    def installed(self) -> bool:
        return self._hook is not None

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer not in self._where:
            self._where[optimizer] = type(optimizer).__name__
            self.count += 1

    def found(self, optimizer: Any, where: str) -> None:
        """``optimizer`` was reached from the variable ``where``: that names it from now on."""
        label = f"{where}: {type(optimizer).__name__}"
        if self._where.get(optimizer) != label:
            self._where[optimizer] = label
            self.count += 1

    def known(self) -> Iterator[tuple[str, Any]]:
        """(label, optimizer) for every live one, in the order they were first seen; those a
        tuner configuration replaced (their state parked until it is reverted) are left out."""
        techniques = sys.modules.get("jupyter_gpumem.techniques.optimizers")
        parked = getattr(techniques, "PARKED", ())
        yield from ((where, opt) for opt, where in list(self._where.items()) if opt not in parked)

    def clear(self) -> None:
        self._where.clear()
        self.count += 1


HELD = HeldOptimizers()
