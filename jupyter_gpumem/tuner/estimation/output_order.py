"""The order in which CUDA kernels allocate their outputs, where it is not the op's.

The caching allocator splits and reuses blocks by the order of requests, so two steps that
allocate the same sizes in another order can reserve different bytes. A fake op makes its
outputs in the order the op returns them; a few CUDA kernels make them otherwise:

- ``native_dropout`` in training (``dropout_cuda`` in ``ATen/native/cuda/Dropout.cu``, torch
  2.4 to 2.13) makes its mask before its output: the bool mask, then the output, as an H200's
  allocator history shows for every dropout of GPT-2 and DeBERTa-v3 (``bench/op_order.py``).

On the stand-in device (:mod:`.cuda_like`) they are made as on CUDA.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpumem.tuner.estimation.cuda_like import multiprocessors


def in_cuda_order(torch: Any, func: Any, args: tuple[Any, ...], out: Any) -> Any:
    """``func``'s outputs ``out`` in the order its CUDA kernel allocates them."""
    if func is not torch.ops.aten.native_dropout.default or not isinstance(out, tuple):
        return out
    p = args[1] if len(args) > 1 else None
    train = args[2] if len(args) > 2 else None
    if not isinstance(p, float) or not 0 < p < 1 or train is False:
        return out
    if multiprocessors(torch, args[0].device) is None:
        return out
    return (out[1], out[0])
