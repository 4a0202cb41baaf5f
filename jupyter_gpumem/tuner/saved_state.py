"""A host copy of what a trial may change (weights, gradients, optimizer state, RNG) and its restore.

Known limitations:

- The saved copy lives in host memory; restored gradients and optimizer state are new tensors
  with the old values (parameters and buffers keep their identity).
- Random generators other than Python's, NumPy's and torch's (CPU and CUDA) are not restored.
"""

from __future__ import annotations

import copy
import gc
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.tuner.rng import rng_state, set_rng_state


class SavedState:
    """A host copy of what a trial may change, and how to put it back."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.optimizer = optimizer
        with torch.no_grad():
            weights = [*model.parameters(), *model.buffers()]
            self.tensors = [(t, _Host.of(t).value) for t in weights]
            self.grads = [
                (p, p.grad if p.grad is None else _Host.of(p.grad)) for p in model.parameters()
            ]
        self.training = [(m, m.training) for m in model.modules()]
        self.opt_state: list[tuple[Any, dict[str, Any]]] = []
        self.opt_groups: list[dict[str, Any]] = []
        if optimizer is not None:
            for p, state in optimizer.state.items():
                self.opt_state.append((p, {k: _Host.of(v) for k, v in state.items()}))
            self.opt_groups = [
                copy.deepcopy({k: v for k, v in g.items() if k != "params"})
                for g in optimizer.param_groups
            ]
        self.rng = rng_state(torch)

    def reset_for_trial(self) -> None:
        """The user's weights and random state, with no gradients and no optimizer state."""
        self.restore()
        for p in self.model.parameters():
            p.grad = None
        if self.optimizer is not None:
            self.optimizer.state.clear()
        release(self.torch, collect=False)

    def restore(self, *, final: bool = False) -> None:
        """Weights, buffers, training flags, hyperparameters and RNG; grads and state when final."""
        torch = self.torch
        with torch.no_grad():
            for t, saved in self.tensors:
                if t.dtype == saved.dtype and t.shape == saved.shape:
                    t.copy_(saved)
                else:
                    warnings.warn(
                        f"a {t.dtype} tensor of shape {tuple(t.shape)} was saved as {saved.dtype} "
                        f"{tuple(saved.shape)}: the configuration did not revert it; restored the "
                        "saved values",
                        stacklevel=3,
                    )
                    t.data = saved.to(t.device)
        for module, flag in self.training:
            module.training = flag
        if self.optimizer is not None:
            for group, hyper in zip(self.optimizer.param_groups, self.opt_groups, strict=True):
                group.update(copy.deepcopy(hyper))
        set_rng_state(torch, self.rng)
        if not final:
            return
        for p, grad in self.grads:
            p.grad = None if grad is None else grad.back()
        if self.optimizer is not None:
            self.optimizer.state.clear()
            for p, state in self.opt_state:
                self.optimizer.state[p] = {k: v.back() for k, v in state.items()}
        release(self.torch, collect=True)


@dataclass(frozen=True)
class _Host:
    """A value saved apart from the original: tensors in host memory with their device."""

    value: Any
    device: Any = None

    @classmethod
    def of(cls, value: Any) -> _Host:
        if isinstance(value, sys.modules["torch"].Tensor):
            return cls(value.detach().to("cpu", copy=True), value.device)
        return cls(copy.deepcopy(value))

    def back(self) -> Any:
        """A fresh copy where the original lived, so the saved value survives repeated restores."""
        if self.device is None:
            return copy.deepcopy(self.value)
        return self.value.to(self.device, copy=True)


def release(torch: Any, *, collect: bool) -> None:
    """Free what a trial left (an OOM's frames included) and empty the cache for a fair start."""
    if collect:
        gc.collect()
    if torch.cuda.is_initialized():  # never is_available(): it would poison fork
        torch.cuda.empty_cache()
