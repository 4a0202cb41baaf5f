"""GPUs by name: what an estimate needs to know of a card the user may not have.

A card's capacity is the memory CUDA reports as total (``torch.cuda.get_device_properties
().total_memory``, close to nvidia-smi's ``memory.total``): measured here for the H100 and
H200; for the others nvidia-smi's figure with ECC as the card ships (the sources column).
What the allocator adds per card is torch's cuBLAS/cuBLASLt workspace, whose size torch
picks by architecture (32 MiB per handle from Hopper on, 4 MiB x 2 + 16 KiB x 8 before:
``CUBLAS_WORKSPACE_CONFIG``'s defaults); the estimate measures the present card's and scales
it to the target's. The CUDA context depends mostly on the libraries loaded, so the present
card's measured context stands for the target's, and the estimate says so. The multiprocessors
and their threads (the vendor's specifications; the H100's are the SXM part's, 114 on PCIe)
size CUDA's reduction buffers (:mod:`.reduce_buffers`) where an estimate is made without CUDA;
the L2 cache (the vendor's figure, the H200's as CUDA reports it) sizes the buffer Inductor's
benchmarks flush (:mod:`.graph_pool`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MiB = 2**20
HOPPER_WORKSPACE = 32 * MiB  # per cuBLAS handle, compute capability 9.0 and later
EARLIER_WORKSPACE = 2 * 4 * MiB + 8 * 16 * 1024  # ":4096:2:16:8"


@dataclass(frozen=True)
class Card:
    """One GPU model: its capacity and what decides its library workspaces."""

    name: str
    total_bytes: int
    capability: tuple[int, int]
    source: str
    aliases: tuple[str, ...] = ()
    # what CUDA's reduction kernels size their staging buffers by (the SXM part's for the H100)
    multiprocessors: int = 132
    threads_per_multiprocessor: int = 2048
    # the L2 cache (the vendor's figure; the H200's as CUDA reports it): Inductor's benchmarks
    # of a kernel it compiles flush a buffer this size (:mod:`.graph_pool`)
    l2_cache_bytes: int = 0

    @property
    def bf16(self) -> bool:
        return self.capability >= (8, 0)

    @property
    def workspace_per_handle(self) -> int:
        return HOPPER_WORKSPACE if self.capability >= (9, 0) else EARLIER_WORKSPACE


CARDS: tuple[Card, ...] = (
    Card("H100-80GB", 85_017_493_504, (9, 0), "measured: H100 80GB HBM3 (SXM), torch total_memory",
         ("h100", "h100-sxm", "h100-pcie", "nvidia h100 80gb hbm3"), l2_cache_bytes=50 * MiB),
    Card("H200", 150_109_880_320, (9, 0), "measured: H200 141GB HBM3e (SXM), torch total_memory",
         ("h200-141gb", "nvidia h200"), l2_cache_bytes=60 * MiB),
    Card("A100-80GB", 81_920 * MiB, (8, 0), "nvidia-smi memory.total, A100-SXM4-80GB",
         ("a100-sxm4-80gb", "a100-pcie-80gb"), 108, l2_cache_bytes=40 * MiB),
    Card("A100-40GB", 40_960 * MiB, (8, 0), "nvidia-smi memory.total, A100-SXM4-40GB",
         ("a100", "a100-sxm4-40gb"), 108, l2_cache_bytes=40 * MiB),
    Card("L4", 23_034 * MiB, (8, 9), "nvidia-smi memory.total, ECC on", (), 58, 1536, 48 * MiB),
    Card("A10G", 23_028 * MiB, (8, 6), "nvidia-smi memory.total, ECC on (AWS g5)", (), 80, 1536, 6 * MiB),
    Card("RTX-4090", 24_564 * MiB, (8, 9), "nvidia-smi memory.total", ("4090", "geforce rtx 4090"), 128, 1536, 72 * MiB),
    Card("RTX-3090", 24_576 * MiB, (8, 6), "nvidia-smi memory.total", ("3090", "geforce rtx 3090"), 82, 1536, 6 * MiB),
    Card("T4", 15_360 * MiB, (7, 5), "nvidia-smi memory.total, ECC on", ("tesla t4",), 40, 1024, 4 * MiB),
)  # fmt: skip


def _key(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def card(name: str) -> Card:
    """The card called ``name`` (case and separators ignored); ValueError lists the known ones."""
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"gpu must be a card's name such as 'H100-80GB', got {name!r}")
    key = _key(name)
    for c in CARDS:
        if key == _key(c.name) or key in (_key(a) for a in c.aliases):
            return c
    raise ValueError(
        f"unknown gpu {name!r}; known: {', '.join(c.name for c in CARDS)} "
        "(or leave gpu out for the GPU present)"
    )


def present(name: str, total_bytes: int, capability: tuple[int, int]) -> Card:
    """The card this process runs on, from what CUDA says of it (named as in the table)."""
    try:
        known = card(name).name
    except ValueError:
        known = name
    return Card(known, total_bytes, capability, "the GPU present, as CUDA reports it")
