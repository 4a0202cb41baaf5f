"""A Ctrl-C at any moment leaves nothing of ours behind.

A KeyboardInterrupt is injected at each call our code makes while a `%%gpumem` cell (and a
Trial) runs on the CPU, one call per run, as a Ctrl-C landing there would raise it. After
each run no dispatch mode, hook, saved-tensor hook, environment variable or rank collection
of ours is left, and the next cell's report is right.
"""

from __future__ import annotations

import gc
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

import jupyter_gpumem
from jupyter_gpumem.tuner.estimation.forked import cores, run_forked

torch = pytest.importorskip("torch")

OURS = str(Path(jupyter_gpumem.__file__).parent) + os.sep

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(8, 16)
"""
CELL = """%%gpumem -o r --quiet
loss = model(x).square().mean()
loss.backward()
opt.step()
opt.zero_grad()
"""
CHECK = "%%gpumem -o after --quiet\nkept = torch.ones(1000)\n"


class Injector:
    """A trace function that raises KeyboardInterrupt at the ``at``-th call of a function of ours
    (comprehensions and lambdas aside: they run inside a function that was counted)."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.calls = 0
        self.where = ""
        self.names: list[str] = []  # the functions called, in order

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(OURS) and code.co_name[0] != "<":
            self.calls += 1
            self.names.append(code.co_name)
            if self.calls == self.at:
                self.where = f"{frame.f_code.co_filename}:{frame.f_code.co_name}"
                raise KeyboardInterrupt(f"injected at call {self.at}")


def _state() -> dict[str, Any]:
    """Everything of ours that a cell installs and must take away again."""
    from torch.nn.modules import module
    from torch.optim import optimizer
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from jupyter_gpumem.tracking import ranks, storage_resizes
    from jupyter_gpumem.workers import rank_reports

    return {
        "dispatch modes": len(_get_current_dispatch_mode_stack()),
        "module hooks": sum(
            len(getattr(module, name))
            for name in dir(module)
            if name.startswith("_global_") and name.endswith("hooks")
        ),
        "optimizer hooks": len(optimizer._global_optimizer_pre_hooks)
        + len(optimizer._global_optimizer_post_hooks),
        "saved-tensor hooks": torch._C._autograd._top_saved_tensors_default_hooks(False),
        "ranks env": os.environ.get(ranks.RANKS_DIR_ENV),
        "rank collection": rank_reports._ACTIVE,
        "recordings": len(ranks._RUNNING),
        "storage listeners": len(getattr(storage_resizes, "_LISTENERS", ())),
        "gc enabled": gc.isenabled(),
        "torch's own checks": (
            torch.autograd.graph.disable_saved_tensors_hooks,
            module._has_any_global_hook,
        ),
    }


def _shell_state(shell: InteractiveShell) -> dict[str, Any]:
    """What a cell run puts on the shell for the body's time: the displayhook's ``quiet``, and
    ``showtraceback`` (the test's own stand-in, never our wrapper of it)."""
    return {
        "displayhook override": "quiet" in vars(shell.displayhook),
        "showtraceback": vars(shell).get("showtraceback"),
    }


def _right(report: Any) -> bool:
    """The check cell's report: a 4,000-byte tensor made on top of what the namespace held."""
    return (
        report is not None
        and report.status == "ok"
        and report.peak_allocated_bytes - report.allocated_before_bytes == 4000
    )


def _injected(run: Callable[[], Any], at: int | None) -> Injector:
    injector = Injector(at)
    sys.settrace(injector)
    try:
        run()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    return injector


@pytest.fixture
def cell_shell(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> Iterator[InteractiveShell]:
    shell.run_cell(SETUP)
    # hundreds of interrupted cells: their tracebacks are not what is tested, and cost most
    monkeypatch.setattr(shell, "showtraceback", lambda *args, **kwargs: None)
    yield shell


@pytest.mark.timeout(1200)
def test_every_call_of_a_cell_interrupted_leaves_nothing_behind(
    cell_shell: InteractiveShell,
) -> None:
    shell = cell_shell
    clean = {**_state(), **_shell_state(shell)}
    total = _injected(lambda: shell.run_cell(CELL), None).calls
    assert total > 100  # the cell's measurement runs through our code
    left: list[str] = []
    for at in range(1, total + 1):
        injector = _injected(lambda: shell.run_cell(CELL), at)
        now = {**_state(), **_shell_state(shell)}
        if now != clean:
            changed = {k: now[k] for k in now if now[k] != clean[k]}
            left.append(f"call {at} ({injector.where}): {changed}")
            _restore(shell)
            continue
        shell.run_cell(CHECK)
        after = shell.user_ns.get("after")
        if not _right(after):
            left.append(f"call {at} ({injector.where}): the next report is {after!r}")
        shell.user_ns.pop("after", None)
    assert not left, f"{len(left)} of {total} interrupted calls left something:\n" + "\n".join(
        left[:30]
    )


def _restore(shell: InteractiveShell) -> None:
    """Reload the extension, so that one failure does not cascade into every later run."""
    shell.run_line_magic("unload_ext", "jupyter_gpumem")
    shell.run_line_magic("load_ext", "jupyter_gpumem")


@pytest.mark.timeout(1200)
def test_every_call_of_a_trial_interrupted_leaves_nothing_behind() -> None:
    from torch import nn

    from jupyter_gpumem.techniques import Config
    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters())
    trial = Trial(
        model,
        torch.randn(8, 16),
        lambda m, b: m(b).square().mean(),
        optimizer=opt,
        warmup=0,
        steps=1,
    )
    weights = [p.detach().clone() for p in model.parameters()]
    clean = _state()
    expected = trial.run(Config()).peak_allocated_bytes
    total = _injected(lambda: trial.run(Config()), None).calls
    assert total > 100 and expected

    def injected_at(share: int, shares: int) -> tuple[int, list[str], str, int | None]:
        """Every ``shares``-th call from ``share`` interrupted in turn, in a child forked from
        this clean state, up to the last a whole run makes there (a run or two makes a few
        calls more or fewer than another); those calls, what was left behind, the run after."""
        there = _injected(lambda: trial.run(Config()), None).calls
        left: list[str] = []
        for at in range(1 + share, max(total, there) + 1, shares):
            injector = _injected(lambda: trial.run(Config()), at)
            now = _state()
            if now != clean:
                changed = {k: now[k] for k in now if now[k] != clean[k]}
                left.append(f"call {at} ({injector.where}): {changed}")
                break
            if not all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True)):
                left.append(f"call {at} ({injector.where}): the model's weights were not put back")
                break
        again = trial.run(Config())
        return there, left, again.status, again.peak_allocated_bytes

    # the calls split among the cores, each share run in turn in a child of its own
    shares = max(1, min(cores(), 4))
    done = run_forked([lambda k=k: injected_at(k, shares) for k in range(shares)])
    assert all(d.error is None for d in done), [d.error for d in done]
    for there, left, status, peak in (d.value for d in done):
        assert there > 100  # the child's run went through our code as this one's did
        assert not left, "\n".join(left)
        assert status == "ok" and peak == expected


ASYNC_CELL = """%%gpumem -o r --quiet
import asyncio
await asyncio.sleep(0)
loss = model(x).square().mean()
"""


def _traced(run: Callable[[], Any], at: int | None) -> tuple[Injector, Any]:
    """``run()`` with a KeyboardInterrupt injected at our ``at``-th call; what it returned."""
    injector = Injector(at)
    sys.settrace(injector)
    try:
        return injector, run()
    except KeyboardInterrupt:
        pytest.fail(f"the interrupt at call {at} ({injector.where}) escaped")
    finally:
        sys.settrace(None)


def _cut_cells(shell: InteractiveShell) -> list[Any]:
    """The transformer's callback that forgets a cell a Ctrl-C cut, once the cell has run."""
    from jupyter_gpumem.ipython.cell_run import AwaitTransform

    return [
        c
        for c in shell.events.callbacks["post_execute"]
        if isinstance(getattr(c, "__self__", None), AwaitTransform)
    ]


@pytest.mark.parametrize("cell", [CELL, ASYNC_CELL], ids=["sync-body", "async-body"])
def test_a_ctrl_c_before_the_body_runs_is_the_cells_keyboard_interrupt(
    cell_shell: InteractiveShell, cell: str
) -> None:
    """IPython reads each cell through our input transformer outside the cell's own error
    handling, then the magic reads its options. A Ctrl-C at any of those calls fails the cell
    with KeyboardInterrupt, as one in the plain cell's code does; the same cell then runs.

    The first call is left out: it lands on the instruction that enters the transformer, in
    IPython's reading of the cell, as it does for every cell."""
    shell = cell_shell
    listeners = shell.events.callbacks["post_execute"][:]
    clean = {**_state(), **_shell_state(shell)}
    names = _traced(lambda: shell.run_cell(cell), None)[0].names
    assert shell.user_ns.pop("r").status == "ok"
    # from _tracked on, the measurement: test_every_call_of_a_cell_interrupted_... covers it
    first = names.index("_tracked")
    assert "gpumem" in names[:first]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for at in range(2, first + 1):
            injector, result = _traced(lambda: shell.run_cell(cell), at)
            where = f"call {at} ({injector.where})"
            error = result.error_before_exec or result.error_in_exec
            assert isinstance(error, KeyboardInterrupt), where
            assert "r" not in shell.user_ns, where  # the body did not run
            assert {**_state(), **_shell_state(shell)} == clean, where
            assert shell.events.callbacks["post_execute"] == listeners, where
            assert shell.run_cell(cell).success, where
            assert shell.user_ns.pop("r").status == "ok", where
        del result, error
        gc.collect()  # the interrupted runs' frames, in cycles through their errors
    assert not [str(w.message) for w in caught if "never awaited" in str(w.message)]


def test_a_ctrl_c_while_ipykernel_reads_the_cell_fails_the_run_that_follows(
    cell_shell: InteractiveShell,
) -> None:
    """ipykernel reads a cell to choose its runner, then ``run_cell`` reads it again: a Ctrl-C
    in the first reading fails the run, and only that run."""
    shell = cell_shell
    names = _traced(lambda: shell.transform_cell(CELL), None)[0].names
    for at in range(2, len(names) + 1):
        _traced(lambda: shell.transform_cell(CELL), at)
        assert _cut_cells(shell), f"call {at}"
        result = shell.run_cell(CELL)
        assert isinstance(result.error_in_exec, KeyboardInterrupt), f"call {at}"
        assert not _cut_cells(shell) and "r" not in shell.user_ns
        assert shell.run_cell(CELL).success and shell.user_ns.pop("r").status == "ok"
