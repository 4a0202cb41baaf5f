"""A CPU cell that counts no steps is recorded in detail for a while, then steps aside.

Loops of plain tensor ops with a hand-written update (makemore-style) have no optimizer
step or model call to count: the CPU source steps aside at the header of the cell's own
outermost loop after its first ``DETAIL_STEPS`` iterations, or, where the cell has no loop of
its own, at a statement of its own code once ``CPU_DETAIL_S`` has passed; the report still
covers the whole cell.
"""

from __future__ import annotations

import sys

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem.tracking import recorder
from tests.kernel.cell_compare import compare

torch = pytest.importorskip("torch")

SETUP = """
import torch
g = torch.Generator().manual_seed(0)
W = torch.randn((30, 27), generator=g, requires_grad=True)
X = torch.randn((500, 30), generator=g)
"""
TRAIN = """
def train(n):
    out = []
    for i in range(n):
        out.append((X[i:i + 32] @ W).sum().detach())
    return out
"""
LOOP = """%%gpumem -o r --quiet --top 100
losses = []
for i in range(40):
    logits = X[i:i + 32] @ W
    loss = logits.tanh().pow(2).mean()
    W.grad = None
    loss.backward()
    W.data += -0.1 * W.grad
    losses.append(loss.detach())
"""


@pytest.fixture
def at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """No time in detail: the source steps aside at the cell's first statement after an op."""
    monkeypatch.setattr(recorder, "CPU_DETAIL_S", 0.0)


def test_a_loop_without_steps_steps_aside_and_is_reported_whole(
    shell: InteractiveShell, at_once: None
) -> None:
    shell.run_cell(SETUP)
    assert shell.run_cell(LOOP).success
    r = shell.user_ns["r"]
    assert any("up to a statement of the cell" in n for n in r.notes), r.notes
    assert shell.run_cell("%%gpumem -o nxt --quiet\ny = 1").success
    assert r.allocated_after_bytes == shell.user_ns["nxt"].allocated_before_bytes
    names = {t.name for t in r.tensors if t.alive}
    assert {"logits", "W.grad"} <= names
    assert {f"losses[{i}]" for i in range(40)} <= names
    assert r.main.timeline.t_s[-1] == pytest.approx(r.wall_s, rel=0.05)
    # the recorded part is the loop's start only: later tensors are named by where they live
    where = {t.name: t.line for t in r.tensors if t.alive}
    assert where["losses[39]"] == "outside the recorded part"


def test_a_loop_steps_aside_after_its_first_iterations(shell: InteractiveShell) -> None:
    shell.run_cell(SETUP)
    assert shell.run_cell(LOOP).success
    r = shell.user_ns["r"]
    assert any("the first 3 iterations of the cell's loop" in n for n in r.notes), r.notes
    assert sys.gettrace() is None
    assert shell.run_cell("%%gpumem -o nxt --quiet\ny = 1").success
    assert r.allocated_after_bytes == shell.user_ns["nxt"].allocated_before_bytes
    where = {t.name: t.line for t in r.tensors if t.alive}
    assert [where[f"losses[{i}]"] for i in range(3)] == ["cell line 4"] * 3  # loss, detached
    assert where["losses[39]"] == "outside the recorded part"


def test_an_outer_loops_iterations_are_counted_not_its_inner_loops(
    shell: InteractiveShell,
) -> None:
    shell.run_cell(SETUP)
    body = """%%gpumem -o r --quiet --top 100
losses = []
with torch.enable_grad():
    for i in range(12):
        for _ in range(5):  # an inner loop: five returns to its header each time round
            logits = X[i:i + 32] @ W
        losses.append(logits.sum().detach())
"""
    assert shell.run_cell(body).success
    r = shell.user_ns["r"]
    assert any("the first 3 iterations of the cell's loop" in n for n in r.notes), r.notes
    where = {t.name: t.line for t in r.tensors if t.alive}
    assert [where[f"losses[{i}]"] for i in range(3)] == ["cell line 6"] * 3
    assert where["losses[11]"] == "outside the recorded part"


def test_a_short_cell_without_a_loop_of_its_own_is_recorded_whole(
    shell: InteractiveShell,
) -> None:
    shell.run_cell(SETUP)
    shell.run_cell(TRAIN)
    assert shell.run_cell("%%gpumem -o r --quiet --top 100\nresult = train(30)").success
    r = shell.user_ns["r"]
    assert not any("recorded in detail" in n for n in r.notes), r.notes
    assert len(shell.user_ns["result"]) == 30


def test_it_steps_aside_in_a_function_of_an_earlier_cell(
    shell: InteractiveShell, at_once: None
) -> None:
    shell.run_cell(SETUP)
    shell.run_cell(TRAIN)
    assert shell.run_cell("%%gpumem -o r --quiet\nresult = train(30)").success
    r = shell.user_ns["r"]
    assert any("up to a statement of the cell" in n for n in r.notes), r.notes
    assert len(shell.user_ns["result"]) == 30


def test_no_step_aside_inside_a_backward_or_a_transform(
    shell: InteractiveShell, at_once: None
) -> None:
    """The user's code that torch calls back (a custom backward, a torch.func transform)
    is no place to step aside: the source leaves at the cell's next statement instead."""
    body = """
class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        out = grad
        for _ in range(3):
            out = out * 1.0
        return 2 * x * out
x.grad = None
Square.apply(x).sum().backward()
ok = torch.allclose(x.grad, 2 * x)
def f(v):
    acc = v
    for _ in range(3):
        acc = acc.sin()
    return acc.sum()
g1 = torch.func.grad(f)(torch.ones(4))
"""
    setup = SETUP + "x = torch.randn(8, generator=g, requires_grad=True)\n"
    plain, magic, _ = compare(shell, "--quiet -o r", body, setup=setup)
    assert magic.seen == plain.seen and magic.reports == 1
    assert shell.user_ns["ok"] and plain.seen.names["ok"] == "True"
    assert any("up to a statement of the cell" in n for n in shell.user_ns["r"].notes)


@pytest.mark.parametrize("when", ["at its deadline", "at its loop"])
def test_nothing_is_left_watching(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    if when == "at its deadline":
        monkeypatch.setattr(recorder, "CPU_DETAIL_S", 0.0)
    shell.run_cell(SETUP)
    before = sys.gettrace()
    assert shell.run_cell(LOOP).success
    assert sys.gettrace() is before
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        assert all(monitoring.get_tool(i) != "jupyter_gpumem" for i in range(6))


def test_a_loop_of_in_place_ops_steps_aside_too(shell: InteractiveShell, at_once: None) -> None:
    """Counting into a tensor (makemore's bigram table) allocates nothing after its start."""
    shell.run_cell("import torch\nN = torch.zeros((27, 27), dtype=torch.int32)")
    body = "%%gpumem -o r --quiet\nfor i in range(200):\n    N[i % 27, (i * 7) % 27] += 1\n"
    assert shell.run_cell(body).success
    assert any("up to a statement of the cell" in n for n in shell.user_ns["r"].notes)
    assert int(shell.user_ns["N"].sum()) == 200
