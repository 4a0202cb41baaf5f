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
- "blocks" finds modules that repeat by class; blocks that differ in class (a stack of
  hand-written layers of different types) need a regex or a list of names.
- A key-value cache object handed to a checkpointed block in training (transformers'
  ``cache``, ``past_key_values`` or ``layer_past``: one with an ``update`` method) is not
  handed on, as transformers' own gradient checkpointing does: the recompute would write it a
  second time (a Llama's eager attention then fails on keys twice as long, T5 saves other
  tensors). A block class that sets ``_can_checkpoint_with_cache`` keeps its cache.
- A checkpointed single layer (a Linear, a Conv) keeps its input for backward, as the layer
  itself would, so it frees next to nothing; ``region_warnings`` says so, naming the case where
  "blocks" found only such layers (an MLP in an ``nn.Sequential``).
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

_CACHES = ("cache", "past_key_values", "past_key_value", "layer_past")  # transformers' names
_BIG_REGION = 0.8  # share of the parameters above which one region saves next to nothing
_FEW = 3  # a group with fewer members is a pair of towers rather than a stack of blocks


@dataclass(frozen=True)
class BlockGroup:
    """Modules of one class that repeat in a model: candidates for checkpointing one by one."""

    kind: str  # the class name, e.g. "GPT2Block"
    names: tuple[str, ...]  # qualified names, in module order
    parameters: int  # parameters the group holds (shared ones counted once)


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def block_groups(model: nn.Module) -> list[BlockGroup]:
    """Every repeated structure of ``model``, the largest (by parameters) first.

    A group is either the children of one class in an ``nn.Sequential`` or ``nn.ModuleList``
    (at least two, holding parameters), or every instance of one class that has submodules
    and is neither a plain container nor inside another instance of itself (at least two):
    so a ModuleList of blocks, a Sequential stack and a ResNet's Bottlenecks spread over
    ``layer1..layer4`` are all found. Groups of three or more come before pairs (a T5's two
    stacks are towers, its 24 blocks are the blocks); ties go to the outermost, then the first.
    """
    modules = dict(model.named_modules())
    order = {name: i for i, name in enumerate(modules)}
    found: dict[tuple[str, ...], str] = {}
    for name, module in modules.items():
        if type(module) not in (nn.Sequential, nn.ModuleList):
            continue
        prefix = f"{name}." if name else ""
        by_kind: dict[type, list[str]] = {}
        for child_name, child in module.named_children():
            if any(True for _ in child.parameters()):
                by_kind.setdefault(type(child), []).append(f"{prefix}{child_name}")
        for kind, names in by_kind.items():
            if len(names) > 1:
                found.setdefault(tuple(names), kind.__name__)
    instances: dict[type, list[str]] = {}
    for name, module in modules.items():
        if name and type(module) not in _CONTAINERS and any(True for _ in module.children()):
            instances.setdefault(type(module), []).append(name)
    for kind, names in instances.items():
        outer = [n for n in names if not any(a in names for a in _ancestors(n))]
        if len(outer) > 1:
            found.setdefault(tuple(outer), kind.__name__)
    groups = [
        BlockGroup(kind, names, _parameters(modules[n] for n in names))
        for names, kind in found.items()
    ]
    groups = [g for g in groups if g.parameters > 0]
    return sorted(
        groups,
        key=lambda g: (
            len(g.names) < _FEW,
            -g.parameters,
            min(n.count(".") for n in g.names),
            order[g.names[0]],
        ),
    )


def blocks(model: nn.Module) -> list[str]:
    """Qualified names of the model's repeated blocks, in module order; ``[]`` when none repeat.

    The largest group of :func:`block_groups`, joined by every other group of another class
    that holds at least a quarter as many parameters and does not overlap it (the encoder and
    decoder layers of an encoder-decoder model).
    """
    groups = block_groups(model)
    if not groups:
        return []
    best = groups[0]
    chosen = list(best.names)
    for group in groups[1:]:
        if group.kind == best.kind or 4 * group.parameters < best.parameters:
            continue
        if not any(_overlap(a, b) for a in group.names for b in chosen):
            chosen.extend(group.names)
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return sorted(chosen, key=order.__getitem__)


def no_blocks_message(model: nn.Module) -> str:
    """Why 'blocks' found nothing, naming the largest modules to checkpoint instead."""
    total = _parameters([model])
    largest = sorted(
        ((name, m) for name, m in model.named_modules() if name),
        key=lambda item: -_parameters([item[1]]),
    )
    picked: list[str] = []
    for name, m in largest:
        if 0 < _parameters([m]) < total and not any(_overlap(name, p) for p in picked):
            picked.append(name)
    shown = [
        f"{name!r} ({type(model.get_submodule(name)).__name__}, "
        f"{_parameters([model.get_submodule(name)]):,} parameters)"
        for name in picked[:3]
    ]
    where = f"; its largest modules are {', '.join(shown)}" if shown else ""
    return (
        f"'blocks' found no repeated blocks in {type(model).__name__} (no two modules of one "
        f"class in an nn.Sequential or nn.ModuleList, no class with submodules used twice){where}."
        f" Name the modules to checkpoint instead. {CHECKPOINT_HELP}"
    )


def _parameters(modules: Any) -> int:
    seen: dict[int, int] = {}
    for module in modules:
        for p in module.parameters():
            seen[id(p)] = p.numel()
    return sum(seen.values())


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(f"{b}.") or b.startswith(f"{a}.")


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
            raise ValueError(no_blocks_message(model))
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
    kwargs = _without_cache(module, kwargs)
    # Keyword arguments travel positionally so that checkpoint sees their tensors (device RNG
    # state) and so that names like `use_reentrant` cannot collide with checkpoint's own.
    keys, count = tuple(kwargs), len(args)

    def run(*flat: Any) -> Any:
        return inner(*flat[:count], **dict(zip(keys, flat[count:], strict=True)))

    return _checkpoint(run, *args, *kwargs.values(), use_reentrant=False, preserve_rng_state=True)


def _without_cache(module: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A block's keyword arguments with no cache for it to write (see the module's notes)."""
    if getattr(module, "_can_checkpoint_with_cache", False):
        return kwargs
    return {
        k: None if k in _CACHES and callable(getattr(v, "update", None)) else v
        for k, v in kwargs.items()
    }


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


def single_layers_warning(model: nn.Module, targets: list[str]) -> str | None:
    """Why checkpointing ``targets`` frees next to nothing: each is a single layer; else None.

    A model whose only repeated modules are layers (an MLP's Linears in an ``nn.Sequential``)
    has no repeated blocks; "blocks" then finds those layers, and the warning says so.
    """
    modules = [model.get_submodule(name) for name in targets]
    if not modules or any(any(True for _ in m.children()) for m in modules):
        return None
    kinds = ", ".join(sorted({type(m).__name__ for m in modules}))
    found = (
        "checkpoint='blocks' found no repeated blocks in this model, only repeated single layers"
        if list(targets) == blocks(model)
        else "every checkpointed module is a single layer"
    )
    return (
        f"{found} ({_some(list(targets))}: {kinds}): a checkpointed layer keeps its input for "
        "backward, as the layer itself does, so next to nothing is freed. Checkpoint modules "
        "that hold several layers (a tuple of names or a regex)."
    )


def region_warnings(model: nn.Module, targets: list[str]) -> list[str]:
    """BatchNorm inside regions (running stats update twice), regions too big to save, and
    regions of a single layer (nothing to save)."""
    total = sum(p.numel() for p in model.parameters())
    out = []
    single = single_layers_warning(model, targets)
    if single is not None:
        out.append(single)
    with_norms: list[tuple[str, list[str]]] = []
    for name in targets:
        region = model.get_submodule(name)
        # _BatchNorm is the common base of BatchNorm1d/2d/3d, the lazy ones and SyncBatchNorm.
        norms = [
            f"{name}.{sub_name}" if sub_name else name
            for sub_name, sub in region.named_modules()
            if isinstance(sub, nn.modules.batchnorm._BatchNorm) and sub.track_running_stats
        ]
        if norms:
            with_norms.append((name, norms))
        share = sum(p.numel() for p in region.parameters()) / total if total else 0.0
        if share > _BIG_REGION:
            out.append(
                f"checkpointed region {name!r} holds {share:.0%} of the parameters: backward "
                "recomputes it whole, so the activation peak barely drops; checkpoint its "
                "blocks instead (e.g. checkpoint='blocks')"
            )
    twice = "in training their running statistics update twice per step (forward and recompute)"
    if len(with_norms) == 1:
        name, norms = with_norms[0]
        out.insert(0, f"BatchNorm {_some(norms)} inside checkpointed region {name!r}: {twice}")
    elif with_norms:
        regions = [name for name, _ in with_norms]
        out.insert(
            0, f"BatchNorm inside {len(regions)} checkpointed regions ({_some(regions)}): {twice}"
        )
    return out


def _some(names: list[str]) -> str:
    """The first three names quoted, and how many more."""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(repr(n) for n in names[:3]) + more
