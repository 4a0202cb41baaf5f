"""NCCL's own buffers on each rank's GPU: memory outside PyTorch's allocator that a verdict adds.

NCCL allocates its channels' buffers on each rank's GPU when a communicator first runs a
collective, with cudaMalloc, so neither PyTorch's allocator nor a fake step sees them. Their
size is set by NCCL's channels, protocols and the peers a rank talks to, not by the model, so it
is measured once per world size: each rank's NVML figure less its reserved bytes and less the
CUDA context of a fresh process (``bench/nccl_outside.py``). Where the world size was not
measured, the figure of the nearest measured one stands for it, and the verdict says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_gpumem.units import format_bytes

# Per rank, CUDA context excluded: DDP and FSDP2 of GPT-2 124M, NCCL 2.28.9, H100 80GB over NVLink
# (bench/results/nccl_outside_h100x4.json), the larger of the two strategies: 850 MiB on every
# rank at both world sizes.
MEASURED: dict[int, int] = {2: 891_289_600, 4: 891_289_600}
MEASURED_ON = "H100 80GB"


@dataclass(frozen=True)
class NcclShare:
    """What NCCL holds on one rank's GPU, and where the figure comes from."""

    bytes: int
    basis: str


def nccl_share(world_size: int) -> NcclShare | None:
    """NCCL's buffers on each of ``world_size`` ranks; None for one process."""
    if world_size < 2:
        return None
    if world_size in MEASURED:
        return NcclShare(
            MEASURED[world_size], f"measured with {world_size} ranks on {MEASURED_ON}s"
        )
    nearest = min(MEASURED, key=lambda n: (abs(n - world_size), -n))
    return NcclShare(
        MEASURED[nearest],
        f"measured with {nearest} ranks on {MEASURED_ON}s, standing for {world_size}",
    )


def describe(share: NcclShare) -> str:
    return f"NCCL's buffers {format_bytes(share.bytes)} ({share.basis})"
