"""The staging buffers of CUDA's reduction kernels: what a ``sum`` or ``mean`` allocates while it runs.

ATen's reduction kernel (``ATen/native/cuda/Reduce.cuh``, ``setReduceConfig`` and
``gpu_reduce_kernel``, torch 2.4 to 2.13) splits a long reduction across thread blocks when
each thread would otherwise sum 256 values or more and the outputs leave the GPU's
multiprocessors idle. The blocks then meet in global memory: a buffer of accumulators and a
semaphore per column of blocks, taken from the caching allocator after the output and given back
when the kernel has been launched. A bias's gradient is such a reduction (the batch's rows
summed per feature), and its buffer is large: 132 MiB for a (25088, 768) bf16 gradient on an H200.
The size follows from the shapes, the strides and the device's multiprocessors alone, so it is
computed here as the kernel computes it, through the dimensions as ``TensorIterator`` orders and
coalesces them.

Measured on an H200 (132 multiprocessors, 2,048 threads each, torch 2.11), allocated while the
op ran beyond what it held before and after (``bench/op_transients.py``): a (25088, 768) and a
(6304, 3072) bf16 column sum 138,412,544 B each, a (2048, 32000) one 147,457,024 B, a
(32, 28, 28, 192) fp32 sum over its first three dimensions 38,535,168 B plus its semaphores.

The sizes are pure (:func:`iteration`, :func:`global_buffers`); :func:`buffers` makes them,
fake, for an op of the fake step on CUDA or on the stand-in device (:mod:`.cuda_like`).

Known limitations:
- ``sum`` and ``mean`` only; other reductions (``amax``, ``var``, ``norm``, ...) share the
  kernel with other accumulators and are not modelled.
- A tensor too large for 32-bit indexing is reduced in parts, each with its own configuration:
  not modelled (no buffer is added).
- The input's data pointer is taken to be aligned to four elements unless its storage offset
  says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.tuner.estimation.cuda_like import Multiprocessors, multiprocessors

WARP = 32
MAX_THREADS = 512  # mnt_wrapper's, every type but complex double
VECTOR = 4  # ReduceConfig::input_vec_size, and the widest output vector
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Iteration:
    """A reduction's dimensions as ``TensorIterator`` hands them to the kernel: fastest first,
    the reduced ones in front, neighbours that index alike coalesced."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]  # the input's, in elements
    reduced: int  # how many of the leading dimensions are reduced

    @property
    def outputs(self) -> int:
        n = 1
        for size in self.shape[self.reduced :]:
            n *= size
        return n

    @property
    def inputs_per_output(self) -> int:
        n = 1
        for size in self.shape[: self.reduced]:
            n *= size
        return n


def iteration(shape: Sequence[int], strides: Sequence[int], dims: Sequence[int]) -> Iteration:
    """The kernel's view of reducing ``dims`` of a tensor of ``shape`` and ``strides``."""
    ndim = len(shape)
    reduced = {d % ndim for d in dims} if dims else set(range(ndim))
    kept = [d for d in range(ndim) if shape[d] != 1]
    # reduced dimensions first, each group by the input's strides, smallest first (a tie: the
    # smaller size first, then the later dimension, as reorder_dimensions leaves it)
    order = sorted(kept, key=lambda d: (d not in reduced, strides[d], shape[d], -d))
    out_stride: dict[int, int] = {}
    step = 1
    for d in sorted((d for d in kept if d not in reduced), reverse=True):
        out_stride[d] = step  # the output, contiguous over the dimensions kept
        step *= shape[d]
    dims_out: list[list[int]] = []  # [size, input stride, output stride]
    for d in order:
        size, stride, o = shape[d], strides[d], out_stride.get(d, 0)
        if dims_out:
            last = dims_out[-1]
            if last[0] * last[1] == stride and last[0] * last[2] == o:
                last[0] *= size
                continue
        dims_out.append([size, stride, o])
    n_reduced = sum(1 for _, _, o in dims_out if o == 0)
    return Iteration(tuple(s for s, _, _ in dims_out), tuple(s for _, s, _ in dims_out), n_reduced)


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def _output_vector(it: Iteration, offset: int) -> int:
    """get_output_vec_size: the widest vector that the base, the output dimension and every
    other stride are multiples of."""
    vec = VECTOR
    for n in (
        offset,
        it.shape[it.reduced],
        *(s for i, s in enumerate(it.strides) if i != it.reduced),
    ):
        while n % vec:
            vec //= 2
    return vec


def global_buffers(
    it: Iteration, itemsize: int, accumulator: int, sms: Multiprocessors, offset: int = 0
) -> tuple[int, int] | None:
    """(the accumulators' buffer, the semaphores) in bytes that the kernel allocates for
    ``it`` over ``itemsize``-byte inputs with ``accumulator``-byte partial sums; None where it
    reduces within each block (or splits the tensor for 32-bit indexing, not modelled)."""
    outputs, per_output = it.outputs, it.inputs_per_output
    if outputs * per_output == 0 or outputs * per_output > INT32_MAX:
        return None
    if it.reduced == 0 or not it.shape:
        return None
    fastest = it.reduced == len(it.shape) or it.strides[0] < it.strides[it.reduced]
    if fastest:
        dim0, dim1, moving = per_output, outputs, it.strides[0]
    else:
        dim0, dim1, moving = outputs, per_output, it.strides[it.reduced]
    output_vec = 1
    if moving == 1:
        if fastest and dim0 > 128 and it.reduced == 1:
            dim0 //= VECTOR  # vectorised along the input
        elif not fastest:
            output_vec = _output_vector(it, offset)
            dim0 //= output_vec
    limit = MAX_THREADS // output_vec
    dim0_pow2 = _last_pow2(dim0) if dim0 < limit else limit
    dim1_pow2 = _last_pow2(dim1) if dim1 < limit else limit
    width = min(dim0_pow2, WARP)
    height = min(dim1_pow2, limit // width)
    width = min(dim0_pow2, limit // height)
    threads = width * height
    step_in = step_out = 1
    x_reduce = fastest
    if fastest:
        step_in *= width
    else:
        step_out *= width
    y_reduce = False
    values = _div_up(per_output, step_in)
    if values >= height * MIN_VALUES_PER_THREAD or values >= MAX_VALUES_PER_THREAD:
        step_in *= height
        y_reduce = True
    else:
        step_out *= height
    target = sms.count * (sms.threads_each // threads)
    grid = _div_up(outputs // output_vec, step_out)
    values = _div_up(per_output, step_in)
    if not (y_reduce and values >= MAX_VALUES_PER_THREAD and grid <= target):
        return None
    ctas = max(
        min(_div_up(target, grid), _div_up(values, MIN_VALUES_PER_THREAD)),
        _div_up(values, MAX_VALUES_PER_THREAD),
    )
    if ctas <= 1:
        return None
    size = accumulator * outputs * ctas
    if not x_reduce:
        size *= width * output_vec
    return size, 4 * grid


# -- the ops ------------------------------------------------------------------------------------
_REDUCTIONS = frozenset({"sum.dim_IntList", "sum.default", "mean.dim", "mean.default"})


def buffers(
    torch: Any, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None
) -> list[Any]:
    """The buffers ``func``'s CUDA reduction kernel allocates after its output, made (fake) in
    that order; none for other ops and devices."""
    found = sizes(torch, func, args, kwargs)
    return [torch.empty(n, dtype=torch.uint8, device=args[0].device) for n in found]


def sizes(
    torch: Any, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None
) -> tuple[int, ...]:
    """The bytes of each buffer :func:`buffers` makes, in order; none for other ops and
    devices."""
    if getattr(func, "__name__", None) not in _REDUCTIONS or not args:
        return ()
    x = args[0]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():  # complex is not floating
        return ()
    sms = multiprocessors(torch, x.device)
    if sms is None:
        return ()
    dims: Any = None  # every dimension
    if func.__name__ in ("sum.dim_IntList", "mean.dim"):
        dims = args[1] if len(args) > 1 else (kwargs or {}).get("dim")
    dims = (dims,) if isinstance(dims, int) else tuple(dims or ())
    dtype = (kwargs or {}).get("dtype") or x.dtype
    accumulator = 8 if dtype == torch.float64 else 4  # acc_type: double, else float
    found = global_buffers(
        iteration(tuple(x.shape), tuple(x.stride()), dims),
        x.element_size(),
        accumulator,
        sms,
        x.storage_offset(),
    )
    return () if found is None else tuple(found)
