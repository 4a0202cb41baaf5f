"""Apply a configuration of techniques to a model in place, and undo it exactly.

Known limitations:
- Applications nest: apply on top of an active one and revert in the reverse order.
- The user's own variables still name the original optimizer; rebinding is the caller's job.
- Autocast and loss scaling only happen where the caller's step uses ``autocast()``,
  ``backward()`` and ``step()``; there is no silent global switch.
- A parallel configuration (``parallel="ddp"`` or ``"fsdp2"``) is not reverted: ``model``
  becomes the rank's wrapped or sharded model (see :mod:`~jupyter_gpumem.techniques.parallel`),
  so apply it only to a model used for it alone.
"""

from __future__ import annotations

import contextlib
import warnings as _warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from jupyter_gpumem.techniques.accumulation import micro_batches
from jupyter_gpumem.techniques.checkpointing import Checkpointing, checkpoint_targets
from jupyter_gpumem.techniques.config import CHECKPOINT_HELP, OPTIMIZERS, Config
from jupyter_gpumem.techniques.lora import Lora
from jupyter_gpumem.techniques.offloading import Offloading, offload_targets
from jupyter_gpumem.techniques.optimizers import ParkedState, build_optimizer, optimizer_name
from jupyter_gpumem.techniques.parallel import check_group, parallelize
from jupyter_gpumem.techniques.precision import Precision


class Applied:
    """A configuration applied to ``model``; use its helpers in the step, then ``revert()``.

    ``optimizer`` is the new optimizer when the configuration names one, else the one passed
    in (possibly None). ``warnings`` holds the non-fatal problems found while applying.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        config: Config,
        warnings: tuple[str, ...],
        precision: Precision | None,
        undo: list[Callable[[], Any]],
        original_optimizer: torch.optim.Optimizer | None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.warnings = warnings
        self._precision = precision
        self._undo = undo
        self._original_optimizer = original_optimizer
        self._reverted = False

    def __repr__(self) -> str:
        state = "reverted" if self._reverted else "active"
        return f"<Applied {self.config} on {type(self.model).__name__} ({state})>"

    @property
    def reverted(self) -> bool:
        """Whether ``revert()`` has run."""
        return self._reverted

    def _check_active(self, what: str) -> None:
        if self._reverted:
            raise RuntimeError(f"{what}() after revert(): this configuration is no longer applied")

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context for the forward pass: ``torch.autocast`` for *-autocast, else a no-op."""
        self._check_active("autocast")
        if self._precision is None:
            return contextlib.nullcontext()
        return self._precision.autocast()

    def grad_mode(self) -> contextlib.AbstractContextManager[Any]:
        """The context for an inference step's forward: ``torch.inference_mode()`` with
        ``inference_mode``, else a no-op (autograd records as the user's code has it)."""
        self._check_active("grad_mode")
        return torch.inference_mode() if self.config.inference_mode else contextlib.nullcontext()

    def micro_batches(self, batch: Any) -> list[Any]:
        """The batch as the step's micro-batches: itself, or ``accumulate`` equal views of it."""
        self._check_active("micro_batches")
        return micro_batches(batch, self.config.accumulate)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` (divided by ``accumulate``: one micro-batch's share), through
        the GradScaler for fp16-autocast."""
        self._check_active("backward")
        if self.config.accumulate > 1:
            loss = loss / self.config.accumulate
        scaler = self._precision.scaler if self._precision is not None else None
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()

    def step(self) -> None:
        """Optimizer step (through the GradScaler for fp16-autocast), then ``zero_grad(set_to_none=True)``."""
        self._check_active("step")
        if self.optimizer is None:
            raise RuntimeError(
                "no optimizer to step: pass optimizer_obj=..., or optimizer='adamw' (one of OPTIMIZERS)"
            )
        scaler = self._precision.scaler if self._precision is not None else None
        if scaler is None:
            self.optimizer.step()
        else:
            scaler.step(self.optimizer)
            scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def revert(self) -> None:
        """Undo everything, in reverse order; idempotent. The original optimizer comes back."""
        if self._reverted:
            return
        problems: list[str] = []
        while self._undo:
            result = self._undo.pop()()
            problems.extend(result or ())
        self.optimizer = self._original_optimizer
        self._precision = None
        self._reverted = True
        for message in problems:
            _warnings.warn(message, stacklevel=2)


def _apply(
    model: nn.Module, config: Config, optimizer_obj: torch.optim.Optimizer | None, stacklevel: int
) -> Applied:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer_obj is not None and not isinstance(optimizer_obj, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer_obj must be a torch.optim.Optimizer or None, got {type(optimizer_obj).__name__}"
        )
    # Everything that can fail on user input is checked before the model is touched.
    check_group(config)
    targets: list[str] = []
    if config.checkpoint is not None:
        targets = checkpoint_targets(model, config.checkpoint, config.every)
        if not targets:
            names = ", ".join(name for name, _ in list(model.named_modules())[1:6])
            raise ValueError(
                f"checkpoint={config.checkpoint!r} matches no module (names look like: {names}). {CHECKPOINT_HELP}"
            )
    offloaded = [] if config.offload is None else offload_targets(model, config.offload)
    found: list[str] = []
    new_optimizer = None
    trained_by = config.optimizer
    if config.lora is not None and trained_by is None:
        trained_by = optimizer_name(optimizer_obj)  # the user's algorithm, over the adapters
        if trained_by not in OPTIMIZERS:
            raise ValueError(
                f"lora trains its adapters with the optimizer's algorithm, and {trained_by!r} is "
                f"not one of {', '.join(OPTIMIZERS)}: name one with optimizer="
            )
    if config.optimizer is not None and config.lora is None:
        new_optimizer, found = build_optimizer(config.optimizer, model, optimizer_obj)
    undo: list[Callable[[], Any]] = []
    precision = None
    try:
        if config.lora is not None:
            lora = Lora(model, config.lora)
            undo.append(lora.revert)
            assert trained_by is not None
            new_optimizer, more = build_optimizer(trained_by, model, None)  # the adapters alone
            found.extend(more)
        if new_optimizer is not None and optimizer_obj is not None:
            undo.append(ParkedState(optimizer_obj).revert)
        if config.precision is not None:
            in_use = new_optimizer if new_optimizer is not None else optimizer_obj
            precision = Precision(model, config.precision, in_use)
            undo.append(precision.revert)
            found.extend(precision.warnings)
        if targets:
            checkpointing = Checkpointing(model, targets)
            undo.append(checkpointing.revert)
            found.extend(checkpointing.warnings)
        if offloaded:  # its hooks wrap the checkpointed forwards (see techniques.offloading)
            offloading = Offloading(model, offloaded)
            undo.append(offloading.revert)
            found.extend(offloading.warnings)
    except BaseException:
        while undo:
            undo.pop()()
        raise
    optimizer = new_optimizer if new_optimizer is not None else optimizer_obj
    if config.parallel is not None:
        # a wrapped or sharded model stays so: it is a model used for this alone
        ranked = parallelize(model, optimizer, config)
        for replaced in {id(o): o for o in (optimizer, optimizer_obj) if o is not None}.values():
            if replaced is not ranked.optimizer:  # FSDP2 frees what it replaced once unheld
                replaced.param_groups.clear()
                replaced.state.clear()
        model, optimizer, undo = ranked.model, ranked.optimizer, []
        found.extend(ranked.warnings)
    for message in found:
        _warnings.warn(message, stacklevel=stacklevel)
    return Applied(model, optimizer, config, tuple(found), precision, undo, optimizer_obj)


def apply(
    model: nn.Module,
    *,
    checkpoint: str | tuple[str, ...] | list[str] | None = None,
    every: int = 1,
    precision: str | None = None,
    optimizer: str | None = None,
    optimizer_obj: torch.optim.Optimizer | None = None,
) -> Applied:
    """Apply techniques to ``model`` in place; ``revert()`` on the result undoes them exactly.

    ``checkpoint``: "blocks", a regex over qualified module names or a tuple of names (see
    CHECKPOINT_HELP); ``precision``: one of PRECISIONS; ``optimizer``: one of OPTIMIZERS,
    built over ``optimizer_obj``'s param groups (or the model's parameters).
    """
    config = Config(checkpoint=checkpoint, every=every, precision=precision, optimizer=optimizer)  # type: ignore[arg-type]  # lists become tuples
    return _apply(model, config, optimizer_obj, stacklevel=3)


def apply_config(
    model: nn.Module, config: Config, optimizer_obj: torch.optim.Optimizer | None = None
) -> Applied:
    """``apply`` with the settings of ``config``."""
    if not isinstance(config, Config):
        raise TypeError(
            f"config must be a jupyter_gpumem.techniques.Config, got {type(config).__name__}"
        )
    return _apply(model, config, optimizer_obj, stacklevel=3)
