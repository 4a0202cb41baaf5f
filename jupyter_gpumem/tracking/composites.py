"""Ops that reach a dispatch mode whole although their kernel is made of other ops.

Under ``torch.inference_mode()`` the autograd keys are skipped, so a CompositeImplicitAutograd
op (``cross_entropy_loss``, ``linear``, ``scaled_dot_product_attention``, ...) comes to a
``TorchDispatchMode`` as one call, and what its kernel allocates in between (the log-softmax
of ``cross_entropy_loss``: a whole logits-sized tensor) is made where the mode cannot see it.
Under autograd the same op is already split into its parts before it reaches the mode. A mode
that records allocations therefore runs such an op as its parts, through itself.
"""

from __future__ import annotations

from typing import Any

_BACKENDS = ("CPU", "CUDA")
_COMPOSITE: dict[Any, bool] = {}  # op overload -> has a CompositeImplicitAutograd kernel


def is_composite(torch: Any, func: Any) -> bool:
    """Whether ``func``'s kernel is a CompositeImplicitAutograd one, made of other ops, and
    the only one it has for the CPU and CUDA."""
    known = _COMPOSITE.get(func)
    if known is None:
        # other namespaces (prim::device, custom ops) keep their own kernels
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        known = _COMPOSITE[func] = (
            getattr(func, "namespace", None) == "aten"
            and has(func.name(), "CompositeImplicitAutograd")
            # a kernel of its own on the device (silu_backward's fused one) runs as it is
            and not any(has(func.name(), key) for key in _BACKENDS)
        )
    return known


def run_as_parts(mode: Any, func: Any, args: Any, kwargs: Any) -> Any:
    """``func``'s composite kernel run with ``mode`` active, so that its parts come back to it;
    NotImplemented where the op has none or its parts cannot run here (a part registered for
    TorchScript alone, such as ``prim::device``): the op then runs whole, as before."""
    try:
        with mode:
            return func.decompose(*args, **(kwargs or {}))
    except RuntimeError as exc:
        if "does not exist" not in str(exc):
            raise
        _COMPOSITE[func] = False
        return NotImplemented
