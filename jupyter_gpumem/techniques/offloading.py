"""Activation offloading: what the forward saves for backward waits in host memory.

As ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` does, each tensor the forward saves
for backward is copied to pinned host memory when it is saved (the device tensor is freed as
soon as the forward drops it) and copied back when backward needs it: less device memory for
two copies over the bus (the first step pins that host memory, on threads: see
:mod:`.pinning`). ``offload="model"`` does so for the model's whole forward,
``"blocks"`` only inside its repeated blocks (those ``checkpoint="blocks"`` finds). A forward
pre-hook and post-hook on each target enter and leave the offloading; revert removes them.

Unlike ``save_on_cpu``, whose hooks hide those beneath them (the innermost saved-tensor hooks
win), these call the hooks beneath on the device tensor, then move what they packed: the
recorder's and an estimate's hooks see each saved tensor when it is saved and its device copy
when it comes back, so both count as activations, while the host copy, never device memory,
is seen by no tracker. Parameters and their views stay where they are (they live on the device
anyway), and so do tensors already in host memory.

Offloading wraps checkpointing: on a checkpointed block, what the checkpoint saves (the block's
inputs) goes to host memory, and the inside is recomputed from it in backward; the
recomputation's own saved tensors stay on the device, as they are used at once.

Known limitations:
- On a model with nothing on a GPU nothing moves: its activations are in host memory already.
  A warning says so.
- Saved tensors come back contiguous; sparse ones are not moved.
- A module called through something other than ``module(...)``, or compiled with
  ``torch.compile``, runs without the hooks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from jupyter_gpumem.techniques.checkpointing import checkpoint_targets
from jupyter_gpumem.techniques.pinning import fast_pinning

STAYS = ("cpu", "meta")  # devices whose saved tensors are not moved
NO_EFFECT = (
    "offload has no effect here: the model has nothing on a GPU, so its activations are in "
    "host memory already and nothing is moved"
)

Hooks = tuple[Callable[[Any], Any], Callable[[Any], Any]]


def offload_targets(model: nn.Module, where: str) -> list[str]:
    """The modules whose forwards are offloaded: ``[""]`` (the model) or its blocks.

    ValueError, naming the largest modules, where ``"blocks"`` finds no repeated blocks.
    """
    if where == "model":
        return [""]
    try:
        return checkpoint_targets(model, "blocks")
    except ValueError as exc:
        raise ValueError(
            f"offload='blocks' finds blocks as checkpoint='blocks' does: {exc}"
        ) from exc


@dataclass(frozen=True)
class OnHost:
    """A saved tensor's host copy, and the device it goes back to."""

    tensor: torch.Tensor
    device: torch.device
    pinned: bool

    def back(self) -> torch.Tensor:
        return self.tensor.to(self.device, non_blocking=self.pinned, copy=True)


def moves_from(device: torch.device) -> bool:
    """Whether offloading moves what is saved on ``device`` (a GPU's, not the host's)."""
    return device.type not in STAYS


def _moves(t: torch.Tensor) -> bool:
    return moves_from(t.device) and t.layout == torch.strided


def _pins(t: torch.Tensor) -> bool:
    """Whether ``t``'s host copy is pinned: a real CUDA tensor's (never a fake one's)."""
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type == "cuda" and torch.cuda.is_available() and not is_fake(t)


def to_host(t: torch.Tensor) -> OnHost:
    """A copy of ``t`` in host memory, pinned for a CUDA tensor (never for a fake one)."""
    pin = _pins(t)
    host = torch.empty(t.size(), dtype=t.dtype, device="cpu", pin_memory=pin)
    host.copy_(t.detach(), non_blocking=pin)
    return OnHost(host, t.device, pin)


def _pack(beneath: Hooks | None, t: torch.Tensor) -> tuple[bool, Any]:
    packed = t if beneath is None else beneath[0](t)
    # a weight, or a view of one (a linear layer saves its weight transposed), stays
    if isinstance(t._base if t._is_view() else t, nn.Parameter) or not _moves(t):
        return False, packed
    return True, tree_map_only(torch.Tensor, lambda x: to_host(x) if _moves(x) else x, packed)


def _unpack(beneath: Hooks | None, packed: tuple[bool, Any]) -> Any:
    moved, inner = packed
    if moved:
        inner = tree_map_only(OnHost, OnHost.back, inner)
    return inner if beneath is None else beneath[1](inner)


def offloaded() -> torch.autograd.graph.saved_tensors_hooks:
    """Saved-tensor hooks that move what the hooks beneath them (those active now) pack to
    host memory, and back before those unpack it."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    beneath: Hooks | None = top(False) if top is not None else None
    return torch.autograd.graph.saved_tensors_hooks(
        functools.partial(_pack, beneath), functools.partial(_unpack, beneath)
    )


class Offloading:
    """Offloading on the forwards of named modules of one model; ``revert()`` removes it."""

    def __init__(self, model: nn.Module, targets: list[str]) -> None:
        self.targets = tuple(targets)
        self._handles: list[Any] = []
        self._put_back: Callable[[], None] | None = None
        self._open: list[torch.autograd.graph.saved_tensors_hooks] = []
        tensors = (*model.parameters(), *model.buffers())
        if not any(_moves(t) for t in tensors):
            self.warnings: tuple[str, ...] = (NO_EFFECT,)
            return
        self.warnings = ()
        # a real GPU's saved tensors are pinned on first use: on threads while this lasts
        self._put_back = fast_pinning() if any(_pins(t) for t in tensors) else None
        for name in targets:
            module = model.get_submodule(name)
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(module.register_forward_hook(self._leave, always_call=True))

    def _enter(self, module: nn.Module, args: Any) -> None:
        hooks = offloaded()
        hooks.__enter__()
        self._open.append(hooks)

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._open:
            self._open.pop().__exit__(None, None, None)

    def revert(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._put_back is not None:
            self._put_back()
            self._put_back = None
