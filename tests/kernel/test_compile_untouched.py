"""torch.compile under `%%gpumem` compiles what the plain cell compiles, and no more.

A graph break runs the rest of a compiled frame eagerly with Dynamo's frame hook set: our
dispatch mode and callbacks must not be compiled as if they were the user's code. A module
compiled in a tracked cell must not guard on our global module hooks, or it compiles again
in the next plain cell.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

torch = pytest.importorskip("torch")

BAR = """
import warnings
import torch, torch._dynamo
from torch._dynamo.utils import counters
def bar(a, b):
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:  # a graph break: the comparison and the branch run eagerly
        b = b * -1
    return x * b
a, b = torch.ones(256), -torch.ones(256)
"""
RUN_BAR = """
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    out = torch.compile(bar, backend="eager")(a, b)
compiled = {k: dict(v) for k, v in counters.items()}
warned = [str(w.message) for w in seen]
"""


@pytest.fixture
def compiling(shell: InteractiveShell) -> Iterator[InteractiveShell]:
    """The shell; what was compiled is forgotten before the shell's namespace is reset, since
    Dynamo removes the names it put there."""
    yield shell
    torch._dynamo.reset()


def _fresh(shell: InteractiveShell) -> None:
    """Nothing compiled yet, no counts, and torch's warn-once messages forgotten."""
    assert shell.run_cell("torch._dynamo.reset()\ncounters.clear()").success
    getattr(torch._dynamo.utils, "warn_once_cache", set()).clear()


def test_a_graph_break_compiles_as_in_the_plain_cell(compiling: InteractiveShell) -> None:
    shell = compiling
    assert shell.run_cell(BAR).success
    _fresh(shell)
    assert shell.run_cell(RUN_BAR).success
    plain = shell.user_ns["compiled"]
    assert plain["stats"]["unique_graphs"] == 2 and plain["resumes"]
    _fresh(shell)
    result = shell.run_cell(f"%%gpumem -o r --quiet\n{RUN_BAR}")
    assert result.success, result.error_in_exec
    tracked = shell.user_ns["compiled"]
    # the same frames compiled, the same graphs, graph breaks and resume functions
    assert tracked == plain
    assert not [w for w in shell.user_ns["warned"] if "Dynamo" in w or "time_ns" in w]
    assert torch.equal(shell.user_ns["out"], torch.full((256,), 0.5))
    # the ops that ran were recorded: the outputs 1 KiB each, alive at the end
    r = shell.user_ns["r"]
    assert r.main.allocated_after_bytes >= 1024


NET = """
import torch, torch._dynamo
torch._dynamo.reset()
compiles = []
def counting(gm, inputs):
    compiles.append(len(gm.graph.nodes))
    return gm.forward
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
x = torch.ones(4, 8)
"""


def test_a_module_compiled_in_a_tracked_cell_runs_in_a_plain_one(
    compiling: InteractiveShell,
) -> None:
    shell = compiling
    assert shell.run_cell(NET).success
    first = (
        "%%gpumem -o r --quiet\ncompiled = torch.compile(net, backend=counting)\ny = compiled(x)"
    )
    result = shell.run_cell(first)
    assert result.success, result.error_in_exec
    assert len(shell.user_ns["compiles"]) == 1
    for cell in ("y = compiled(x)", "%%gpumem -o again --quiet\ny = compiled(x)", "compiled(x)"):
        result = shell.run_cell(cell)
        assert result.success, result.error_in_exec
        assert len(shell.user_ns["compiles"]) == 1, cell
    # the compiled call is still one forward of the model, its parameters its own
    for r in (shell.user_ns["r"], shell.user_ns["again"]):
        assert [b.phase for b in r.main.timeline.bands] == ["forward"]
        assert r.main.breakdown["parameters"] == (8 * 16 + 16 + 16 * 8 + 8) * 4


def test_a_compiled_module_that_raises_gives_our_hooks_back(compiling: InteractiveShell) -> None:
    shell = compiling
    assert shell.run_cell(NET).success
    cell = """%%gpumem -o r --quiet
compiled = torch.compile(net, backend="eager")
try:
    compiled(torch.ones(4, 3))
except RuntimeError:  # the shapes do not match
    failed = True
loss = net(x).square().sum()
"""
    result = shell.run_cell(cell)
    assert result.success, result.error_in_exec
    assert shell.user_ns["failed"]
    # the eager call after it is seen module by module: its Linear layers saved their inputs
    by_module = shell.user_ns["r"].by_module
    assert by_module["_orig_mod.2"].get("activations", 0) > 0, by_module
    hooks = torch.nn.modules.module
    assert not hooks._global_forward_hooks and not hooks._global_forward_pre_hooks
