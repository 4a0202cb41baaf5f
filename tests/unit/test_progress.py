"""A long call's line: nothing within two seconds, then what runs now, gone at the end."""

from __future__ import annotations

import io
import sys

import pytest

from jupyter_gpumem.tuner import progress as progress_module
from jupyter_gpumem.tuner.progress import Progress, progress_of


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Seen:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.closed = 0

    def show(self, text: str) -> None:
        self.lines.append(text)

    def close(self) -> None:
        self.closed += 1


def test_a_line_appears_past_two_seconds_and_goes_at_the_end() -> None:
    clock, seen = _Clock(), _Seen()
    with Progress("search", view=seen, clock=clock) as line:
        line("estimating baseline")
        clock.now += 1.5
        line("estimating bf16-autocast")
        assert seen.lines == []  # a call that ends within the delay shows nothing
        clock.now += 1.0
        line("timing bf16-autocast, every block checkpointed")
        clock.now += 12.2
        line("confirming bf16-autocast")
    assert seen.lines == [
        "search: 2 s, 2 done; timing bf16-autocast, every block checkpointed",
        "search: 15 s, 3 done; confirming bf16-autocast",
    ]
    assert seen.closed == 1


def test_a_call_within_the_delay_closes_nothing() -> None:
    seen = _Seen()
    with Progress("plan", view=seen, clock=_Clock()) as line:
        line("profiling the blocks")
    assert seen.lines == [] and seen.closed == 0


def test_an_error_still_clears_the_line() -> None:
    clock, seen = _Clock(), _Seen()
    with pytest.raises(KeyboardInterrupt), Progress("search", view=seen, clock=clock) as line:
        clock.now += 3
        line("estimating baseline")
        raise KeyboardInterrupt
    assert len(seen.lines) == 1 and seen.closed == 1


def test_progress_true_false_or_a_callable() -> None:
    with progress_of(True, "search") as line:
        assert isinstance(line, Progress) and line.what == "search"
    with progress_of(False, "search") as line:
        assert line is None
    said: list[str] = []
    with progress_of(said.append, "search") as line:
        assert line is not None
        line("estimating baseline")
    assert said == ["estimating baseline"]
    with (
        pytest.raises(TypeError, match=r"progress must be True .* or a callable"),
        progress_of("yes", "search"),
    ):
        pass


def test_a_terminal_gets_its_last_line_rewritten(monkeypatch: pytest.MonkeyPatch) -> None:
    class _Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(progress_module, "_kernel_shell", lambda: None)
    clock = _Clock()
    with Progress("search", clock=clock) as line:
        clock.now += 2
        line("estimating a long configuration name")
        line("timing it")
    out = err.getvalue()
    assert out.startswith("\rsearch: 2 s, 0 done; estimating a long configuration name")
    assert "\rsearch: 2 s, 1 done; timing it" in out and out.endswith("\r")


def test_nowhere_to_show_shows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    monkeypatch.setattr(progress_module, "_kernel_shell", lambda: None)
    assert progress_module.here() is None
    clock = _Clock()
    with Progress("search", clock=clock) as line:
        clock.now += 5
        line("estimating baseline")
    assert sys.stderr.getvalue() == ""


def test_a_notebook_gets_one_display_updated_in_place_then_emptied() -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()
    line = progress_module._CellLine()
    with capture_output() as captured:
        line.show("search: 2 s, 0 done; estimating baseline")
        line.show("search: 3 s, 1 done; timing baseline")
        line.close()
    shown = [o.data["text/plain"] for o in captured.outputs]
    assert shown == [
        "search: 2 s, 0 done; estimating baseline",
        "search: 3 s, 1 done; timing baseline",
        "",
    ]
    assert [o.update for o in captured.outputs] == [False, True, True]  # one display, in place
    ids = {o.transient["display_id"] for o in captured.outputs}
    assert len(ids) == 1
