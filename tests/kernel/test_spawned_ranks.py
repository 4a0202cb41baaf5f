"""Spawned ranks, as a kernel that has initialised CUDA starts them, on the CPU over gloo.

The switch that a lived-in kernel flips (``forked_ranks.start_method``) is set to "spawn"; the
workloads are defined in a real IPython shell, so their classes and functions live in
``__main__`` and travel by value, as a notebook's do.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

from jupyter_gpumem.techniques import Config  # noqa: E402
from jupyter_gpumem.tuner import forked_ranks  # noqa: E402

NOTEBOOK = """
import os, threading
import torch
from torch import nn
from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.trial import Trial

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))

SCALE = torch.tensor(2.0)

def loss_fn(m, b):
    return (m(b) * SCALE).logsumexp(-1).mean()

def fails_on_rank_1(m, b):
    if torch.distributed.get_rank() == 1:
        raise ValueError("rank 1 has a bad batch")
    return loss_fn(m, b)

torch.manual_seed(0)
model = nn.Sequential(*[Block() for _ in range(4)], nn.Linear(64, 3))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
batch = torch.randn(512, 64)
trial = Trial(model, batch, loss_fn, optimizer=opt, warmup=1, steps=2)
"""


@pytest.fixture
def notebook(shell: InteractiveShell) -> InteractiveShell:
    result = shell.run_cell(NOTEBOOK)
    assert result.success, result.error_in_exec
    return shell


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Ranks start as in a kernel that initialised CUDA."""
    monkeypatch.setattr(forked_ranks, "start_method", lambda device: "spawn")
    yield


def _run(shell: InteractiveShell, source: str) -> object:
    result = shell.run_cell(source)
    assert result.success, result.error_in_exec
    return result.result


def test_the_notebooks_functions_are_in_main(notebook: InteractiveShell) -> None:
    ns = notebook.user_ns
    assert ns["loss_fn"].__module__ == "__main__" and ns["Block"].__module__ == "__main__"
    assert forked_ranks.start_method(torch.device("cpu")) == "fork"
    assert forked_ranks.start_method(torch.device("cuda", 0)) == "fork"  # CUDA never used here


@pytest.mark.timeout(240)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_spawned_ranks_measure_what_forked_ones_do(
    notebook: InteractiveShell, monkeypatch: pytest.MonkeyPatch, parallel: str
) -> None:
    config = Config(parallel=parallel, world_size=2)
    trial = notebook.user_ns["trial"]
    forked = trial.run(config)
    monkeypatch.setattr(forked_ranks, "start_method", lambda device: "spawn")
    spawned = trial.run(config)
    for result in (forked, spawned):
        assert result.status == "ok", result.error
        assert [r.rank for r in result.ranks] == [0, 1]
        assert result.warnings[0] == "2 ranks over gloo"
    assert spawned.peak_allocated_bytes == forked.peak_allocated_bytes
    for s, f in zip(spawned.ranks, forked.ranks, strict=True):
        assert s.status == f.status == "ok"
        assert s.peak_allocated_bytes == f.peak_allocated_bytes
        assert s.breakdown == f.breakdown
        assert len(s.step_s_all) == len(f.step_s_all) == 2
        assert s.report is not None and s.report.devices[0].device == "cpu"


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("spawned")
def test_the_kernels_model_optimizer_and_batch_are_untouched(notebook: InteractiveShell) -> None:
    _run(notebook, "loss_fn(model, batch).backward(); opt.step()")  # grads and state, lived in
    ns = notebook.user_ns
    model, opt, batch, trial = ns["model"], ns["opt"], ns["batch"], ns["trial"]
    tensors = [*model.parameters(), *model.buffers()]
    values = [t.detach().clone() for t in tensors]
    pointers = [t.data_ptr() for t in tensors]
    grads = [p.grad.clone() for p in model.parameters()]
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    batch_before = batch.clone()
    for parallel in ("ddp", "fsdp2"):
        assert trial.run(Config(parallel=parallel, world_size=2)).status == "ok"
    assert ns["model"] is model and ns["opt"] is opt and trial.batch is batch is ns["batch"]
    assert [*model.parameters(), *model.buffers()] == tensors
    assert all(type(p) is torch.nn.Parameter for p in model.parameters())
    assert [t.data_ptr() for t in tensors] == pointers
    assert all(torch.equal(t, v) for t, v in zip(tensors, values, strict=True))
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    assert [list(g["params"]) for g in opt.param_groups] == [list(model.parameters())]
    assert {id(p) for p in opt.state} == set(state)
    for p, s in opt.state.items():
        assert all(torch.equal(v, state[id(p)][k]) for k, v in s.items())
    assert torch.equal(batch, batch_before) and batch.device.type == "cpu"
    assert type(model) is torch.nn.Sequential and not torch.distributed.is_initialized()


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("spawned")
def test_a_failing_spawned_rank_is_named(notebook: InteractiveShell) -> None:
    trial = _run(notebook, "Trial(model, batch, fails_on_rank_1, warmup=0, steps=1)")
    result = trial.run(Config(parallel="ddp", world_size=2))  # type: ignore[attr-defined]
    assert result.status == "error"
    assert result.error is not None and result.error.startswith("rank 1: ValueError")
    assert "bad batch" in result.error
    assert [r.rank for r in result.ranks] == [0, 1]
    assert result.ranks[1].status == "error"


UNPICKLED_ELSEWHERE = """
class OnlyHere:
    def __init__(self):
        self.pid = os.getpid()

    def __setstate__(self, state):
        if state["pid"] != os.getpid():
            raise OSError("this object stays in the kernel")
        self.__dict__.update(state)

held = OnlyHere()
def loads_elsewhere(m, b):
    return loss_fn(m, b) + 0 * len(vars(held))

Trial(model, batch, loads_elsewhere, warmup=0, steps=1)
"""


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("spawned")
def test_a_rank_that_cannot_load_its_job_says_so(notebook: InteractiveShell) -> None:
    trial = _run(notebook, UNPICKLED_ELSEWHERE)
    result = trial.run(Config(parallel="ddp", world_size=2))  # type: ignore[attr-defined]
    assert result.status == "error"
    assert result.error is not None
    assert re.match(r"rank [01]: RuntimeError: this spawned rank could not load", result.error)
    assert "OSError: this object stays in the kernel" in result.error


@pytest.mark.usefixtures("spawned")
def test_what_cannot_be_pickled_stops_the_run_before_any_rank(notebook: InteractiveShell) -> None:
    trial = _run(
        notebook,
        "lock = threading.Lock()\n"
        "def locked(m, b):\n"
        "    with lock:\n"
        "        return loss_fn(m, b)\n"
        "Trial(model, batch, locked, warmup=0, steps=1)",
    )
    with pytest.raises(RuntimeError, match=r"pickled \(cloudpickle\), and TypeError: .*lock"):
        trial.run(Config(parallel="ddp", world_size=2))  # type: ignore[attr-defined]
    assert "restart the kernel" in forked_ranks.NOT_PICKLED


@pytest.mark.timeout(400)
@pytest.mark.usefixtures("spawned")
def test_a_plan_on_spawned_ranks_profiles_the_blocks_there(notebook: InteractiveShell) -> None:
    trial = notebook.user_ns["trial"]
    base = trial.run(Config(parallel="fsdp2", world_size=2))
    assert base.status == "ok", base.error
    budget = round(0.8 * base.peak_allocated_bytes)
    found = trial.plan(budget, techniques=("checkpoint",), parallel="fsdp2", world_size=2)
    assert found.config.parallel == "fsdp2" and found.config.world_size == 2
    assert found.fits and found.checkpoint, found.reasoning
    assert found.predicted_peak_bytes is not None and found.predicted_peak_bytes <= budget
    assert any(line.startswith("Profiled step") for line in found.reasoning), found.reasoning
    assert found.baseline is not None and len(found.baseline.ranks) == 2
    assert found.baseline.peak_allocated_bytes == base.peak_allocated_bytes
