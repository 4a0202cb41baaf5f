"""Iterations of the cell's own top-level loops: the steps of a CPU cell that counts none.

A cell that steps no optimizer and calls no root module (a loop over plain tensors with a
hand-written update) still repeats itself: its loop. :class:`LoopWatch` counts the
iterations of the cell's outermost ``for`` and ``while`` loops, found in its source
(:func:`outer_loops`: not inside another loop or a function): every return to a loop's header
line after the first is one iteration done, and a safe place to step aside (the cell's own
code runs there, outside any op and any backward).

It watches through the thread's trace function (``sys.settrace``), the cell's own code only:
any other frame costs one call event, which returns at once. Where a debugger or coverage tool
already traces the thread, it does not start. A loop in a function the cell calls is not
counted; the caller's deadline stands for it.
"""

from __future__ import annotations

import ast
import logging
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from jupyter_gpumem.tracking.dynamo_skip import run_plainly

log = logging.getLogger(__name__)


_NOT_THE_CELLS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def outer_loops(source: str) -> frozenset[int]:
    """The header lines of the loops in ``source`` that no loop or function holds; none where
    it is not Python."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    found: set[int] = set()
    todo: list[ast.AST] = [tree]  # a stack, not a recursive closure: no cycle left to collect
    while todo:
        for child in ast.iter_child_nodes(todo.pop()):
            if isinstance(child, (ast.For, ast.AsyncFor, ast.While)):
                found.add(child.lineno)
            elif not isinstance(child, _NOT_THE_CELLS):
                todo.append(child)
    return frozenset(found)


class LoopWatch:
    """Calls ``on_iteration(n)`` each time an outermost loop of the cell, one of whose header
    lines is in ``headers``, has run ``n`` iterations; stops once that returns True."""

    def __init__(
        self, cell: str, headers: frozenset[int], on_iteration: Callable[[int], bool]
    ) -> None:
        self.cell = cell  # the filename the cell's code was compiled with
        self.headers = headers
        self.on_iteration = on_iteration
        self._frame: FrameType | None = None  # the cell's code being counted
        self._returns: dict[int, int] = {}  # header line -> how often it was reached
        self._active = False

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> bool:
        """Watch the statements this thread runs from now; False where another trace function
        owns the thread."""
        if self._active:
            return True
        if not self.headers or sys.gettrace() is not None:
            return False
        run_plainly(self._call, self._lines)  # see dynamo_skip
        self._active = True  # first: an interrupt between the two leaves stop() its work
        sys.settrace(self._call)
        return True

    def stop(self) -> None:
        """Stop watching; safe to call when not started, and again. From another thread
        than the one watched, the trace function stays there, answering nothing, until a
        ``stop()`` on that thread takes it away."""
        if sys.gettrace() == self._call:
            sys.settrace(None)
        self._active = False
        if self._frame is not None and self._frame.f_trace == self._lines:
            self._frame.f_trace = None
        self._frame = None  # it holds the user's locals: let it go

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if not self._active or code.co_name != "<module>" or code.co_filename != self.cell:
            return None  # not a statement of the cell: its lines are not traced
        self._frame, self._returns = frame, {}
        return self._lines

    def _lines(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self._active or frame is not self._frame:
            return None
        line = frame.f_lineno
        if event == "line" and line in self.headers:
            reached = self._returns[line] = self._returns.get(line, 0) + 1
            if reached > 1:
                self._iterated(reached - 1)
        return self._lines if self._active else None

    def _iterated(self, n: int) -> None:
        try:
            done = self.on_iteration(n)
        except Exception:
            log.warning("jupyter_gpumem: counting the cell's loop failed", exc_info=True)
            done = True
        if done:
            self.stop()
