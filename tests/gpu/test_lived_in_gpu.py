"""`%%gpumem` in a kernel that holds many tensors: exact peaks, leak hints, and no layout read
for a cell that never touched the allocator."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

MiB = 2**20

LIVED_IN = """
import torch, torch.nn as nn
dev = torch.device("cuda")
cached = [torch.randn(64 + 64 * (i % 13), device=dev) for i in range(20_000)]
rows = [{"id": i, "text": "sample", "label": i % 3} for i in range(300_000)]
model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(8)]).to(dev)
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(4, 512, device=dev)).sum().backward()
opt.step()
opt.zero_grad(set_to_none=True)
"""


@pytest.fixture
def ip(shell: InteractiveShell) -> Iterator[InteractiveShell]:
    gc.collect()
    assert shell.run_cell(LIVED_IN).success
    from jupyter_gpumem.held.namespace_scan import SCAN_BUDGET

    for _ in range(20_000 // SCAN_BUDGET + 2):  # the namespace scan finishes its tensor list
        assert shell.run_cell("%%gpumem --quiet\n_z = 1").success
    yield shell


@pytest.fixture
def snapshots(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per read of the allocator's layout."""
    import torch

    calls: list[int] = []
    original = torch.cuda.memory._snapshot

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.cuda.memory, "_snapshot", counted)
    return calls


def measured(ip: InteractiveShell, body: str) -> Any:
    import torch

    gc.collect()  # garbage of earlier tests freed inside a cell would move the allocator
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    assert ip.run_cell("%%gpumem -o r --quiet\n" + body).success
    report = ip.user_ns["r"]
    (device,) = report.devices
    assert device.peak_allocated_bytes == torch.cuda.max_memory_allocated()
    assert device.peak_reserved_bytes == torch.cuda.max_memory_reserved()
    assert device.breakdown is not None
    assert sum(device.breakdown.values()) == device.peak_allocated_bytes
    return device


def test_a_cell_that_never_touches_the_allocator_reads_no_layout(
    ip: InteractiveShell, snapshots: list[int]
) -> None:
    import torch

    device = measured(ip, "_z = 1")
    assert snapshots == []
    assert device.source == "allocator-trace"
    assert device.peak_allocated_bytes == torch.cuda.memory_allocated()
    # the model's parameters and Adam state are named, the cached list is the rest
    n = sum(p.numel() for p in ip.user_ns["model"].parameters())
    assert device.breakdown["parameters"] == 4 * n
    assert device.breakdown["optimizer_state"] == 8 * n  # exp_avg, exp_avg_sq (steps: on the CPU)


def test_peaks_stay_exact_from_a_kept_layout_and_after_plain_cells(
    ip: InteractiveShell, snapshots: list[int]
) -> None:
    import torch

    from jupyter_gpumem.tracking.cuda import TRACES

    before = torch.cuda.memory_allocated()
    device = measured(ip, "y = torch.empty(1 << 20, device=dev)\ndel y")
    assert device.source == "allocator-trace"
    assert device.peak_allocated_bytes == before + 4 * MiB
    bodies = (
        "y = torch.empty(1 << 20, device=dev)\ndel y",
        "x = model(torch.randn(64, 512, device=dev)).sum()\nx.backward()\ndel x",
    )
    for body in bodies:
        assert ip.run_cell(body).success  # a plain cell: the allocator now caches what it needs
        reads = len(snapshots)
        measured(ip, body)
        # the plain cell moved the allocator: the start reads the layout, the end the trace alone
        assert len(snapshots) == reads + 1 and TRACES.usable
        measured(ip, body)
        assert len(snapshots) == reads + 1  # started from the layout the last window's replay left
    measured(ip, "opt.step()\nopt.zero_grad(set_to_none=True)")


def test_leak_hints_are_found_in_the_lived_in_kernel(ip: InteractiveShell) -> None:
    assert ip.run_cell("history_list = []").success
    for _ in range(4):
        device = measured(ip, "history_list.append(torch.randn(512, 512, device=dev))")
    report = ip.user_ns["r"]
    growth = [h for h in report.leak_hints if h.kind == "growth"]
    assert growth and growth[0].bytes == 512 * 512 * 4
    result = ip.run_cell("torch.ones(3, 1 << 18, device=dev)", store_history=True)
    n = result.execution_count
    measured(ip, "_z = 1")
    held = {h.kind: h for h in ip.user_ns["r"].leak_hints}
    assert held["output-cache"].bytes == 3 * MiB
    assert f"Out[{n}]" in held["output-cache"].where
    assert device.peak_allocated_bytes > 0
