"""Activation checkpointing switched on and off in place, on the module objects the user holds.

Each target module gets an *instance* ``forward`` that runs the class's forward (or the
instance forward it already had) under non-reentrant ``torch.utils.checkpoint`` with
``preserve_rng_state=True``. No module is wrapped or replaced, so ``state_dict`` keys,
parameter objects, hooks and optimizers stay valid; reverting deletes the instance forward.

Known limitations:
- Checkpointing is skipped while grad is disabled (``torch.no_grad``, eval loops): nothing
  would be saved for backward anyway.
- Forward hooks of a target run outside its checkpointed region (once, not on recompute).
- Modules called through something other than ``module(...)`` (e.g. ``module.forward`` bound
  before applying, or ``torch.compile`` graphs built before applying) are not affected.
- Device RNG state is saved for the devices of tensors in the call's arguments (keyword
  arguments included); randomness on a device that no argument lives on is not replayed.
- "blocks" only looks for ``nn.ModuleList``; a model whose repeated blocks sit in an
  ``nn.Sequential`` needs a regex or a list of names.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint

from jupyter_gpumem.techniques.config import CHECKPOINT_HELP, check_checkpoint_spec, check_every

_BIG_REGION = 0.8  # share of the parameters above which one region saves next to nothing


def blocks(model: nn.Module) -> list[str]:
    """Qualified names of the children of the model's largest ``nn.ModuleList`` (by parameters).

    Ties go to the first list in module order; no ``nn.ModuleList`` gives ``[]``.
    """
    best: tuple[str, nn.ModuleList] | None = None
    best_count = -1
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module):
            count = sum(p.numel() for p in module.parameters())
            if count > best_count:
                best, best_count = (name, module), count
    if best is None:
        return []
    prefix = f"{best[0]}." if best[0] else ""
    return [f"{prefix}{child}" for child, _ in best[1].named_children()]


def checkpoint_targets(model: nn.Module, spec: Any, every: int = 1) -> list[str]:
    """The qualified names that ``spec`` would checkpoint, in module order.

    A regex must match a whole name; a module inside another target is dropped (the outer
    region already covers it); ``every=n`` then keeps the 1st, (n+1)-th, ... target. A regex
    that matches nothing gives ``[]``. Raises ValueError, saying what is allowed, on a bad spec.
    """
    spec = check_checkpoint_spec(spec)
    every = check_every(every)
    if spec is None:
        return []
    order = {name: i for i, (name, _) in enumerate(model.named_modules()) if name}
    if spec == "blocks":
        found = blocks(model)
        if not found:
            raise ValueError(
                f"'blocks' needs an nn.ModuleList in the model and found none. {CHECKPOINT_HELP}"
            )
    elif isinstance(spec, str):
        pattern = re.compile(spec)
        found = [name for name in order if pattern.fullmatch(name)]
    else:
        unknown = [name for name in spec if name not in order]
        if unknown:
            examples = ", ".join(list(order)[:5])
            raise ValueError(
                f"no module named {', '.join(map(repr, unknown))} in the model "
                f"(names look like: {examples}). {CHECKPOINT_HELP}"
            )
        found = sorted(set(spec), key=order.__getitem__)
    chosen = set(found)
    outermost = [n for n in found if not any(a in chosen for a in _ancestors(n))]
    return outermost[::every]


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _checkpointed_forward(
    module: nn.Module, previous: Callable[..., Any] | None, *args: Any, **kwargs: Any
) -> Any:
    """The patched forward: the original forward, recomputed in backward instead of saved."""
    inner = previous if previous is not None else functools.partial(type(module).forward, module)
    if not torch.is_grad_enabled():
        return inner(*args, **kwargs)
    # Keyword arguments travel positionally so that checkpoint sees their tensors (device RNG
    # state) and so that names like `use_reentrant` cannot collide with checkpoint's own.
    keys, count = tuple(kwargs), len(args)

    def run(*flat: Any) -> Any:
        return inner(*flat[:count], **dict(zip(keys, flat[count:], strict=True)))

    return _checkpoint(run, *args, *kwargs.values(), use_reentrant=False, preserve_rng_state=True)


def is_checkpointed(module: nn.Module) -> bool:
    """Whether ``module`` currently runs under a forward patched by this module."""
    fwd = module.__dict__.get("forward")
    return isinstance(fwd, functools.partial) and fwd.func is _checkpointed_forward


_MISSING = object()


@dataclass
class _Patch:
    module: nn.Module
    previous: Any  # the instance forward before patching, or _MISSING
    patched: functools.partial[Any]


class Checkpointing:
    """Checkpointing applied to named modules of one model; ``revert()`` undoes it exactly."""

    def __init__(self, model: nn.Module, targets: list[str]) -> None:
        modules = [model.get_submodule(name) for name in targets]
        already = [n for n, m in zip(targets, modules, strict=True) if is_checkpointed(m)]
        if already:
            raise ValueError(f"already checkpointed: {', '.join(already)}; revert that first")
        self.targets = tuple(targets)
        self.warnings = tuple(region_warnings(model, targets))
        self._patches: list[_Patch] = []
        for module in modules:
            previous = module.__dict__.get("forward", _MISSING)
            patched = functools.partial(
                _checkpointed_forward, module, None if previous is _MISSING else previous
            )
            module.forward = patched  # type: ignore[method-assign]  # instance attr shadows the class forward
            self._patches.append(_Patch(module, previous, patched))

    def revert(self) -> list[str]:
        """Give every target its forward back; returns warnings for forwards changed since."""
        problems = []
        while self._patches:
            patch = self._patches.pop()
            if patch.module.__dict__.get("forward") is not patch.patched:
                problems.append(
                    f"{type(patch.module).__name__}.forward was replaced after checkpointing; left as is"
                )
                continue
            if patch.previous is _MISSING:
                del patch.module.forward
            else:
                patch.module.forward = patch.previous  # type: ignore[method-assign]  # restoring the user's
        return problems


def region_warnings(model: nn.Module, targets: list[str]) -> list[str]:
    """BatchNorm inside a region (running stats update twice) and regions too big to save."""
    total = sum(p.numel() for p in model.parameters())
    out = []
    for name in targets:
        region = model.get_submodule(name)
        # _BatchNorm is the common base of BatchNorm1d/2d/3d, the lazy ones and SyncBatchNorm.
        norms = [
            f"{name}.{sub_name}" if sub_name else name
            for sub_name, sub in region.named_modules()
            if isinstance(sub, nn.modules.batchnorm._BatchNorm) and sub.track_running_stats
        ]
        if norms:
            shown = ", ".join(repr(n) for n in norms[:3]) + (
                f" and {len(norms) - 3} more" if len(norms) > 3 else ""
            )
            out.append(
                f"BatchNorm {shown} inside checkpointed region {name!r}: in training their "
                "running statistics update twice per step (forward and recompute)"
            )
        share = sum(p.numel() for p in region.parameters()) / total if total else 0.0
        if share > _BIG_REGION:
            out.append(
                f"checkpointed region {name!r} holds {share:.0%} of the parameters: backward "
                "recomputes it whole, so the activation peak barely drops; checkpoint its "
                "blocks instead (e.g. checkpoint='blocks')"
            )
    return out
