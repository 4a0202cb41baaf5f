"""A Ctrl-C while the ranks are played in a forked child ends the child at once."""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType

import pytest

from jupyter_gpumem.tuner.estimation import rank_estimates

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or sys.platform == "darwin", reason="the ranks fork on Linux only"
)


def test_an_interrupt_ends_the_child_and_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    children: list[int] = []
    fork = os.fork

    def recorded() -> int:
        pid = fork()
        if pid:
            children.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", recorded)

    def ctrl_c(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    t0 = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            rank_estimates._forked(lambda: time.sleep(60))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert time.perf_counter() - t0 < 30  # not the child's minute
    assert len(children) == 1
    with pytest.raises(ChildProcessError):  # ended and waited for: no zombie left
        os.waitpid(children[0], os.WNOHANG)


def test_the_childs_answer_and_its_error_come_back() -> None:
    assert rank_estimates._forked(lambda: 41 + 1) == (42, [])
    with pytest.raises(RuntimeError, match="estimating the ranks failed: ValueError: no"):
        rank_estimates._forked(lambda: (_ for _ in ()).throw(ValueError("no")))
