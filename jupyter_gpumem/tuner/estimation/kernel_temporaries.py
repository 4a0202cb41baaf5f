"""Tensors CUDA kernels make for themselves through ATen, below the ops a fake step sees.

A CUDA kernel that calls another ATen op inside itself allocates that op's output from the
caching allocator and frees it before it returns; a dispatch mode above the kernel never sees
it, so the fake step makes it here, after the op's own output, as the kernel does.

- ``_softmax_backward_data`` (``ATen/native/cuda/SoftMax.cu``, torch 2.4 to 2.13) computes
  ``grad * output`` first: a temporary the size of the gradient, in the product's dtype. On an
  H200 it was DeBERTa-v3's largest temporary of the backward pass: 64 MiB for each
  (4, 16, 512, 512) fp32 softmax (``bench/results/op_transients_h200.json``).

The CPU kernels make none of these; on the stand-in device (:mod:`.cuda_like`) they are made
as on CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from jupyter_gpumem.tuner.estimation.cuda_like import multiprocessors


def temporaries(
    torch: Any, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None
) -> list[Any]:
    """What ``func``'s CUDA kernel allocates after its output and frees before it returns,
    made (fake) in that order; none for other ops and devices."""
    return [
        torch.empty(shape, dtype=dtype, device=args[0].device)
        for shape, dtype in _layouts(torch, func, args)
    ]


def sizes(
    torch: Any, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None
) -> tuple[int, ...]:
    """The bytes of each tensor :func:`temporaries` makes, in order."""
    return tuple(math.prod(shape) * dtype.itemsize for shape, dtype in _layouts(torch, func, args))


def _layouts(torch: Any, func: Any, args: tuple[Any, ...]) -> list[tuple[Any, Any]]:
    """(shape, dtype) of each temporary of ``func``'s kernel on CUDA."""
    if getattr(func, "__name__", None) != "_softmax_backward_data.default" or len(args) < 2:
        return []
    grad, output = args[0], args[1]
    if multiprocessors(torch, grad.device) is None:
        return []
    return [(tuple(grad.shape), torch.promote_types(grad.dtype, output.dtype))]
