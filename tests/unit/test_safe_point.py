"""NextStatement: armed from deep in a call, it fires at the cell's next statement only."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from jupyter_gpumem.tracking.safe_point import NextStatement, user_chain

CELL = "<cell-7>"
EARLIER = "<cell-3>"  # a function the user defined in an earlier cell
LIBRARY = "/site-packages/lib.py"

LIB = """
def call_back(fn, *args):
    return fn(*args)
"""


def is_library(filename: str) -> bool:
    return filename == LIBRARY or not filename.startswith("<cell")


class Harness:
    """Runs code compiled as the cell, the earlier cell and the library; records each firing."""

    def __init__(self, *, done: bool = True) -> None:
        self.fired: list[tuple[str, int]] = []
        self.point = NextStatement(CELL, self._on_reached, is_library)
        self.done = done
        self.ns: dict[str, Any] = {"arm": self.arm, "point": self.point}
        exec(compile(LIB, LIBRARY, "exec"), self.ns)

    def _on_reached(self) -> bool:
        frame = sys._getframe(1)
        while frame.f_code.co_filename not in (CELL, EARLIER):
            frame = frame.f_back
        self.fired.append((frame.f_code.co_name, frame.f_lineno))
        return self.done

    def arm(self) -> bool:
        return self.point.arm()

    def run(self, source: str, filename: str = CELL) -> None:
        exec(compile(source, filename, "exec"), self.ns)


def test_it_fires_at_the_next_line_of_the_cell_not_in_code_a_library_calls_back() -> None:
    h = Harness()
    h.run(
        "def deep(x):\n"
        "    arm()\n"  # armed from code the library called: not a place to step aside
        "    y = x + 1\n"
        "    return y\n"
        "out = call_back(deep, 1)\n"
        "after = out\n"
    )
    assert h.fired == [("<module>", 6)]
    assert not h.point.armed and h.ns["after"] == 2


def test_it_fires_in_a_function_the_cell_called_directly() -> None:
    h = Harness()
    h.run("def train(n):\n    arm()\n    total = n\n    return total\n", EARLIER)
    h.run("result = call_back(lambda: 0) + train(3)\n")
    assert h.fired == [("train", 3)]


def test_it_fires_at_the_cells_next_top_level_statement() -> None:
    """IPython runs each top-level statement of a cell as its own code object."""
    h = Harness()
    h.run("def deep():\n    arm()\n    return 1\nx = call_back(deep)\n")
    assert h.fired == [] and h.point.armed
    h.run("y = x + 1\n")
    assert [name for name, _ in h.fired] == ["<module>"]  # as it starts, before its first line
    assert not h.point.armed


def test_it_stays_armed_until_the_callback_is_done() -> None:
    h = Harness(done=False)
    h.run("arm()\na = 1\nb = 2\n")
    assert h.fired == [("<module>", 2), ("<module>", 3)]
    assert h.point.armed
    h.point.disarm()
    assert not h.point.armed


def test_nothing_is_left_behind() -> None:
    trace = sys.gettrace()
    h = Harness(done=False)
    h.run("arm()\na = 1\n")
    h.point.disarm()
    h.point.disarm()  # again: nothing to do
    assert sys.gettrace() is trace
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        assert all(monitoring.get_tool(i) != "jupyter_gpumem" for i in range(6))
    fired = len(h.fired)
    h.run("c = 3\n")
    assert len(h.fired) == fired


def test_user_chain_stops_at_the_first_library_frame() -> None:
    ns: dict[str, Any] = {"user_chain": user_chain, "is_library": is_library, "CELL": CELL}
    exec(compile(LIB, LIBRARY, "exec"), ns)
    exec(
        compile(
            "def inner():\n    return user_chain(sys._getframe(), CELL, is_library)\n",
            EARLIER,
            "exec",
        ),
        {**ns, "sys": sys},
        ns,
    )
    source = "def f():\n    return inner()\nchain = f()\nthrough = call_back(f)\n"
    exec(compile(source, CELL, "exec"), ns)
    assert [fr.f_code.co_name for fr in ns["chain"]] == ["<module>", "f", "inner"]
    assert [fr.f_code.co_name for fr in ns["through"]] == ["<module>"]


@pytest.mark.skipif(hasattr(sys, "monitoring"), reason="Python 3.12+ arms through sys.monitoring")
def test_it_does_not_arm_under_a_debugger() -> None:
    h = Harness()
    previous = sys.gettrace()

    def debugger(frame: Any, event: str, arg: Any) -> None:
        return None

    sys.settrace(debugger)
    try:
        assert not h.arm()
        assert sys.gettrace() is debugger
    finally:
        sys.settrace(previous)
