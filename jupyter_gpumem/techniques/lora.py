"""LoRA (PEFT) as a technique: low-rank adapters on the linear layers of the model's blocks,
trained alone while the base weights are frozen.

It changes what is trained, so a search takes it only when asked to. The adapters are put in
place (``peft.inject_adapter_in_model``: no wrapper model, the user's object stays the model);
their optimizer runs the user's algorithm over them alone, and the user's own optimizer and the
base weights' gradients are parked on the CPU meanwhile, as a LoRA run never holds them. Revert
puts every original layer back in its parent, the ``requires_grad`` flags as they were, the
parked tensors back on their device and the random state the adapters' initialisation drew on.

Known limitations:
- Only plain ``nn.Linear`` layers and transformers' ``Conv1D`` (GPT-2's linear layers) inside
  the repeated blocks get adapters (attention layers whose forward reads their weights
  directly, as ``nn.MultiheadAttention`` does, would bypass them); the output head stays as it
  is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from jupyter_gpumem.techniques.checkpointing import blocks


def _is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D``: a linear layer with its weight stored (in, out)."""
    kind = type(module)
    return kind.__name__ == "Conv1D" and kind.__module__.startswith("transformers.")


def lora_targets(model: nn.Module) -> list[str]:
    """Qualified names of the linear layers inside the model's repeated blocks."""
    inside = tuple(f"{name}." for name in blocks(model))
    return [
        name
        for name, m in model.named_modules()
        if (type(m) is nn.Linear or _is_conv1d(m)) and name.startswith(inside)
    ]


class Lora:
    """Adapters of ``rank`` injected into ``model``; ``revert()`` takes them out exactly."""

    def __init__(self, model: nn.Module, rank: int) -> None:
        try:
            from peft import LoraConfig, inject_adapter_in_model
        except ImportError as exc:
            raise ImportError("lora needs PEFT: pip install peft") from exc
        targets = lora_targets(model)
        if not targets:
            raise ValueError(
                "lora finds no nn.Linear (or transformers Conv1D) inside the model's repeated "
                "blocks to adapt"
            )
        self._model = model
        self._attributes = set(vars(model))  # PEFT notes its config on the model: taken off again
        self._grad_flags = {id(p): (p, p.requires_grad) for p in model.parameters()}
        self._parked: list[tuple[torch.Tensor, torch.device]] = []
        devices = sorted(
            {p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"}
        )
        # the adapters' initial draws leave no trace; moved in place (fake tensors cannot swap)
        # Conv1D stores its weight transposed: PEFT's adapter must know (fan_in_fan_out)
        transposed = all(_is_conv1d(model.get_submodule(name)) for name in targets)
        config = LoraConfig(
            r=rank, lora_alpha=2 * rank, target_modules=targets, fan_in_fan_out=transposed
        )
        # made on their layers' device: a fake tensor's device cannot change in place
        weight: torch.Tensor = model.get_submodule(targets[0]).weight  # type: ignore[assignment]
        where = weight.device
        with torch.random.fork_rng(devices=devices), torch.device(where), _moved_in_place():
            inject_adapter_in_model(config, model)
        for p, _ in self._grad_flags.values():
            p.requires_grad_(False)
            if p.grad is not None and p.grad.device.type != "cpu":
                self._parked.append((p.grad, p.grad.device))
                p.grad.data = p.grad.data.to("cpu")  # the same tensor, its storage on the CPU
        self.adapters = [p for p in model.parameters() if id(p) not in self._grad_flags]
        self.warnings: tuple[str, ...] = ()

    def revert(self) -> None:
        from peft.tuners.lora import LoraLayer

        layers = [(name, m) for name, m in self._model.named_modules() if isinstance(m, LoraLayer)]
        for name, layer in layers:
            parent_name, _, child = name.rpartition(".")
            parent = self._model.get_submodule(parent_name) if parent_name else self._model
            setattr(parent, child, layer.get_base_layer())
        for name in set(vars(self._model)) - self._attributes:
            delattr(self._model, name)
        for p, flag in self._grad_flags.values():
            p.requires_grad_(flag)
        while self._parked:
            grad, device = self._parked.pop()
            grad.data = grad.data.to(device)


@contextmanager
def _moved_in_place() -> Iterator[None]:
    """PEFT moves each new adapter to its base layer's device and float dtype with
    ``Module.to``, which swaps the parameters of fake tensors and cannot (they carry weak
    references): meanwhile ``Module.to`` moves the data of each parameter and buffer in place.
    (A fake tensor keeps its device through such a move, so the adapters are made on theirs.)"""
    original = nn.Module.to

    def to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        for t in (*self.parameters(), *self.buffers()):
            cast = (
                dtype
                if dtype is not None and (t.is_floating_point() or t.is_complex())
                else t.dtype
            )
            where = device if device is not None else t.device
            if t.device != where or t.dtype != cast:
                t.data = t.data.to(where, dtype=cast)
        return self

    nn.Module.to = to  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.to = original  # type: ignore[method-assign]
