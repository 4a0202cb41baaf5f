"""What a trial runs: the model, its optimizer, a batch, the loss, the device and the step counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LossFn = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Workload:
    """The inputs every engine of the tuner takes; ``loss_fn(model, batch)`` returns the loss."""

    model: Any
    batch: Any
    loss_fn: LossFn
    optimizer: Any
    device: Any  # a torch.device with its index
    warmup: int
    steps: int


def checked_workload(
    model: Any,
    batch: Any,
    loss_fn: LossFn,
    *,
    optimizer: Any,
    warmup: int,
    steps: int,
    device: Any,
) -> Workload:
    """A Workload of the user's objects, refused with a clear message where one cannot serve."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be a callable loss_fn(model, batch) -> loss tensor")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}"
        )
    for name, value, least in (("warmup", warmup, 0), ("steps", steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be a whole number of steps >= {least}, got {value!r}")
    return Workload(model, batch, loss_fn, optimizer, _device(torch, model, device), warmup, steps)


def _device(torch: Any, model: Any, device: Any) -> Any:
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        # without initialising CUDA, which would keep forked ranks from using it
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        device = torch.device("cuda", index)
    return device
