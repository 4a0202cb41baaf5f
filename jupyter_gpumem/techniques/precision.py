"""Precision settings applied in place: TF32 switches, autocast, loss scaling and pure casts.

``fp32`` and ``bf16`` cast the floating parameters, their gradients, the floating buffers and
the optimizer state of those parameters through ``tensor.data``, so the Parameter objects, tied
weights, and every optimizer or hook that holds them, stay the same. Revert casts what they
hold then back to the dtypes they had, in place: what was trained meanwhile is kept, at the
cast's precision (bf16 keeps 8 significant bits). A value the cast left as it was comes back
bit for bit from a copy kept on the CPU (the tensor itself where it is there already), so
applying and reverting without training changes nothing. TF32 switches are saved and put back.

Known limitations:
- A cast model gets a forward pre-hook on the root module that casts floating tensors among
  the top-level positional and keyword arguments; nested inputs (dicts of tensors inside a
  list, say) must be cast by the caller.
- The TF32 switches are process-wide: two models tuned at once share them.
- fp16 autocast on the CPU works (torch >= 2.4 has CPU fp16 autocast and a CPU GradScaler)
  but is slow; it is there so that the same code paths can be tested without a GPU.
- Parameters that are views of one another's storage are cast into separate storages, and
  stay separate after revert.
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


def _park(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor's values on the CPU (the tensor itself if it is there); None on the meta device."""
    if tensor.is_meta:
        return None
    return tensor if tensor.device.type == "cpu" else tensor.to("cpu")


class _Was:
    """A tensor as the cast found it: the object, its dtype and its values (see `_cast_back`)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.dtype = tensor.dtype
        self.values = _park(tensor.data)


def _cast_back(tensor: torch.Tensor, was: _Was | None, dtype: torch.dtype) -> None:
    """``tensor`` cast to ``dtype`` through ``.data``: its values, except where ``was`` holds the
    values before the cast and the cast has not changed them since (those come back as they
    were). The comparison runs on the CPU, beside the copy: the device holds no more than the
    cast tensor does."""
    data = tensor.data
    if data.dtype == dtype:
        return
    kept = None if was is None or was.tensor is not tensor or was.dtype != dtype else was.values
    if kept is None or kept.shape != data.shape:
        tensor.data = data.to(dtype)
        return
    now = data.to("cpu")
    merged = torch.where(now == kept.to(now.dtype), kept, now.to(dtype))
    tensor.data = merged.to(data.device)


def _moment(value: object) -> bool:
    """An optimizer state tensor that follows its parameter's dtype (not a step count)."""
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.is_floating_point()


class Cast:
    """Floating parameters, their gradients, buffers and optimizer state cast to one dtype.

    ``revert()`` casts the values they hold then back to the dtypes they had, on the same
    tensors: training while the cast was active is kept, at the cast's precision, and what it
    left as it was comes back bit for bit.
    """

    def __init__(
        self, model: nn.Module, dtype: torch.dtype, optimizer: torch.optim.Optimizer | None
    ) -> None:
        self._dtype = dtype
        self._optimizer = optimizer
        self._params: list[tuple[nn.Parameter, _Was, _Was | None]] = []  # with its grad
        self._buffers: list[tuple[nn.Module, str, _Was]] = []  # looked up again on revert
        self._state: dict[int, dict[str, _Was]] = {}  # id(param): its optimizer state
        try:
            self._apply(model, optimizer)
        except BaseException:
            self.revert()
            raise
        self.changed = bool(self._params or self._buffers)

    def _apply(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        dtype = self._dtype
        params = [p for p in model.parameters() if p.is_floating_point() and p.dtype != dtype]
        for p in params:
            state = optimizer.state.get(p, {}) if optimizer is not None else {}
            # e.g. Adam's exp_avg must match its parameter's dtype
            self._state[id(p)] = {k: _Was(v) for k, v in state.items() if _moment(v)}
            grad = p.grad
            self._params.append((p, _Was(p), None if grad is None else _Was(grad)))
            p.data = p.data.to(dtype)
            if grad is not None:
                grad.data = grad.data.to(dtype)  # through .data: p.grad cannot change dtype
            for was in self._state[id(p)].values():
                was.tensor.data = was.tensor.data.to(dtype)
        seen: set[int] = set()
        for module in model.modules():
            for name, buffer in module._buffers.items():
                if buffer is None or id(buffer) in seen:
                    continue
                seen.add(id(buffer))
                if buffer.is_floating_point() and buffer.dtype != dtype:
                    self._buffers.append((module, name, _Was(buffer)))
                    buffer.data = buffer.data.to(dtype)

    def revert(self) -> None:
        """Cast the tensors back to their dtypes, keeping what was trained; idempotent.

        Optimizer state made while the cast was active takes its parameter's dtype.
        """
        while self._buffers:
            module, name, was = self._buffers[-1]
            buffer = module._buffers.get(name)
            if buffer is not None and buffer.dtype == self._dtype:
                _cast_back(buffer, was, was.dtype)
            self._buffers.pop()
        while self._params:
            p, was, grad_was = self._params[-1]
            _cast_back(p, was, was.dtype)
            if p.grad is not None:
                _cast_back(p.grad, grad_was, was.dtype)
            if self._optimizer is not None:
                self._state_back(p, was.dtype)
            self._params.pop()
        self._state.clear()

    def _state_back(self, p: nn.Parameter, dtype: torch.dtype) -> None:
        """``p``'s optimizer state to the dtypes it had, or to ``dtype`` where made since."""
        assert self._optimizer is not None
        before = self._state.get(id(p), {})
        for key, value in self._optimizer.state.get(p, {}).items():
            if _moment(value) and value.dtype == self._dtype:
                was = before.get(key)
                _cast_back(value, was, dtype if was is None else was.dtype)


def _input_caster(dtype: torch.dtype) -> Any:
    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            return value.to(dtype)
        return value

    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    return hook


class Precision:
    """One of PRECISIONS applied to a model; ``revert()`` undoes it (a cast keeps the trained
    values, at its precision)."""

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
        """Remove the input hook, cast the tensors back, restore the TF32 switches; idempotent."""
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
