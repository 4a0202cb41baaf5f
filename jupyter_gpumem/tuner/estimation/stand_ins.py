"""Stand-ins for ATen ops whose fake kernel refuses what their real kernels run.

``aten._grouped_mm`` (torch 2.8 on, read in 2.13): its meta kernel (``_meta_grouped_mm_common``
in ``torch/_meta_registrations.py``) takes bf16 inputs only, the condition of CUDA's fast path
on sm90 and later. The real kernels, on the CPU and on CUDA, take fp32 and fp16 as well, through
``_grouped_mm_fallback`` (``ATen/native/GroupedMMUtils.h``), which allocates the output alone
(``create_grouped_gemm_output_tensor``) and multiplies group by group into it. transformers'
mixture-of-experts layers call it in the weights' dtype, under autocast too (the op is not
autocast-enabled), so fp32 and autocast steps stopped there. The stand-in checks what the real
kernel checks and makes the output as ATen makes it: rows padded to 16 bytes except on ROCm
builds, a padding the meta kernel leaves out on builds without CUDA.

On CUDA the bf16 path (CUTLASS grouped GEMM) also allocates for itself, while it runs: its
problem descriptions, 60 bytes a group, and a 67,584-byte workspace (measured on an H200,
torch 2.11, 4 and 8 groups from 64 to 16,384 rows, the forward and the weights' gradient alike).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_ALIGNMENT_BYTES = 16  # of the output's rows, and of the inputs' leading strides
_CUTLASS_BYTES_PER_GROUP = 60  # bf16 grouped GEMM on CUDA: each group's problem description
_CUTLASS_WORKSPACE_BYTES = 67_584


def stand_in(torch: Any, func: Any) -> Callable[..., Any] | None:
    """What runs in place of ``func`` on fake tensors; None where its own fake kernel serves."""
    return _stand_ins(torch).get(func)


def kernel_buffers(torch: Any, func: Any, args: tuple[Any, ...], kwargs: Any) -> list[Any]:
    """The buffers ``func``'s CUDA kernel allocates for itself while it runs, made (fake) in
    the order it makes them; none for other ops and devices."""
    if func is not _grouped(torch):
        return []
    mat_a = args[0]
    if mat_a.device.type != "cuda" or mat_a.dtype != torch.bfloat16:
        return []  # the fallback: the output alone
    offs = args[2] if len(args) > 2 else (kwargs or {}).get("offs")
    groups = offs.numel() if offs is not None else mat_a.size(0)
    return [torch.empty(n, dtype=torch.uint8, device=mat_a.device) for n in cutlass_buffers(groups)]


def cutlass_buffers(groups: int) -> tuple[int, int]:
    """Bytes of what the bf16 grouped GEMM on CUDA allocates for ``groups`` groups, in order."""
    return _CUTLASS_BYTES_PER_GROUP * groups, _CUTLASS_WORKSPACE_BYTES


@functools.cache
def _stand_ins(torch: Any) -> dict[Any, Callable[..., Any]]:
    grouped = _grouped(torch)
    return {} if grouped is None else {grouped: functools.partial(grouped_mm_output, torch)}


@functools.cache
def _grouped(torch: Any) -> Any:
    """``aten._grouped_mm.default``; None in a torch before grouped GEMMs."""
    packet = getattr(torch.ops.aten, "_grouped_mm", None)
    return None if packet is None else packet.default


def grouped_mm_output(
    torch: Any,
    mat_a: Any,
    mat_b: Any,
    offs: Any = None,
    bias: Any = None,
    out_dtype: Any = None,
) -> Any:
    """The empty output ``aten._grouped_mm`` allocates for ``mat_a`` and ``mat_b``, after the
    real kernel's checks (``_grouped_mm_validate_inputs``)."""
    _check_matrix(torch, "mat_a", mat_a)
    _check_matrix(torch, "mat_b", mat_b)
    a_2d, b_2d = mat_a.dim() == 2, mat_b.dim() == 2
    if not (a_2d and b_2d):
        torch._check(
            mat_a.size(-1) == mat_b.size(-2),
            lambda: "contraction dimension of mat_a and mat_b must match",
        )
    torch._check(
        (offs is not None) == (a_2d or b_2d),
        lambda: "Have to provide offsets if there is a 2d matrix, none if both are 3d",
    )
    torch._check(bias is None, lambda: "Bias not supported yet")
    dtype = out_dtype or mat_a.dtype
    size: tuple[int, ...]
    torch._check(dtype == mat_a.dtype, lambda: "Grouped gemm output dtype must match `mat_a` dtype")
    if a_2d and b_2d:
        size = (offs.size(0), mat_a.size(0), mat_b.size(1))
    elif a_2d:
        torch._check(offs.size(0) == mat_b.size(0), lambda: "matrix batch sizes have to match")
        size = (mat_a.size(0), mat_b.size(-1))
    elif b_2d:
        torch._check(offs.size(0) == mat_a.size(0), lambda: "matrix batch sizes have to match")
        size = (mat_a.size(1), mat_b.size(1))
    else:
        torch._check(mat_a.size(0) == mat_b.size(0), lambda: "batched dimension has to match")
        size = (mat_a.size(0), mat_a.size(1), mat_b.size(-1))
    if torch.version.hip:
        return torch.empty(size, dtype=dtype, device=mat_a.device)
    per_row = _ALIGNMENT_BYTES // dtype.itemsize
    row = -(-size[-1] // per_row) * per_row
    stride = (row, 1) if len(size) == 2 else (size[1] * row, row, 1)
    return torch.empty_strided(size, stride, dtype=dtype, device=mat_a.device)


def _check_matrix(torch: Any, name: str, mat: Any) -> None:
    """A dtype the real kernels take, 2 or 3 dimensions, row- or column-major in the last two
    with the leading stride a multiple of 16 bytes (``check_valid_strides_and_return_transposed``)."""
    torch._check(
        mat.dtype in (torch.float32, torch.bfloat16, torch.float16),
        lambda: f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {mat.dtype}",
    )
    torch._check(mat.dim() in (2, 3), lambda: f"{name} has to be 2 or 3d")
    rows, cols = mat.shape[-2:]
    row_stride, col_stride = mat.stride()[-2:]
    if row_stride == 1 and col_stride >= max(1, rows):
        leading = col_stride
    elif col_stride == 1 and row_stride >= max(1, cols):
        leading = row_stride
    else:
        raise RuntimeError(
            f"Invalid strides/sizes, got {mat.stride()} for strides and {tuple(mat.shape)} for sizes"
        )
    per_row = _ALIGNMENT_BYTES // mat.element_size()
    torch._check(leading % per_row == 0, lambda: "strides should be multiple of 16 bytes")
