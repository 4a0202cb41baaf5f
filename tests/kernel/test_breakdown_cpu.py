"""Where the peak comes from, on the CPU: the dispatch source with the same analysis as a GPU."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

MLP = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
x = torch.randn(32, 64)
"""

# A wide head makes the loss's first backward temporaries the largest allocation, so the peak
# comes before backward has released any activation and all saved tensors are live at it.
TRANSFORMER = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), nn.Linear(32, 2048))
x = torch.randn(4, 16, 32)
"""

SETUP_OPT = """
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
model(x).pow(2).mean().backward(); opt.step()  # gradients and Adam state exist before the cell
N = sum(p.numel() for p in model.parameters())
STEP_BYTES = sum(s["step"].untyped_storage().nbytes() for s in opt.state.values())
"""

STEP = """
for step in range(2):
    out = model(x)
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
"""

COUNT_SAVED = """
saved = {}
params = {p.untyped_storage().data_ptr() for p in model.parameters()}
def pack(t):
    ptr = t.untyped_storage().data_ptr()
    if ptr not in params and ptr != x.untyped_storage().data_ptr():
        saved[ptr] = t.untyped_storage().nbytes()
    return t
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    probe = model(x).pow(2).mean()
del probe
SAVED_BYTES = sum(saved.values())
"""


@pytest.mark.parametrize("setup", [MLP, TRANSFORMER], ids=["mlp", "transformer"])
def test_breakdown_identities_on_cpu(shell: InteractiveShell, setup: str) -> None:
    assert shell.run_cell(setup + SETUP_OPT + COUNT_SAVED).success
    result = shell.run_cell(f"%%gpumem -o r\n{STEP}")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    n, step_bytes = shell.user_ns["N"], shell.user_ns["STEP_BYTES"]
    assert r.device == "cpu" and r.source == "cpu-dispatch", r.notes
    assert sum(r.breakdown.values()) == r.peak_allocated_bytes
    assert r.breakdown["parameters"] == 4 * n
    assert r.breakdown["gradients"] == 4 * n
    assert (
        r.breakdown["optimizer_state"] == 8 * n + step_bytes
    )  # exp_avg, exp_avg_sq + step counters
    saved = shell.user_ns["SAVED_BYTES"]
    assert abs(r.breakdown["activations"] - saved) <= 0.05 * saved, (r.breakdown, saved)
    assert r.peak_phase in ("forward", "backward")
    assert r.peak_step in (0, 1)


def test_output_variable_is_named_with_its_cell_line(shell: InteractiveShell) -> None:
    assert shell.run_cell(MLP + SETUP_OPT).success
    assert shell.run_cell(f"%%gpumem -o r --top 5\n{STEP}").success
    r = shell.user_ns["r"]
    out = next(t for t in r.tensors if t.name == "out")
    assert (
        out.alive and out.shape == (32, 64) and out.dtype == "float32" and out.nbytes == 32 * 64 * 4
    )
    assert out.line == "cell line 2"  # as the traceback counts: `for`, then `out = model(x)`
    assert len([t for t in r.tensors if t.alive]) <= 5


def test_peak_phase_is_forward_for_inference(shell: InteractiveShell) -> None:
    assert shell.run_cell(MLP).success
    assert shell.run_cell(
        "%%gpumem -o r\nwith torch.no_grad():\n    y = model(x)\n    z = model(x) * 2"
    ).success
    r = shell.user_ns["r"]
    assert r.peak_phase == "forward"
    assert r.breakdown["activations"] == 0
    assert sum(r.breakdown.values()) == r.peak_allocated_bytes


def test_tracking_leaves_no_reference_cycle_through_saved_outputs(shell: InteractiveShell) -> None:
    """A graph built under %%gpumem and dropped without backward is freed at once."""
    assert shell.run_cell(MLP).success
    cell = (
        "%%gpumem --quiet\n"
        "import weakref\n"
        "y = model(x).exp()  # exp saves its output\n"
        "ref = weakref.ref(y)\n"
        "del y"
    )
    assert shell.run_cell(cell).success
    assert shell.user_ns["ref"]() is None


def test_what_the_namespace_held_and_the_cell_freed_counts_as_freed(
    shell: InteractiveShell,
) -> None:
    setup = MLP + SETUP_OPT + "kept = [torch.ones(1000), torch.ones(3000)]\n"
    assert shell.run_cell(setup).success
    assert shell.run_cell("%%gpumem --quiet\n_z = 1").success  # names kept from here on
    state = "sum(v.untyped_storage().nbytes() for s in opt.state.values() for v in s.values())"
    freed = shell.ev(
        f"4 * 3000 + {state} + sum(p.grad.untyped_storage().nbytes() for p in model.parameters())"
    )
    cell = "del kept[1]\nopt.state.clear()\nfor p in model.parameters():\n    p.grad = None\n"
    assert shell.run_cell(f"%%gpumem --quiet -o r\n{cell}").success
    r = shell.user_ns["r"]
    assert r.allocated_after_bytes == r.allocated_before_bytes - freed
