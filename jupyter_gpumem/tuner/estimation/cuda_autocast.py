"""CUDA's autocast policy, applied on the stand-in device of an estimate made without CUDA.

``torch.autocast("cuda")`` decides per op what runs in bf16/fp16 and what in fp32: its kernels
are registered at the ``AutocastCUDA`` dispatch key by ``aten/src/ATen/autocast_mode.cpp``. A
CPU-only torch has those kernels too, but they cast only tensors on a CUDA device, and the CPU's
own policy (``AutocastCPU``) differs: it keeps ``layer_norm``, ``softmax``, ``sum`` and the
losses in the input's dtype where CUDA runs them in fp32, which changes what a step holds.

The table below is CUDA's policy as ``autocast_mode.cpp`` lists it (torch 2.11 and 2.13: the
ops with an ``AutocastCUDA`` kernel are the same 119); :func:`register` installs it at the
stand-in device's autocast key (``AutocastPrivateUse1``), each op casting as CUDA's does,
weights' casts cached until the outermost autocast region ends. An op that this torch
autocasts on CUDA and the table does not name runs uncast, and :func:`unlisted` names it.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

# lower_precision_fp: floating inputs cast to the autocast dtype
LOWER = (
    "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "cudnn_convolution", "cudnn_convolution_transpose", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm",
    "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)  # fmt: skip
# fp32: floating inputs cast to float32
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "group_norm", "rms_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)  # fmt: skip
# fp32_set_opt_dtype: run with dtype=float32 where the first input is eligible and none is given
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)  # fmt: skip
# fp32_append_dtype: the overload that takes a dtype, called with float32
FP32_APPEND_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}
# promote: floating inputs cast to the widest floating dtype among them
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add",
)  # fmt: skip
BANNED = ("binary_cross_entropy",)  # refused under autocast, as CUDA refuses it

_KEY = "AutocastPrivateUse1"


def listed() -> frozenset[str]:
    """Every op the table names, as ``aten::name[.overload]``."""
    names = (*LOWER, *FP32, *FP32_SET_OPT_DTYPE, *FP32_APPEND_DTYPE, *PROMOTE, *BANNED)
    return frozenset(f"aten::{n}" for n in names)


def cuda_autocast_ops(torch: Any) -> frozenset[str]:
    """The ops this torch autocasts on CUDA: those with a kernel at ``AutocastCUDA``."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return frozenset(n for n in torch._C._dispatch_get_all_op_names() if has(n, "AutocastCUDA"))


def unlisted(torch: Any) -> tuple[str, ...]:
    """Ops this torch autocasts on CUDA that the table does not name (they run uncast here)."""
    return tuple(sorted(cuda_autocast_ops(torch) - listed()))


class CastCache:
    """Autocast's cache of cast weights: a leaf fp32 tensor that requires grad is cast to the
    autocast dtype once per outermost autocast region, as ``cached_cast`` caches it."""

    def __init__(self) -> None:
        self._casts: dict[int, tuple[weakref.ref[Any], Any]] = {}

    def get(self, t: Any, make: Callable[[], Any]) -> Any:
        hit = self._casts.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        cast = make()
        self._casts[id(t)] = (weakref.ref(t), cast)
        return cast

    def clear(self) -> None:
        self._casts.clear()


@functools.cache
def register(torch: Any, device_type: str) -> CastCache:
    """Install the table at the stand-in device's autocast key (once per process) and return
    the cache of cast weights, cleared where torch clears its own."""
    cache = CastCache()
    excluded = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def eligible(t: Any) -> bool:
        return (
            isinstance(t, torch.Tensor)
            and t.is_floating_point()
            and t.dtype is not torch.float64
            and t.device.type == device_type
        )

    def cast(value: Any, dtype: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return type(value)(cast(v, dtype) for v in value)
        if not eligible(value) or value.dtype is dtype:
            return value
        cacheable = (
            dtype is torch.get_autocast_dtype(device_type)
            and value.dtype is torch.float32
            and value.requires_grad
            and value.is_leaf
            and not value._is_view()
            and torch.is_autocast_cache_enabled()
        )
        if cacheable:
            return cache.get(value, lambda: value.to(dtype))
        return value.to(dtype)

    def tensors(args: Any, kwargs: Any) -> Iterator[Any]:
        for v in (*args, *kwargs.values()):
            if isinstance(v, (list, tuple)):
                yield from (x for x in v if eligible(x))
            elif eligible(v):
                yield v

    def casting(op: Any, policy: str) -> Callable[..., Any]:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(excluded):
                if policy == "banned":
                    raise RuntimeError(
                        f"{op.name()} is unsafe to autocast (as on CUDA): use "
                        "binary_cross_entropy_with_logits, or run it in float32"
                    )
                if policy == "set_opt_dtype":
                    if args and eligible(args[0]):
                        args, kwargs = _with_dtype(op, args, kwargs, torch.float32)
                    return op(*args, **kwargs)
                if policy == "append_dtype":
                    return _appended(torch, op)(*cast(args, torch.float32), dtype=torch.float32)
                if policy == "lower":
                    dtype = torch.get_autocast_dtype(device_type)
                elif policy == "fp32":
                    dtype = torch.float32
                else:  # promote: from the autocast dtype through every eligible input's
                    dtype = torch.get_autocast_dtype(device_type)
                    for t in tensors(args, kwargs):
                        dtype = torch.promote_types(dtype, t.dtype)
                args = cast(args, dtype)
                kwargs = {k: cast(v, dtype) for k, v in kwargs.items()}
                return op(*args, **kwargs)

        return kernel

    lib = torch.library.Library("aten", "IMPL")
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, _KEY)
    policies = [
        *((n, "lower") for n in LOWER),
        *((n, "fp32") for n in FP32),
        *((n, "set_opt_dtype") for n in FP32_SET_OPT_DTYPE),
        *((n, "append_dtype") for n in FP32_APPEND_DTYPE),
        *((n, "promote") for n in PROMOTE),
        *((n, "banned") for n in BANNED),
    ]
    for name, policy in policies:
        op = _op(torch, name)
        if op is not None:
            lib.impl(name, casting(op, policy), _KEY)
    register.libraries = (lib, fallthrough)  # type: ignore[attr-defined]  # kept alive
    return cache


def _op(torch: Any, name: str) -> Any:
    """``torch.ops.aten.<name>`` for ``name`` as ``op[.overload]``; None where this torch lacks it."""
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _with_dtype(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: Any) -> Any:
    """(args, kwargs) with ``dtype`` as the op's ``dtype`` argument, where none is given."""
    at = next(i for i, a in enumerate(op._schema.arguments) if a.name == "dtype")
    if len(args) > at:
        if args[at] is None:
            args = (*args[:at], dtype, *args[at + 1 :])
    elif kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": dtype}
    return args, kwargs


def _appended(torch: Any, op: Any) -> Any:
    """The overload of ``op`` that takes a dtype (FP32_APPEND_DTYPE)."""
    name = op.name().removeprefix("aten::")
    return _op(torch, FP32_APPEND_DTYPE[name])
