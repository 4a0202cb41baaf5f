"""A CPU cell longer than the steps recorded in detail is still reported whole."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

torch = pytest.importorskip("torch")

SETUP = """
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 100))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
batches = [torch.randint(0, 100, (4, 17)) for _ in range(50)]
"""
LOOP = """%%gpumem -o r --quiet --top 100
losses = []
for batch in batches:
    logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.detach())
"""


def test_a_50_step_loop_is_reported_whole(shell: InteractiveShell) -> None:
    shell.run_cell(SETUP)
    assert shell.run_cell(LOOP).success
    r = shell.user_ns["r"]
    assert shell.run_cell("%%gpumem -o nxt --quiet\ny = 1").success
    nxt = shell.user_ns["nxt"]
    assert r.allocated_after_bytes == nxt.allocated_before_bytes
    names = {t.name for t in r.tensors if t.alive}
    assert "logits" in names
    assert {f"losses[{i}]" for i in range(50)} <= names
    timeline = r.main.timeline
    assert timeline.t_s[-1] == pytest.approx(r.wall_s, rel=0.05)
    assert any("first 3 of 50 steps" in n for n in r.notes)


def test_a_loop_recorded_whole_says_nothing_of_first_steps(shell: InteractiveShell) -> None:
    shell.run_cell(SETUP)
    three = LOOP.replace("for batch in batches:", "for batch in batches[:3]:")
    assert shell.run_cell(three).success
    r = shell.user_ns["r"]
    assert not any("first" in n and "steps" in n for n in r.notes), r.notes
    assert shell.run_cell("%%gpumem -o nxt --quiet\ny = 1").success
    assert r.allocated_after_bytes == shell.user_ns["nxt"].allocated_before_bytes
