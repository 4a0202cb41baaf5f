"""Ops that CUDA runs with a kernel of their own, where the stand-in device would run their parts.

An op with a kernel for the CPU and CUDA and a ``CompositeImplicitAutograd`` one for every other
backend runs, on the stand-in device of a torch built without CUDA, as the ops it is made of:
``silu_backward`` as a sigmoid, a fill, a subtraction and three products, each with a tensor of
its own. On CUDA it is one kernel and one output (EfficientNet's estimate made without CUDA
was +1.4% allocated and +20% reserved beside the H200's, which runs it whole). Registering a
kernel for the stand-in's backend makes the dispatcher hand the op whole to the fake mode, as
on CUDA; the kernel itself never runs (fake tensors stop at the fake mode).

:data:`FUSED` is a table, not every op of that kind: ``native_channel_shuffle`` has a CPU kernel
and the composite alone elsewhere, CUDA included. ``tests/unit/test_cuda_fused.py`` keeps the
table equal to what this torch registers.
"""

from __future__ import annotations

from typing import Any

FUSED = ("silu_backward", "mish_backward")  # aten ops with a CUDA kernel and the composite
CPU_ONLY = ("native_channel_shuffle",)  # a CPU kernel and the composite, CUDA included
_LIBRARIES: list[Any] = []  # kept alive: a library's registrations end with it


def register(torch: Any, backend: str = "PrivateUse1") -> None:
    """Make every op of :data:`FUSED` reach the fake mode whole on ``backend`` (once)."""
    if _LIBRARIES:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name in FUSED:
        lib.impl(name, _never(name), backend)
    _LIBRARIES.append(lib)


def _never(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"aten::{name} on the stand-in device runs on fake tensors only")

    return kernel
