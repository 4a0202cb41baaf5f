"""A device that behaves as CUDA does for an estimate, on a torch built without CUDA.

Fake CUDA tensors need a CUDA build: on a CPU-only torch, autograd over them aborts the process.
The estimate without CUDA runs its fake step on a device of its own instead, torch's
``PrivateUse1`` backend registered from Python (:data:`NAME`), where torch takes the paths it
takes for CUDA and not the CPU's: fused dropout, foreach and fused optimizer kernels, autocast's
per-op policy (:mod:`.cuda_autocast`), scaled-dot-product attention's kernels
(:mod:`.cuda_attention`), fused kernels where the backend would run an op's parts
(:mod:`.cuda_fused`). What the allocator does with the step's storages is modelled as on a
GPU (:mod:`.allocator_model`), from a fresh process's layout: the library workspaces alone
(:data:`WORKSPACES`).

Registering the backend changes the process for good (torch then reports it as its accelerator),
so it is done only in a process made for the estimate (:mod:`.without_cuda`), never in the
user's kernel.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from jupyter_gpumem.records import ALLOCATED, BlockState, SegmentState
from jupyter_gpumem.tuner.estimation import cards, cuda_like
from jupyter_gpumem.tuner.estimation.allocator_model import CachingAllocator
from jupyter_gpumem.tuner.estimation.fake_peaks import DeviceFacts, WorkspaceBlock

NAME = "cudalike"
MiB = 2**20

# The library workspaces a training step's first matmuls make, by compute capability: cuBLAS's
# per handle (the step's thread and autograd's), and cuBLASLt's. Measured on an H200, torch
# 2.11+cu130: 68,157,440 B in every row of bench/results/model_zoo_h200.json; before Hopper,
# torch's defaults (CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8" per handle), not measured.
WORKSPACES: dict[str, tuple[int, ...]] = {
    "sm90": (cards.HOPPER_WORKSPACE, cards.HOPPER_WORKSPACE, 1 * MiB),
    "before sm90": (cards.EARLIER_WORKSPACE, cards.EARLIER_WORKSPACE, 1 * MiB),
}
# The CUDA context and libraries outside the allocator: NVML's figure for the process minus
# torch's reserved bytes, measured on an H100 80GB (bench/results/estimate_nvidia-h100-x1.json).
CONTEXT_BYTES = 778_043_392


def unavailable(torch: Any) -> str | None:
    """Why this torch cannot estimate without CUDA; None where it can."""
    from torch.utils import backend_registration

    if not hasattr(backend_registration, "_setup_privateuseone_for_python_backend"):
        return (
            f"estimating for a GPU without a CUDA build needs torch 2.7 or later (this is "
            f"{torch.__version__}): pip install -U torch"
        )
    taken = torch._C._get_privateuse1_backend_name()
    if taken not in ("privateuseone", NAME):
        return (
            f"this process has a device backend of its own ({taken!r}) where the estimate "
            "without CUDA needs to register one"
        )
    return None


@functools.cache
def device(torch: Any) -> Any:
    """The stand-in device, registered on first use (only in a process made for it)."""
    from torch.utils.backend_registration import (
        _DummyBackendModule,
        _setup_privateuseone_for_python_backend,
    )

    from jupyter_gpumem.tuner.estimation import cuda_attention, cuda_autocast, cuda_fused

    class _Module(_DummyBackendModule):  # type: ignore[misc]
        def get_amp_supported_dtype(self) -> list[Any]:
            return [torch.float16, torch.bfloat16]

        def is_available(self) -> bool:  # the fake mode then never moves real data there
            return False

    if torch._C._get_privateuse1_backend_name() != NAME:
        _setup_privateuseone_for_python_backend(rename=NAME, backend_module=_Module())
    cache = cuda_autocast.register(torch, NAME)
    cuda_attention.register(torch, NAME)
    cuda_fused.register(torch)
    clear = torch.clear_autocast_cache

    def clear_both() -> None:  # autocast's exit clears its cache: ours with it
        cache.clear()
        clear()

    torch.clear_autocast_cache = clear_both
    return torch.device(NAME, 0)


def aim(card: cards.Card) -> None:
    """The stand-in device's kernels behave as ``card``'s (its reductions' staging buffers)."""
    cuda_like.aim(
        NAME, cuda_like.Multiprocessors(card.multiprocessors, card.threads_per_multiprocessor)
    )


def is_stand_in(device: Any) -> bool:
    """Whether ``device`` is the stand-in device."""
    return getattr(device, "type", None) == NAME


def workspaces(card: cards.Card) -> tuple[int, ...]:
    """The library workspaces' requests on ``card``."""
    return WORKSPACES["sm90" if card.capability >= (9, 0) else "before sm90"]


def facts(card: cards.Card) -> DeviceFacts:
    """What ``card`` adds to every run, from the tables above."""
    sizes = workspaces(card)
    return DeviceFacts(
        name=card.name,
        total_bytes=card.total_bytes,
        capability=card.capability,
        workspace_bytes=sum(sizes),
        context_bytes=CONTEXT_BYTES,
        l2_cache_bytes=card.l2_cache_bytes,
    )


def fresh_layout(card: cards.Card) -> tuple[SegmentState, ...]:
    """A fresh process's segments on ``card``: its library workspaces, allocated."""
    alloc = CachingAllocator(())
    for size in workspaces(card):
        alloc.malloc(size, 0)
    return tuple(
        replace(seg, blocks=tuple(_workspace(b) for b in seg.blocks)) for seg in alloc.layout()
    )


def _workspace(block: BlockState) -> BlockState:
    if block.state != ALLOCATED:
        return block
    return WorkspaceBlock(block.address, block.size, ALLOCATED, block.requested_size)
