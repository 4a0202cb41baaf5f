"""LoopWatch: the cell's outermost loops found in its source, their iterations counted at the
header, and the thread's trace function given back."""

from __future__ import annotations

import sys

from jupyter_gpumem.tracking.loop_iterations import LoopWatch, outer_loops

CELL = "<ipython-input-7-loops>"
SOURCE = """\
total = 0
for i in range(6):
    for j in range(4):
        total += j
while total > 100:
    total -= 50
def f():
    for k in range(3):
        pass
with open(__file__) if False else nullcontext():
    for m in range(2):
        total += m
"""


def test_outer_loops_are_those_no_loop_or_function_holds() -> None:
    assert outer_loops(SOURCE) == {2, 5, 11}
    assert outer_loops("x = (") == frozenset()  # not Python: nothing to count
    assert outer_loops("[i for i in range(3)]") == frozenset()


def test_iterations_are_counted_at_the_header_until_the_callback_says_done() -> None:
    seen: list[int] = []
    code = compile("total = 0\nfor i in range(6):\n    for j in range(4):\n        total += j\n", CELL, "exec")  # fmt: skip
    watch = LoopWatch(CELL, frozenset({2}), lambda n: seen.append(n) or n >= 3)
    before = sys.gettrace()
    assert watch.start()
    try:
        namespace: dict[str, int] = {}
        exec(code, namespace)
    finally:
        watch.stop()
    assert seen == [1, 2, 3]  # the inner loop's returns to its own header are not counted
    assert not watch.active and sys.gettrace() is before
    assert namespace["total"] == 36  # the cell ran as it would


def test_another_files_code_is_not_watched() -> None:
    seen: list[int] = []
    watch = LoopWatch(CELL, frozenset({1}), lambda n: seen.append(n) or False)
    assert watch.start()
    try:
        exec(compile("for i in range(5):\n    pass\n", "<other>", "exec"), {})
    finally:
        watch.stop()
    assert seen == []


def test_it_does_not_start_where_another_tool_traces_or_nothing_loops() -> None:
    assert not LoopWatch(CELL, frozenset(), lambda n: True).start()

    def tracer(frame: object, event: str, arg: object) -> None:
        return None

    sys.settrace(tracer)
    try:
        assert not LoopWatch(CELL, frozenset({2}), lambda n: True).start()
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
