"""Optimizers rebuilt over the same parameters, carrying hyper-parameters that mean the same.

``lr`` and ``weight_decay`` are carried per param group; ``betas`` and ``eps`` between Adam
variants, ``betas`` between Lions, ``momentum`` between SGDs (0.9 when the old one had none).
The replaced optimizer is left untouched, but its state tensors are moved to the CPU while the
new one is in use (so the memory measured is the new optimizer's) and moved back on revert.

Known limitations:
- The replaced optimizer must not be stepped while its state is parked on the CPU (its
  parameters are elsewhere); rebind the variable that names it to ``Applied.optimizer``.
- Learning-rate schedulers stay bound to the original optimizer.
- Lion usually wants a 3-10x smaller lr than AdamW; the lr is carried as is.
- adamw-fused falls back to the default AdamW (with a warning) where torch has no fused
  kernel for the parameters' device or dtype; torch >= 2.4 has one for CPU and CUDA.
- adamw-8bit and adamw-paged-8bit (bitsandbytes) need CUDA parameters; bitsandbytes raises
  otherwise. The paged variant keeps its larger state tensors in CUDA unified memory, outside
  PyTorch's allocator: a measured peak leaves them out (the driver pages them to the host under
  pressure), and an estimate says so rather than give a figure.
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from jupyter_gpumem.techniques.config import check_optimizer

_ADAM_LIKE = ("adam", "adamw", "adamw-fused", "adamw-8bit", "adamw-paged-8bit")
# name -> (module, class, what to pip install)
_OPTIONAL = {
    "adamw-8bit": ("bitsandbytes.optim", "AdamW8bit", "bitsandbytes"),
    "adamw-paged-8bit": ("bitsandbytes.optim", "PagedAdamW8bit", "bitsandbytes"),
    "lion": ("lion_pytorch", "Lion", "lion-pytorch"),
}


def _family(optimizer: torch.optim.Optimizer | None) -> str | None:
    """The old optimizer's family ("adam", "sgd", "lion" or None): which settings carry over."""
    if optimizer is None:
        return None
    name = type(optimizer).__name__.lower()
    if "lion" in name:
        return "lion"
    if "adam" in name and "adafactor" not in name:
        return "adam"
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    return None


def optimizer_name(optimizer: object) -> str | None:
    """What ``optimizer`` is, named as in OPTIMIZERS where it is one of them (else its class).

    None when there is no optimizer; the tuner shows it as the "as is" choice.
    """
    if optimizer is None:
        return None
    name = type(optimizer).__name__
    lower = name.lower()
    defaults = getattr(optimizer, "defaults", {})
    if isinstance(optimizer, torch.optim.AdamW):  # before Adam: AdamW subclasses it in torch 2.6+
        return "adamw-fused" if defaults.get("fused") else "adamw"
    if isinstance(optimizer, torch.optim.Adam):
        return "adam"
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd-momentum" if defaults.get("momentum") else "sgd"
    if "adafactor" in lower:
        return "adafactor"
    if "adamw" in lower and "8bit" in lower:
        return "adamw-paged-8bit" if "paged" in lower else "adamw-8bit"
    if lower == "lion":
        return "lion"
    return name


def _carried(name: str, group: dict[str, Any], family: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {k: group[k] for k in ("lr", "weight_decay") if k in group}
    if name in _ADAM_LIKE and family == "adam":
        out.update({k: group[k] for k in ("betas", "eps") if k in group})
    if name == "lion" and family == "lion" and "betas" in group:
        out["betas"] = group["betas"]
    if name == "sgd-momentum":
        momentum = group.get("momentum", 0.0) if family == "sgd" else 0.0
        out["momentum"] = momentum or 0.9
    return out


def _optional_class(name: str) -> Callable[..., torch.optim.Optimizer]:
    module_name, class_name, package = _OPTIONAL[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"optimizer {name!r} needs the {package} package: pip install {package}"
        ) from exc
    cls: Callable[..., torch.optim.Optimizer] = getattr(module, class_name)
    return cls


def _fused_problem(groups: Iterable[dict[str, Any]]) -> str | None:
    """Why fused AdamW cannot run on these parameters, or None when it can."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        devices = set(_get_fused_kernels_supported_devices())
    except ImportError:  # private helper gone: assume the devices of torch 2.4
        devices = {"cuda", "cpu"}
    for group in groups:
        for p in group["params"]:
            if p.device.type not in devices:
                return f"torch has no fused AdamW kernel for {p.device.type} (only {', '.join(sorted(devices))})"
            if not p.is_floating_point():
                return f"fused AdamW needs floating point parameters, found {p.dtype}"
    return None


def build_optimizer(
    name: str, model: nn.Module, old: torch.optim.Optimizer | None
) -> tuple[torch.optim.Optimizer, list[str]]:
    """A new ``name`` optimizer over ``old``'s param groups (or the model's trainable parameters).

    Returns the optimizer and warnings. Raises ValueError for unknown names and ImportError,
    with the ``pip install`` line, when an optional package is missing.
    """
    check_optimizer(name)
    if name is None:
        raise ValueError("build_optimizer needs an optimizer name")
    family = _family(old)
    if old is None:
        trainable = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": trainable, **_carried(name, {}, None)}]
    else:
        groups = [
            {"params": list(g["params"]), **_carried(name, g, family)} for g in old.param_groups
        ]
    if not any(g["params"] for g in groups):
        raise ValueError("the model has no parameters that require grad; nothing to optimize")
    warnings: list[str] = []
    if name in ("sgd", "sgd-momentum"):
        return torch.optim.SGD(groups), warnings
    if name == "adam":
        return torch.optim.Adam(groups), warnings
    if name == "adamw":
        return torch.optim.AdamW(groups), warnings
    if name == "adamw-fused":
        problem = _fused_problem(groups)
        if problem is None:
            return torch.optim.AdamW(groups, fused=True), warnings
        warnings.append(f"adamw-fused: {problem}; using the default AdamW instead")
        return torch.optim.AdamW(groups), warnings
    if name == "adafactor":
        adafactor: Callable[..., torch.optim.Optimizer] | None = getattr(
            torch.optim, "Adafactor", None
        )
        if adafactor is None:
            raise ValueError(
                f"adafactor needs torch >= 2.5 (torch.optim.Adafactor); this is torch {torch.__version__}"
            )
        return adafactor(groups), warnings
    return _optional_class(name)(groups), warnings


# Optimizers replaced by a configuration, until it is reverted: their state is the tool's
# stash, not training state (see jupyter_gpumem.tracking.held_state).
PARKED: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()


class ParkedState:
    """The state tensors of an optimizer moved to the CPU in place; ``revert()`` moves them back."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = weakref.ref(optimizer)
        PARKED.add(optimizer)
        self._moved: list[tuple[torch.Tensor, torch.device]] = []
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    self._moved.append((value, value.device))
                    value.data = value.data.to("cpu")  # same tensor object, storage on the CPU

    def revert(self) -> None:
        """Move every parked tensor back to its device."""
        while self._moved:
            value, device = self._moved.pop()
            value.data = value.data.to(device)
        optimizer = self._optimizer()
        if optimizer is not None:
            PARKED.discard(optimizer)
