"""CUDA's scaled-dot-product attention, on the stand-in device of an estimate made without CUDA.

On CUDA, ``F.scaled_dot_product_attention`` picks a kernel (``sdp_utils.cpp``) and what it keeps
for backward follows from the pick: flash and memory-efficient attention keep the output and an
fp32 log-sum-exp per row (the efficient kernel's rows padded to 32), never the score matrix; the
math fallback keeps the scores and their softmax. On a device of its own torch takes the math
path, so the stand-in device installs CUDA's pick (:func:`backend`, the rules below for
compute capability 8.0 and later, torch 2.4 to 2.13: flash first, then memory-efficient, then
math) and calls the kernel it picks, whose fake kernels make CUDA's shapes. A mask that requires
grad (a learned position bias) with dropout takes the math path; without dropout, the efficient
kernel. So they measured on an H200 (torch 2.11): T5 in bf16 autocast, dropout 0.1,
8,682,075,648 B measured, 8,681,551,360 B estimated so without CUDA (6,213,219,840 B with the
efficient kernel); Swin in fp32, no dropout, as its estimate with the efficient kernel (-0.26%;
+3.0% with the math path).

What the pick does to its inputs is made as CUDA makes it (``attention.cpp``): a boolean mask
becomes an additive one in the query's dtype; the efficient kernel's mask is padded by 8 columns'
worth where its strides are not multiples of 8, then expanded to four dimensions; flash pads
the head dimension to a multiple of 8.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

FLASH_DTYPES = ("float16", "bfloat16")
FLASH_MAX_HEAD_DIM = 256
EFFICIENT_ALIGNMENT = 8  # the efficient kernel's mask: its strides, in elements
_INSTALLED: dict[str, Callable[..., Any]] = {}  # device type -> its attention kernel


def whole_op_kernel(torch: Any, func: Any, args: tuple[Any, ...]) -> Callable[..., Any] | None:
    """The kernel to run for ``func`` where it reaches a dispatch mode whole (under
    ``inference_mode`` the autograd key that takes it is skipped): the installed attention
    kernel for tensors on the stand-in device; None otherwise."""
    if not _INSTALLED or func is not torch.ops.aten.scaled_dot_product_attention.default:
        return None
    return _INSTALLED.get(getattr(getattr(args[0], "device", None), "type", ""))


def backend(
    torch: Any, q: Any, k: Any, v: Any, mask: Any, enable_gqa: bool, dropout_p: float = 0.0
) -> str:
    """The kernel CUDA picks: "flash", "efficient" or "math"."""
    four_d = q.dim() == 4 and k.dim() == 4 and v.dim() == 4
    same_heads = q.size(-3) == k.size(-3) == v.size(-3) if four_d else False
    head_dim = q.size(-1)
    if (
        four_d
        and mask is None
        and str(q.dtype).removeprefix("torch.") in FLASH_DTYPES
        and q.dtype == k.dtype == v.dtype
        and head_dim <= FLASH_MAX_HEAD_DIM
        and k.size(-1) == head_dim == v.size(-1)
        and (same_heads or enable_gqa)
    ):
        return "flash"
    alignment = 16 // q.element_size()
    learned = mask is not None and mask.requires_grad and torch.is_grad_enabled()
    if (
        not (learned and dropout_p > 0)
        and four_d
        and same_heads
        and q.dtype == k.dtype == v.dtype
        and q.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and head_dim % alignment == 0
        and v.size(-1) % alignment == 0
    ):
        return "efficient"
    return "math"


@functools.cache
def register(torch: Any, device_type: str) -> None:
    """Install CUDA's pick for ``scaled_dot_product_attention`` on the stand-in device (once)."""
    aten = torch.ops.aten

    def sdpa(
        query: Any,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Any:
        pick = backend(torch, query, key, value, attn_mask, enable_gqa, dropout_p)
        mask = _additive(torch, attn_mask, query.dtype)
        if pick == "flash":
            padded = [_pad_last(torch, t, 8) for t in (query, key, value)]
            scale = 1 / math.sqrt(query.size(-1)) if scale is None else scale
            out = aten._scaled_dot_product_flash_attention(
                *padded, dropout_p, is_causal, False, scale=scale
            )[0]
            return out[..., : query.size(-1)] if out.size(-1) != query.size(-1) else out
        if pick == "efficient":
            if mask is not None:
                mask = _efficient_mask(torch, mask, query, key)
            grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            return aten._scaled_dot_product_efficient_attention(
                query, key, value, mask, grad, dropout_p, is_causal, scale=scale
            )[0]
        kwargs = {"scale": scale}
        if enable_gqa:
            kwargs["enable_gqa"] = True
        return aten._scaled_dot_product_attention_math(
            query, key, value, mask, dropout_p, is_causal, None, **kwargs
        )[0]

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("scaled_dot_product_attention", sdpa, "AutogradPrivateUse1")
    _INSTALLED[device_type] = sdpa
    register.library = lib  # type: ignore[attr-defined]  # kept alive


def _additive(torch: Any, mask: Any, dtype: Any) -> Any:
    """A boolean mask as CUDA's kernels take it: 0 where attended, -inf elsewhere."""
    if mask is None or mask.dtype is not torch.bool:
        return mask
    return torch.where(mask, 0.0, torch.full((), -math.inf, dtype=dtype, device=mask.device))


def _pad_last(torch: Any, t: Any, multiple: int) -> Any:
    """``t`` with its last dimension padded to ``multiple`` (flash's head dimension)."""
    extra = -t.size(-1) % multiple
    return t if not extra else torch.nn.functional.pad(t, (0, extra))


def _efficient_mask(torch: Any, mask: Any, query: Any, key: Any) -> Any:
    """The efficient kernel's mask: padded where its strides are not aligned, then expanded."""
    aligned = mask.stride(-1) == 1 and all(s % EFFICIENT_ALIGNMENT == 0 for s in mask.stride()[:-1])
    if not aligned:
        columns = mask.size(-1)
        extra = EFFICIENT_ALIGNMENT - columns % EFFICIENT_ALIGNMENT
        mask = torch.nn.functional.pad(mask, (0, extra))[..., :columns]
    return mask.expand(query.size(0), query.size(1), query.size(2), key.size(2))
