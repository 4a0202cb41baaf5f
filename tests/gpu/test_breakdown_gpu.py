"""Breakdown, phases and OOM on a real GPU: the identities against the CUDA allocator."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

MLP_SETUP = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
N = sum(p.numel() for p in model.parameters())
x = torch.randn(256, 1024, device="cuda")
for _ in range(2):  # optimizer state exists before the tracked cell
    model(x).pow(2).mean().backward(); opt.step()
"""

MLP_STEP = """
for step in range(2):
    out = model(x)
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
"""


def test_mlp_breakdown_identities(shell: InteractiveShell) -> None:
    import torch

    assert shell.run_cell(MLP_SETUP).success
    torch.cuda.reset_peak_memory_stats()
    assert shell.run_cell(f"%%gpumem -o r\n{MLP_STEP}").success
    r = shell.user_ns["r"]
    n = shell.user_ns["N"]
    assert r.peak_allocated_bytes == torch.cuda.max_memory_allocated()
    assert sum(r.breakdown.values()) == r.peak_allocated_bytes
    assert r.breakdown["parameters"] == 4 * n
    assert r.breakdown["gradients"] == 4 * n
    assert r.breakdown["optimizer_state"] == 8 * n  # Adam's step counters live on the CPU
    assert r.peak_phase in ("forward", "backward", "optimizer")
    assert r.peak_step in (0, 1)
    assert r.breakdown["activations"] > 0
    names = {t.name for t in r.tensors if t.alive}
    assert "out" in names and "loss" in names
    line = next(t.line for t in r.tensors if t.name == "out")
    assert line == "cell line 2"  # as the traceback counts: from the first line that is not blank


def test_gpt2_step_breakdown_sums_to_the_allocator_peak(shell: InteractiveShell) -> None:
    import torch

    transformers = pytest.importorskip("transformers")
    setup = (
        "import torch, transformers\n"
        "torch.manual_seed(0)\n"
        "model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).cuda()\n"
        "opt = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
        "ids = torch.randint(0, 50257, (8, 1024), device='cuda')\n"
    )
    assert transformers and shell.run_cell(setup).success
    torch.cuda.reset_peak_memory_stats()
    cell = "for _ in range(2):\n    loss = model(ids, labels=ids).loss\n    loss.backward()\n    opt.step()\n    opt.zero_grad()"
    assert shell.run_cell(f"%%gpumem -o r --name gpt2\n{cell}").success
    r = shell.user_ns["r"]
    assert r.peak_allocated_bytes == torch.cuda.max_memory_allocated()
    assert sum(r.breakdown.values()) == r.peak_allocated_bytes
    assert r.peak_phase in ("forward", "backward", "optimizer")
    model = shell.user_ns["model"]
    n = sum(p.numel() for p in model.parameters())
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    # The storages' own bytes: what their blocks hold beyond them is the allocator's slack.
    assert r.breakdown["parameters"] == 4 * n + buffers
    assert r.breakdown["activations"] > r.breakdown["parameters"]
    print("GPT-2 breakdown", r.peak_phase, r.peak_step, r.breakdown)
    from tests.gpu.test_magic_gpu import _dump

    _dump(r, "gpt2 124M step")


def test_oom_cell_leaves_a_report_and_a_usable_kernel(shell: InteractiveShell) -> None:
    import torch

    assert shell.run_cell("import torch\nkeep = torch.empty(256 * 2**20, device='cuda')").success
    free, _ = torch.cuda.mem_get_info()
    result = shell.run_cell(
        f"%%gpumem -o r\nhuge = torch.empty({free * 4}, dtype=torch.uint8, device='cuda')"
    )
    assert type(result.error_in_exec).__name__ == "OutOfMemoryError"
    r = shell.user_ns["r"]
    assert r.status == "oom"
    assert r.oom is not None and r.oom.requested_bytes >= free * 4
    assert r.oom.advice
    assert shell.run_cell("ok = torch.ones(1024, device='cuda').sum().item()").success
    assert shell.user_ns["ok"] == 1024.0
