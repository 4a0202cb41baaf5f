"""A Ctrl-C at any moment of a CUDA cell leaves nothing of ours behind (see tests/kernel/test_interrupts.py).

On a GPU the cell also opens peak counters and records the allocator's history; an interrupted
cell must close both, and the next cell's peak must equal the allocator's own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.kernel.test_interrupts import _injected, _state

CELL = """%%gpumem -o r --quiet
loss = model(x).square().mean()
loss.backward()
opt.step()
opt.zero_grad()
"""
# What an interrupted cell's traceback held is collected first: its tensors are the user's
# to free, and freeing them inside the check would lower the allocator's peak under ours.
BEFORE_CHECK = "import gc\ngc.collect()\ntorch.cuda.reset_peak_memory_stats()"
CHECK = """%%gpumem -o after --quiet
kept = torch.ones(1 << 20, device="cuda")
own = torch.cuda.max_memory_allocated()
"""


def _cuda_state() -> dict[str, object]:
    import torch

    from jupyter_gpumem.tracking.counters import COUNTERS

    return {
        **_state(),
        "open counters": len(COUNTERS._intervals),
        "history recorded": bool(torch.cuda.memory._snapshot()["device_traces"][0]),
    }


@pytest.fixture
def cuda_shell(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> Iterator[InteractiveShell]:
    shell.run_cell(
        "import torch\nfrom torch import nn\n"
        "model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 8)).cuda()\n"
        "opt = torch.optim.AdamW(model.parameters())\nx = torch.randn(64, 256, device='cuda')"
    )
    monkeypatch.setattr(shell, "showtraceback", lambda *args, **kwargs: None)
    yield shell


@pytest.mark.timeout(1200)
def test_every_third_call_of_a_cuda_cell_interrupted_leaves_nothing_behind(
    cuda_shell: InteractiveShell,
) -> None:
    shell = cuda_shell
    shell.run_cell(CELL)
    clean = _cuda_state()
    total = _injected(lambda: shell.run_cell(CELL), None).calls
    assert total > 100
    left: list[str] = []
    for at in range(1, total + 1, 3):
        injector = _injected(lambda: shell.run_cell(CELL), at)
        now = _cuda_state()
        if now != clean:
            left.append(
                f"call {at} ({injector.where}): { {k: now[k] for k in now if now[k] != clean[k]} }"
            )
            break
        shell.run_cell(BEFORE_CHECK)
        shell.run_cell(CHECK)
        after = shell.user_ns.pop("after", None)
        if after is None or after.peak_allocated_bytes != shell.user_ns["own"]:
            left.append(
                f"call {at} ({injector.where}): the next peak is {after and after.peak_allocated_bytes}"
            )
            break
    assert not left, "\n".join(left)
