"""Long training cells: detail for the first steps, counters after, and the peak still exact."""

from __future__ import annotations

import re

import pytest
from IPython.core.interactiveshell import InteractiveShell
from test_magic_gpu import _dump

from tests.support.cycles import cyclic_garbage

SETUP = """
import torch, torch.nn as nn
torch.manual_seed(0)
dev = torch.device("cuda")
mlp = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(512, 512), nn.ReLU())]).to(dev)
mlp_opt = torch.optim.Adam(mlp.parameters(), lr=1e-3)
layer = nn.TransformerEncoderLayer(256, nhead=4, dim_feedforward=1024, batch_first=True)
encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).to(dev)
enc_opt = torch.optim.AdamW(encoder.parameters(), lr=1e-4)
small, big = torch.randn(64, 512, device=dev), torch.randn(4096, 512, device=dev)
tokens = torch.randn(32, 128, 256, device=dev)
def mlp_step(x):
    mlp(x).pow(2).mean().backward()
    mlp_opt.step()
    mlp_opt.zero_grad(set_to_none=True)
def enc_step(x):
    encoder(x).pow(2).mean().backward()
    enc_opt.step()
    enc_opt.zero_grad(set_to_none=True)
mlp_step(small); enc_step(tokens)
"""

CELLS = {
    "mlp 200 steps": "for step in range(200):\n    mlp_step(small)",
    "encoder 1000 steps": "for step in range(1000):\n    enc_step(tokens)",
    "peak at step 150 of 200": "for step in range(200):\n    mlp_step(small if step < 150 else big)",
    "peak once, at step 120": "for step in range(200):\n    mlp_step(big if step == 120 else small)",
    "user resets the peak at step 100": (
        "for step in range(200):\n"
        "    if step == 100:\n"
        "        peak_before_reset = torch.cuda.max_memory_allocated()\n"
        "        peak_reserved_before_reset = torch.cuda.max_memory_reserved()\n"
        "        torch.cuda.reset_peak_memory_stats()\n"
        "    mlp_step(big if step == 50 else small)"
    ),
}


@pytest.fixture
def long_shell(shell: InteractiveShell) -> InteractiveShell:
    assert shell.run_cell(SETUP).success
    return shell


def _expected(ip: InteractiveShell) -> tuple[int, int]:
    import torch

    peak_a, peak_r = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    if "peak_before_reset" in ip.user_ns:  # the cell reset the counters half-way
        peak_a = max(peak_a, ip.user_ns.pop("peak_before_reset"))
        peak_r = max(peak_r, ip.user_ns.pop("peak_reserved_before_reset"))
    return peak_a, peak_r


@pytest.mark.parametrize("cell", list(CELLS))
def test_long_cells_keep_the_exact_peak(long_shell: InteractiveShell, cell: str) -> None:
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    result = long_shell.run_cell(f"%%gpumem -o r\n{CELLS[cell]}")
    assert result.success, result.error_in_exec
    r = long_shell.user_ns["r"]
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == _expected(long_shell), r.notes
    assert r.breakdown is not None and sum(r.breakdown.values()) == r.peak_allocated_bytes
    assert r.allocated_after_bytes == torch.cuda.memory_allocated()
    assert any("steps 0-2" in n for n in r.notes), r.notes  # the light mode says so
    _dump(r, cell)


def test_a_peak_that_comes_late_gets_its_own_detailed_steps(long_shell: InteractiveShell) -> None:
    assert long_shell.run_cell(f"%%gpumem -o r\n{CELLS['peak at step 150 of 200']}").success
    r = long_shell.user_ns["r"]
    assert r.devices[0].source == "allocator-trace", r.notes  # a detailed window reached it
    assert r.peak_step is not None and r.peak_step >= 150
    assert r.breakdown["inputs"] == 4096 * 512 * 4  # the breakdown is of a big-batch step
    assert r.breakdown["activations"] > 0
    assert any(re.search(r"steps 0-2 and 1[5-9]\d", n) for n in r.notes), r.notes


def test_the_users_view_of_the_counters_is_unchanged(long_shell: InteractiveShell) -> None:
    """After a cell, max_memory_allocated() still reports the peak from before it."""
    import torch

    torch.cuda.reset_peak_memory_stats()
    assert long_shell.run_cell("mlp_step(big)").success
    before = torch.cuda.max_memory_allocated()
    assert long_shell.run_cell("%%gpumem -o r\nfor step in range(20):\n    mlp_step(small)").success
    assert long_shell.user_ns["r"].peak_allocated_bytes < before
    assert torch.cuda.max_memory_allocated() == before
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()


@pytest.mark.parametrize("steps", [3, 10])
def test_gpt2_cells_keep_the_exact_peak(shell: InteractiveShell, steps: int) -> None:
    pytest.importorskip("transformers")
    import torch

    setup = (
        "import torch\n"
        "from transformers import GPT2Config, GPT2LMHeadModel\n"
        "torch.manual_seed(0)\n"
        "gpt = GPT2LMHeadModel(GPT2Config()).cuda().train()\n"
        "gpt_opt = torch.optim.AdamW(gpt.parameters(), lr=1e-4)\n"
        "ids = torch.randint(0, 50257, (8, 1024), device='cuda')\n"
        "def gpt_step():\n"
        "    gpt(input_ids=ids, labels=ids).loss.backward()\n"
        "    gpt_opt.step()\n"
        "    gpt_opt.zero_grad(set_to_none=True)\n"
        "gpt_step()\n"
    )
    assert shell.run_cell(setup).success
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    assert shell.run_cell(f"%%gpumem -o r\nfor _ in range({steps}):\n    gpt_step()").success
    r = shell.user_ns["r"]
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == _expected(shell), r.notes
    assert sum(r.breakdown.values()) == r.peak_allocated_bytes
    gpt = shell.user_ns["gpt"]
    n = sum(p.numel() for p in gpt.parameters())
    buffers = sum(b.untyped_storage().nbytes() for b in gpt.buffers())
    # the storages' own bytes, whatever blocks the cache's layout gave them (the rest is slack)
    assert r.breakdown["parameters"] == 4 * n + buffers
    assert r.breakdown["optimizer_state"] == 8 * n  # AdamW's step counters live on the CPU
    _dump(r, f"gpt2 {steps} steps")


@pytest.mark.parametrize("cell", ["mlp 200 steps", "peak at step 150 of 200"])
@pytest.mark.parametrize("flags", ["--quiet", "-o r"])
def test_a_cell_leaves_no_garbage_in_cycles(
    long_shell: InteractiveShell, cell: str, flags: str
) -> None:
    """What a cell's recording held (traces, layouts, hooks) goes with it, not at a collection."""
    for _ in range(2):  # first cells fill caches and install counters
        assert long_shell.run_cell(f"%%gpumem {flags}\n{CELLS[cell]}").success
    plain = cyclic_garbage(long_shell, CELLS[cell])
    assert cyclic_garbage(long_shell, f"%%gpumem {flags}\n{CELLS[cell]}") == plain
