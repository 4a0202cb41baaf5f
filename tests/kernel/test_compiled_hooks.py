"""A model compiled with torch.compile under `%%gpumem`: marked per call, never recompiled for us.

Inference is the case that matters: a traced hook reading our bookkeeping (how many marks
so far) would guard on it, and recompile the model at every call up to dynamo's limit.
"""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

torch = pytest.importorskip("torch")

SETUP = """
import torch
from torch._dynamo.utils import counters
torch._dynamo.reset()
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
compiled = torch.compile(net, backend="aot_eager")
x = torch.ones(4, 8)
"""
CELL = """%%gpumem -o r --quiet
for _ in range(6):
    compiled(x).sum().backward()
    with torch.no_grad():
        compiled(x)
"""


def test_compiled_calls_are_marked_without_recompiling(shell: InteractiveShell) -> None:
    assert shell.run_cell(SETUP).success
    result = shell.run_cell(CELL)
    assert result.success, result.error_in_exec
    again = dict(shell.user_ns["counters"]["frames"])
    # compiled under the hooks: their entry and exit run eagerly, the frames around them
    # are compiled in the first cell, and a later cell compiles nothing
    result = shell.run_cell(CELL)
    assert result.success, result.error_in_exec
    assert dict(shell.user_ns["counters"]["frames"]) == again
    r = shell.user_ns["r"]
    bands = r.devices[0].timeline.bands
    forward = [b for b in bands if b.phase == "forward"]
    assert len(forward) >= 1 and {b.phase for b in bands} >= {"forward", "backward"}
