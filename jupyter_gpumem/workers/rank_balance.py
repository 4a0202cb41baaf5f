"""Ranks side by side: memory on another rank's GPU, a rank above the others, what is not PyTorch's.

The most frequent complaint about DDP is uneven memory across ranks. Its usual causes show in
the ranks' own reports: a rank that also allocated on a GPU that is not its own (tensors made
on ``"cuda"`` or ``"cuda:0"`` before ``torch.cuda.set_device``), and a rank whose peak stands
above the others' (where it differs by category says why). Beside the allocator, each rank's
process holds a CUDA context, NCCL's buffers and library workspaces on its GPU: NVML's figure
minus PyTorch's reserved bytes, named per rank.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from jupyter_gpumem.analysis.breakdown import CATEGORIES
from jupyter_gpumem.report.record import DeviceReport, Report
from jupyter_gpumem.units import format_bytes

ABOVE_SHARE = 0.10  # a rank this much above the others' median peak is pointed out
ABOVE_BYTES = 64 * 2**20  # and by at least this much
_STRAY_BYTES = 2**20  # less than this on another GPU is left alone (a stray scalar)


def rank_notes(ranks: Sequence[Report]) -> tuple[str, ...]:
    """Notes on the ranks of one job: stray allocations, a rank above the others, memory
    outside PyTorch's allocator. Nothing for fewer than two ranks with figures."""
    owned: list[tuple[Report, DeviceReport]] = []
    for r in ranks:
        own = _own(r) if r.rank is not None else None
        if own is not None:
            owned.append((r, own))
    if len(owned) < 2:
        return ()
    notes: list[str] = []
    for report, own in owned:
        notes.extend(_strays(report, own))
    finished = [(r, d) for r, d in owned if r.status == "ok"]  # a failed rank's peak is partial
    if len(finished) >= 2:
        notes.extend(_above(finished))
    outside = [
        f"rank {r.rank} {format_bytes(d.non_torch_bytes)} on {d.device}"
        for r, d in owned
        if d.non_torch_bytes
    ]
    if outside:
        notes.append(
            "outside PyTorch's allocator (CUDA context, NCCL's buffers, library workspaces): "
            + ", ".join(outside)
        )
    return tuple(notes)


def _own(report: Report) -> DeviceReport | None:
    """The rank's own GPU: the CUDA device where it allocated most."""
    cuda = [d for d in report.devices if d.device.startswith("cuda")]
    return max(cuda, key=lambda d: d.peak_allocated_bytes, default=None)


def _strays(report: Report, own: DeviceReport) -> list[str]:
    out = []
    for d in report.devices:
        if d is own or not d.device.startswith("cuda") or d.peak_allocated_bytes < _STRAY_BYTES:
            continue
        out.append(
            f"rank {report.rank} also allocated {format_bytes(d.peak_allocated_bytes)} at its peak "
            f"on {d.device}, not its own {own.device}: tensors made on 'cuda' or '{d.device}' "
            f"before torch.cuda.set_device({own.index}) (that GPU then carries a CUDA context "
            "of this rank's too)"
        )
    return out


def _above(owned: Sequence[tuple[Report, DeviceReport]]) -> list[str]:
    peaks = [d.peak_allocated_bytes for _, d in owned]
    top = max(range(len(owned)), key=lambda i: peaks[i])
    others = peaks[:top] + peaks[top + 1 :]
    median = round(statistics.median(others))
    over = peaks[top] - median
    if over < ABOVE_BYTES or over < ABOVE_SHARE * median:
        return []
    report, device = owned[top]
    line = (
        f"rank {report.rank}'s peak is {format_bytes(over)} above the other ranks' "
        f"({format_bytes(peaks[top])} against {format_bytes(median)} on {device.device})"
    )
    diff = _category_diff(device, [d for i, (_, d) in enumerate(owned) if i != top])
    if diff:
        line += f": most of it {diff}"
    return [line]


def _category_diff(device: DeviceReport, others: Sequence[DeviceReport]) -> str | None:
    if device.breakdown is None or any(d.breakdown is None for d in others):
        return None
    gaps = []
    for category in CATEGORIES:
        mine = device.breakdown.get(category, 0)
        typical = statistics.median(d.breakdown.get(category, 0) for d in others if d.breakdown)
        if mine - typical > 0:
            gaps.append((mine - typical, category))
    if not gaps:
        return None
    gap, category = max(gaps)
    return f"{category.replace('_', ' ')} (+{format_bytes(round(gap))})"
