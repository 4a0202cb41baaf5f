"""Work done in forked children: every outcome comes back in order, and a Ctrl-C ends them all."""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings
from pathlib import Path
from types import FrameType

import pytest

from jupyter_gpumem.tuner.estimation.forked import Done, run_forked

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or sys.platform == "darwin", reason="estimates fork on Linux only"
)


def _recorded_forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    children: list[int] = []
    fork = os.fork

    def recorded() -> int:
        pid = fork()
        if pid:
            children.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", recorded)
    return children


def test_an_interrupt_ends_every_child_and_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    children = _recorded_forks(monkeypatch)

    def ctrl_c(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    t0 = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_forked([lambda: time.sleep(60)] * 3, processes=2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert time.perf_counter() - t0 < 30  # not the children's minute
    assert len(children) == 2  # the third never started
    for pid in children:
        with pytest.raises(ChildProcessError):  # ended and waited for: no zombie left
            os.waitpid(pid, os.WNOHANG)


def _warns_and_returns(k: int) -> int:
    warnings.warn(f"work {k} warned", stacklevel=1)
    warnings.warn(f"work {k} warned", stacklevel=1)
    return k * k


def _fails() -> None:
    raise ValueError("no")


def test_values_warnings_and_errors_come_back_in_order_of_the_works() -> None:
    works = [lambda k=k: _warns_and_returns(k) for k in range(5)]
    done = run_forked([*works[:2], _fails, *works[2:]], processes=2)
    assert [d.value for d in done] == [0, 1, None, 4, 9, 16]
    assert done[1] == Done(1, ("work 1 warned",))  # each message once
    assert done[2].error == "ValueError: no"


def test_a_result_that_cannot_be_pickled_is_an_error_not_a_hang() -> None:
    (done,) = run_forked([lambda: lambda: None])
    assert done.value is None
    assert done.error is not None and "could not be sent back" in done.error


def test_a_large_result_comes_back_whole() -> None:
    (done,) = run_forked([lambda: b"x" * (5 << 20)])  # larger than a pipe's buffer many times
    assert done.value == b"x" * (5 << 20)


def _meet(folder: Path, k: int, others: int) -> int:
    """Wait until ``others`` more works have started beside this one: true only if they run
    at once."""
    (folder / str(k)).touch()
    deadline = time.monotonic() + 60
    while len(list(folder.iterdir())) < others + 1:
        if time.monotonic() > deadline:
            return -1
        time.sleep(0.01)
    return k


def test_the_works_run_at_once_up_to_the_processes_given(tmp_path: Path) -> None:
    done = run_forked([lambda k=k: _meet(tmp_path, k, 2) for k in range(3)], processes=3)
    assert [d.value for d in done] == [0, 1, 2]
