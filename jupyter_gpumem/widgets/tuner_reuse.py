"""Which tuner panel each model has in this kernel, so that `tune` never starts over silently.

Running a cell such as ``tuner = tune(model, "opt", trial=Trial(model, ids, loss_fn))`` again
asks for the same panel: `tune` then returns the open panel it made for that model, with its
measurements and selections, when the optimizer variable is the same and the trial runs the
same step (the same model, batch, loss function and optimizer objects, the same settings).
Otherwise `tune` makes a fresh panel and says so in it; the earlier panel first reverts what
it applied, since two panels cannot both hold techniques on one model.
"""

from __future__ import annotations

import weakref
from dataclasses import fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jupyter_gpumem.tuner.trial import Trial

__all__ = ["differs", "earlier", "remember", "same_trial"]

# the latest panel (a Tuner) of each model, by id(model): it holds the model, so the id is not
# reused
_LATEST: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def same_trial(a: Trial | None, b: Trial | None) -> bool:
    """Whether ``a`` and ``b`` run the same step: both None, or the same workload's objects."""
    if a is None or b is None:
        return a is b
    if a is b:
        return True
    wa, wb = a.workload, b.workload
    return all(_same(getattr(wa, f.name), getattr(wb, f.name)) for f in fields(wa))


def _same(x: Any, y: Any) -> bool:
    """The same object, or equal plain settings (steps, device); tensors are never compared."""
    import torch  # the trial has imported it

    if x is y:
        return True
    plain = (bool, int, float, str, torch.device)
    return type(x) is type(y) and isinstance(x, plain) and x == y


def earlier(model: Any, shell: Any) -> Any:
    """The open panel made last for ``model`` in ``shell``, if any."""
    found = _LATEST.get(id(model))
    if found is None or found.model is not model or found.shell is not shell:
        return None
    return None if found.comm is None else found  # closed: no panel to show again


def remember(tuner: Any) -> None:
    """``tuner`` is now its model's panel."""
    _LATEST[id(tuner.model)] = tuner


def differs(before: Any, optimizer: str, trial: Trial | None) -> str | None:
    """What ``before`` had that a call with ``optimizer`` and ``trial`` does not ask for, in
    words ("the optimizer variable 'opt', not 'opt2'"); None for the same."""
    if before.optimizer_name != optimizer:
        return f"the optimizer variable {before.optimizer_name!r}, not {optimizer!r}"
    if not same_trial(before.trial, trial):
        return (
            "no trial" if before.trial is None else "a trial" if trial is None else "another trial"
        )
    return None
