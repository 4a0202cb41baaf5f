"""What a trial runs: the model, its optimizer, a batch, the loss, the device and the step counts.

A training trial's step is ``loss_fn(model, batch)``, its backward and the optimizer step. An
inference trial's step is the forward alone: ``loss_fn(model, batch)`` returns the outputs,
held to the step's end, with no backward and no optimizer; ``Config(inference_mode=True)``
runs it under ``torch.inference_mode()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.tracking.devices import cuda_present
from jupyter_gpumem.units import echoed_kind

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
    inference: bool = False  # forward passes only


INFERENCE_TAKES = "precision, checkpoint, every, offload and inference_mode"
TRAINING_ONLY = ("optimizer", "accumulate", "lora", "parallel", "cpu_offload")


def check_config(workload: Workload, config: Any) -> None:
    """ValueError where ``config`` asks for what the workload's step does not do."""
    if not workload.inference:
        if config.inference_mode:
            raise ValueError(
                "inference_mode=True is for inference trials, Trial(..., inference=True): a "
                "training step needs autograd"
            )
        if config.lora is None:  # LoRA's adapters are trained where the model is frozen
            check_trainable(workload, "a training step")
        return
    default = type(config)()
    changed = [name for name in TRAINING_ONLY if getattr(config, name) != getattr(default, name)]
    if changed:
        raise ValueError(
            f"an inference trial runs forward passes only, and {', '.join(changed)} "
            f"{'changes' if len(changed) == 1 else 'change'} training steps; it takes "
            f"{INFERENCE_TAKES}"
        )


def check_trainable(workload: Workload, what: str) -> None:
    """ValueError, before any step, for a training workload whose model has no parameter
    that requires grad: its backward has nothing to differentiate, and the real step fails."""
    if workload.inference or any(p.requires_grad for p in workload.model.parameters()):
        return
    raise ValueError(
        f"the model has no trainable parameters (none requires grad), so {what} has nothing "
        "to train: for forward passes alone, Trial(..., inference=True); to train it, "
        "unfreeze parameters (model.requires_grad_(True), or some of them)"
    )


def checked_workload(
    model: Any,
    batch: Any,
    loss_fn: LossFn,
    *,
    optimizer: Any,
    warmup: int,
    steps: int,
    device: Any,
    inference: bool = False,
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
    if not isinstance(inference, bool):
        raise TypeError(f"inference is True or False, got {repr(inference)[:40]}")
    if inference and optimizer is not None:
        raise ValueError(
            "an inference trial runs forward passes only, with no optimizer: pass optimizer=None"
        )
    if optimizer is not None:
        _check_optimizer_holds(model, optimizer)
    for name, value, least in (("warmup", warmup, 0), ("steps", steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be a whole number of steps >= {least}, got {value!r}")
    where = _device(torch, model, device)
    return Workload(model, batch, loss_fn, optimizer, where, warmup, steps, inference)


def _check_optimizer_holds(model: Any, optimizer: Any) -> None:
    """ValueError for an optimizer that steps tensors other than the model's parameters: its
    state would not be the model's, and every figure of the trial would be wrong."""
    own = {id(p) for p in model.parameters()}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    foreign = [p for p in held if id(p) not in own]
    if not held or foreign:
        what = (
            "holds no parameters"
            if not held
            else f"holds {len(foreign)} of {len(held)} tensors that are not the model's parameters "
            f"(the first of shape {tuple(foreign[0].shape)})"
        )
        raise ValueError(
            f"the optimizer {what}: build it from this model, e.g. "
            f"{type(optimizer).__name__}(model.parameters(), ...), or pass optimizer=None"
        )


def holds_no_weights(model: Any) -> bool:
    """True for a model built on the meta device: shapes only, no weights anywhere."""
    first = next(model.parameters(), None)
    return first is not None and first.is_meta


def needs_weights(workload: Workload, what: str) -> None:
    """ValueError where ``what`` (a measured run) meets a model that holds no weights."""
    if holds_no_weights(workload.model):
        raise ValueError(
            f"the model's parameters are on the meta device: {what} runs real steps and needs "
            "real weights (load them, or model.to_empty(device=...) and initialise them); "
            "estimate() and max_batch_size() work without them"
        )


def _device(torch: Any, model: Any, device: Any) -> Any:
    tensors = [*model.parameters(), *model.buffers()]
    meta = [t.is_meta for t in tensors]
    if any(meta) and not all(meta):
        raise ValueError(
            f"the model has some parameters on the meta device ({sum(meta)} of {len(meta)} "
            "tensors) and some with weights: build all of it on the meta device to estimate "
            "it, or load every weight to run it"
        )
    if device is None and meta and meta[0]:
        # where it would run: the GPU present, else the CPU
        device = "cuda" if cuda_present(torch) else "cpu"
    elif device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            "device is where the steps would run: 'cuda', 'cuda:1', 'cpu' or a torch.device; "
            f"got {echoed_kind(device)}"
        ) from None
    if device.type == "meta":
        raise ValueError("device must be where the steps would run (cuda or cpu), not meta")
    return indexed(torch, device)


def indexed(torch: Any, device: Any) -> Any:
    """``device`` with its index, as tensors made on it name it (``cuda`` is ``cuda:0``)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        # without initialising CUDA: ranks fork from a kernel that has not, the cheaper way
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        device = torch.device("cuda", index)
    return device
