"""Precision settings applied in place: TF32 switches, autocast, loss scaling and pure casts.

``fp32`` and ``bf16`` cast the floating parameters and buffers (and the optimizer state of
those parameters) through ``tensor.data``, so the Parameter objects, and every optimizer or
hook that holds them, stay the same. The original tensors are kept on the CPU, off the
accelerator, and put back on revert bit for bit. TF32 switches are saved and put back.

Known limitations:
- A cast model gets a forward pre-hook on the root module that casts floating tensors among
  the top-level positional and keyword arguments; nested inputs (dicts of tensors inside a
  list, say) must be cast by the caller.
- The TF32 switches are process-wide: two models tuned at once share them.
- fp16 autocast on the CPU works (torch >= 2.4 has CPU fp16 autocast and a CPU GradScaler)
  but is slow; it is there so that the same code paths can be tested without a GPU.
- Parameters that are views of one another's storage are cast into separate storages.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

_AUTOCAST = {"fp16-autocast": torch.float16, "bf16-autocast": torch.bfloat16}
_CAST = {"fp32": torch.float32, "bf16": torch.bfloat16}
_NEW_API = ("cuda.matmul", "cudnn.conv", "cudnn.rnn")  # torch >= 2.9: backend.fp32_precision


def model_device_type(model: nn.Module) -> str:
    """The device type of the model's first parameter (or buffer); "cpu" for an empty model."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device.type
    return "cpu"


_DTYPE_NAMES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
}


def precision_name(model: nn.Module) -> str | None:
    """The floating point format of the model's parameters ("fp32", "bf16", ...), as built.

    "mixed (fp32, bf16)" when they differ, most parameters first; None without floating
    point parameters. The tuner shows it as the "as is" choice.
    """
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    names = [
        _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))
        for dtype in sorted(counts, key=lambda d: -counts[d])
    ]
    if len(names) > 1:
        return f"mixed ({', '.join(names)})"
    return names[0] if names else None


def _backend(path: str) -> Any:
    obj: Any = torch.backends
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


class MathFlags:
    """The TF32 switches of cuBLAS and cuDNN, saved so that ``restore()`` puts them back.

    Uses whichever API the process already uses: torch raises when the legacy
    ``allow_tf32`` flags are read after the newer ``fp32_precision`` ones were set.
    """

    def __init__(self) -> None:
        self._legacy: tuple[bool, bool, str] | None
        self._new: dict[str, str] | None = None
        try:
            self._legacy = (
                torch.backends.cuda.matmul.allow_tf32,
                torch.backends.cudnn.allow_tf32,
                torch.get_float32_matmul_precision(),
            )
        except RuntimeError:  # the new API is in use; mixing the two raises
            self._legacy = None
            self._new = {path: _backend(path).fp32_precision for path in _NEW_API}

    def set_tf32(self, on: bool) -> None:
        """Allow (or forbid) TF32 in cuBLAS matmuls and cuDNN convolutions."""
        if self._legacy is not None:
            torch.backends.cuda.matmul.allow_tf32 = on
            torch.backends.cudnn.allow_tf32 = on
        else:
            for path in _NEW_API:
                _backend(path).fp32_precision = "tf32" if on else "ieee"

    def restore(self) -> None:
        """Put every switch back as it was when this object was made."""
        if self._legacy is not None:
            matmul, cudnn, precision = self._legacy
            torch.backends.cuda.matmul.allow_tf32 = matmul
            torch.backends.cudnn.allow_tf32 = cudnn
            torch.set_float32_matmul_precision(precision)
        elif self._new is not None:
            for path, value in self._new.items():
                _backend(path).fp32_precision = value


def _park(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.device]:
    """The tensor moved to the CPU (the same tensor if it is there already) and its device."""
    return (tensor if tensor.device.type == "cpu" else tensor.to("cpu")), tensor.device


class Cast:
    """Floating parameters, buffers and those parameters' optimizer state cast to one dtype.

    Reverting puts back every parameter and buffer as it was, so what was learned while the
    cast was active is discarded (the trial compares memory and time, not learning).
    """

    def __init__(
        self, model: nn.Module, dtype: torch.dtype, optimizer: torch.optim.Optimizer | None
    ) -> None:
        self._data: list[tuple[torch.Tensor, torch.Tensor, torch.device]] = []
        self._grads: list[tuple[torch.Tensor, tuple[torch.Tensor, torch.device] | None]] = []
        try:
            self._apply(model, dtype, optimizer)
        except BaseException:
            self.revert()
            raise
        self.changed = bool(self._data)

    def _apply(
        self, model: nn.Module, dtype: torch.dtype, optimizer: torch.optim.Optimizer | None
    ) -> None:
        params = [p for p in model.parameters() if p.is_floating_point() and p.dtype != dtype]
        for p in params:
            # A grad of the old dtype cannot accumulate the new one; it comes back on revert.
            self._grads.append((p, None if p.grad is None else _park(p.grad)))
            p.grad = None
            self._swap(p, dtype)
        cast_buffers = [b for b in model.buffers() if b.is_floating_point() and b.dtype != dtype]
        for buffer in cast_buffers:
            self._swap(buffer, dtype)
        if params or cast_buffers:
            # Other buffers (e.g. BatchNorm's num_batches_tracked) come back with the cast ones.
            cast_ids = {id(b) for b in cast_buffers}
            for buffer in model.buffers():
                if id(buffer) not in cast_ids:
                    self._swap(buffer, buffer.dtype, copy=True)
        if optimizer is not None:  # e.g. Adam's exp_avg must match its parameter's dtype
            for p in params:
                for value in optimizer.state.get(p, {}).values():
                    if not isinstance(value, torch.Tensor):
                        continue
                    if value.dim() and value.is_floating_point():
                        self._swap(value, dtype)
                    else:  # the step count comes back with the moments
                        self._swap(value, value.dtype, copy=True)

    def _swap(self, tensor: torch.Tensor, dtype: torch.dtype, copy: bool = False) -> None:
        original = tensor.data
        kept, device = _park(original)
        self._data.append((tensor, kept, device))
        tensor.data = original.to(dtype, copy=copy)

    def revert(self) -> None:
        """Put the original tensors back, bit for bit, on their devices."""
        while self._data:
            tensor, kept, device = self._data.pop()
            tensor.data = kept.to(device)
        while self._grads:
            p, grad = self._grads.pop()
            p.grad = None if grad is None else grad[0].to(grad[1])


def _input_caster(dtype: torch.dtype) -> Any:
    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            return value.to(dtype)
        return value

    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    return hook


class Precision:
    """One of PRECISIONS applied to a model; ``revert()`` undoes it exactly."""

    def __init__(
        self, model: nn.Module, name: str, optimizer: torch.optim.Optimizer | None
    ) -> None:
        self.name = name
        self.device_type = model_device_type(model)
        self.autocast_dtype = _AUTOCAST.get(name)
        self.warnings: list[str] = []
        self.scaler: torch.amp.GradScaler | None = None
        self._flags: MathFlags | None = None
        self._cast: Cast | None = None
        self._hook: torch.utils.hooks.RemovableHandle | None = None
        if name in ("fp32", "tf32"):
            self._flags = MathFlags()
            self._flags.set_tf32(name == "tf32")
        if name in _CAST:
            try:
                self._cast = Cast(model, _CAST[name], optimizer)
            except BaseException:
                self.revert()  # the TF32 switches of "fp32"
                raise
            if self._cast.changed:
                self._hook = model.register_forward_pre_hook(
                    _input_caster(_CAST[name]), with_kwargs=True
                )
        if name == "fp16-autocast":
            if any(p.dtype == torch.float16 for p in model.parameters() if p.requires_grad):
                self.warnings.append(
                    "fp16-autocast expects fp32 parameters: GradScaler cannot unscale fp16 "
                    "gradients; cast the model to float32 first"
                )
            self.scaler = torch.amp.GradScaler(self.device_type)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` for the autocast precisions, a do-nothing context otherwise."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    def revert(self) -> None:
        """Remove the input hook, restore the tensors and the TF32 switches; idempotent."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._cast is not None:
            self._cast.revert()
            self._cast = None
        if self._flags is not None:
            self._flags.restore()
            self._flags = None
        self.scaler = None
