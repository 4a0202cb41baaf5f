"""`%%gpumem` peaks against the allocator's own counters, to the byte, on a real GPU."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

SETUP = """
import torch, torch.nn as nn
torch.manual_seed(0)
dev = torch.device("cuda")
# Leave a fragmented allocator behind so that the replay starts from a non-trivial layout.
keep = [torch.empty(n, device=dev) for n in (3_000_000, 700_000, 5, 4_000_000, 123_457)]
del keep[1], keep[2]
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
"""

CELLS = {
    "plain allocations": """
a = torch.empty(25_000_000, device=dev)
b = torch.randn(3000, 3000, device=dev)
c = a[:1000] * 2
del a
d = torch.empty(19_600_000, device=dev)
""",
    "training step": """
for step in range(3):
    x = torch.randn(512, 1024, device=dev)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
""",
    "cell that resets peak stats": """
big = torch.empty(40_000_000, device=dev)
del big
peak_before_reset = torch.cuda.max_memory_allocated()
peak_reserved_before_reset = torch.cuda.max_memory_reserved()
torch.cuda.reset_peak_memory_stats()
small = torch.empty(1_000_000, device=dev)
""",
}


def _independent_peaks(ip: InteractiveShell) -> tuple[int, int]:
    import torch

    peak_a, peak_r = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    if "peak_before_reset" in ip.user_ns:  # the cell reset the counters half-way
        peak_a = max(peak_a, ip.user_ns.pop("peak_before_reset"))
        peak_r = max(peak_r, ip.user_ns.pop("peak_reserved_before_reset"))
    return peak_a, peak_r


@pytest.fixture
def gpu_shell(shell: InteractiveShell) -> InteractiveShell:
    assert shell.run_cell(SETUP).success
    return shell


@pytest.mark.parametrize("cell", list(CELLS))
def test_peaks_equal_the_allocator_counters_to_the_byte(
    gpu_shell: InteractiveShell, cell: str
) -> None:
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    result = gpu_shell.run_cell(f"%%gpumem -o r\n{CELLS[cell]}")
    assert result.success, result.error_in_exec
    expected = _independent_peaks(gpu_shell)
    r = gpu_shell.user_ns["r"]
    assert r.devices and r.devices[0].source == "allocator-trace", r.notes
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == expected
    assert r.allocated_after_bytes == torch.cuda.memory_allocated()
    _dump(r, cell)


def test_user_recording_is_respected_and_left_on(gpu_shell: InteractiveShell) -> None:
    import torch

    torch.cuda.memory._record_memory_history(max_entries=50_000)
    try:
        torch.cuda.reset_peak_memory_stats()
        before = len(torch.cuda.memory._snapshot()["device_traces"][0])
        assert gpu_shell.run_cell(f"%%gpumem -o r\n{CELLS['training step']}").success
        expected = _independent_peaks(gpu_shell)
        r = gpu_shell.user_ns["r"]
        assert r.devices[0].source == "allocator-trace", r.notes
        assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == expected
        after = torch.cuda.memory._snapshot()["device_traces"][0]
        assert len(after) > before  # the user's trace kept the cell's events...
        probe = torch.empty(1234, device="cuda")
        assert len(torch.cuda.memory._snapshot()["device_traces"][0]) > len(
            after
        )  # ...and still records
        del probe
    finally:
        torch.cuda.memory._record_memory_history(None)


def test_our_recording_is_switched_off_after_the_cell(gpu_shell: InteractiveShell) -> None:
    import torch

    assert gpu_shell.run_cell(f"%%gpumem\n{CELLS['plain allocations']}").success
    probe = torch.empty(1234, device="cuda")
    assert torch.cuda.memory._snapshot()["device_traces"][0] == []
    del probe


def test_raising_cell_restores_recording_state(gpu_shell: InteractiveShell) -> None:
    import torch

    result = gpu_shell.run_cell(
        "%%gpumem -o r\nt = torch.empty(1000, device=dev)\nraise KeyError('k')"
    )
    assert isinstance(result.error_in_exec, KeyError)
    assert gpu_shell.user_ns["r"].status == "error"
    assert gpu_shell.user_ns["r"].devices[0].source == "allocator-trace"
    torch.empty(10, device="cuda")
    assert torch.cuda.memory._snapshot()["device_traces"][0] == []


def test_no_trace_uses_counters(gpu_shell: InteractiveShell) -> None:
    import torch

    assert gpu_shell.run_cell(f"%%gpumem --no-trace -o r\n{CELLS['plain allocations']}").success
    r = gpu_shell.user_ns["r"]
    assert r.devices[0].source == "counters"
    assert r.peak_allocated_bytes == torch.cuda.max_memory_allocated()


def test_snapshot_loads_in_memory_viz(gpu_shell: InteractiveShell, tmp_path: Path) -> None:
    from torch.cuda import _memory_viz

    path = tmp_path / "cell.pickle"
    assert gpu_shell.run_cell(f"%%gpumem --snapshot {path}\n{CELLS['training step']}").success
    with path.open("rb") as f:
        snapshot = pickle.load(f)
    assert snapshot["device_traces"][0], "the cell's events are in the snapshot"
    assert "<html" in _memory_viz.trace_plot(snapshot).lower()


def test_report_numbers_and_nvml(gpu_shell: InteractiveShell) -> None:
    assert gpu_shell.run_cell(f"%%gpumem -o r --budget 1MiB\n{CELLS['plain allocations']}").success
    r = gpu_shell.user_ns["r"]
    d = r.devices[0]
    assert d.cache_bytes == d.reserved_after_bytes - d.allocated_after_bytes
    assert d.allocated_delta_bytes == d.allocated_after_bytes - d.allocated_before_bytes
    assert r.over_budget and "exceeds the budget" in str(r)
    if d.nvml_process_bytes is not None:  # None where NVML cannot see this pid (containers)
        assert d.nvml_process_bytes >= d.reserved_after_bytes
        assert d.non_torch_bytes == d.nvml_process_bytes - d.reserved_after_bytes
    _dump(r, "report with budget")


def _dump(report: object, label: str) -> None:
    """Keep reports from the GPU run for the closing note (GPUMEM_OUT set by the runner)."""
    out = os.environ.get("GPUMEM_OUT")
    if out:
        with open(os.path.join(out, "gpu_reports.jsonl"), "a") as f:
            f.write(
                json.dumps({"cell": label, "report": report.to_dict(), "text": str(report)}) + "\n"
            )
