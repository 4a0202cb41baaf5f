"""The next statement of the user's own code: where a source may step aside mid-cell.

A dispatch mode cannot leave from inside an op (the op's dispatch is under way), nor
from inside a backward (the autograd engine restores the thread's modes when it
finishes). The cell's own code, and the user's functions it calls with no library frame
between, run outside both. :class:`NextStatement` is armed from inside an op: it marks
those frames on the stack, calls ``on_reached`` at the next statement one of them runs
or at the start of the cell's next top-level statement (IPython runs each as its own
code object), and disarms itself once that returns True.

Nothing is watched until it is armed. Python 3.12 and later are told through
``sys.monitoring``: LINE events on the marked frames' code only, and PY_START events, each
code object other than a cell's statement switched off at its first start; earlier Pythons
through the frames' ``f_trace`` (a thread's trace function is set while armed, so calls
made meanwhile pay a small cost). Where a debugger or coverage tool already traces the
thread, it does not arm.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from jupyter_gpumem.tracking.dynamo_skip import run_plainly

log = logging.getLogger(__name__)
_TOOL_IDS = (4, 3)  # sys.monitoring's ids that no well-known tool claims
_TOOL_NAME = "jupyter_gpumem"


class NextStatement:
    """Calls ``on_reached()`` at the next statement of the user's own code, once armed."""

    def __init__(
        self, cell: str, on_reached: Callable[[], bool], is_internal: Callable[[str], bool]
    ) -> None:
        self.cell = cell  # the filename the cell's code was compiled with
        self.on_reached = on_reached
        self.is_internal = is_internal
        self._frames: list[FrameType] = []
        self._codes: set[CodeType] = set()
        self._tool: int | None = None
        self._disable: Any = None  # sys.monitoring.DISABLE, while armed through it
        self._traced = False

    @property
    def armed(self) -> bool:
        return bool(self._frames)

    def arm(self) -> bool:
        """Mark the user's frames on this thread's stack; False where there are none."""
        if self._frames:
            return True
        frames = user_chain(sys._getframe(1), self.cell, self.is_internal)
        if not frames:
            return False
        run_plainly(self._line, self._start, self._trace, self._call)  # see dynamo_skip
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is not None:
            tool = next((i for i in _TOOL_IDS if monitoring.get_tool(i) is None), None)
            if tool is None:
                return False
            monitoring.use_tool_id(tool, _TOOL_NAME)
            self._tool, self._disable = tool, monitoring.DISABLE
            monitoring.register_callback(tool, monitoring.events.LINE, self._line)
            monitoring.register_callback(tool, monitoring.events.PY_START, self._start)
            monitoring.set_events(tool, monitoring.events.PY_START)
            self._frames = frames
            for frame in frames:
                if frame.f_code not in self._codes:
                    self._codes.add(frame.f_code)
                    monitoring.set_local_events(tool, frame.f_code, monitoring.events.LINE)
            return True
        if sys.gettrace() is not None:
            return False  # a debugger or coverage tool owns the thread's trace function
        self._frames = frames
        for frame in frames:
            frame.f_trace = self._trace
            frame.f_trace_lines = True
        sys.settrace(self._call)
        self._traced = True
        return True

    def disarm(self) -> None:
        """Stop watching; safe to call when not armed, and again."""
        if self._tool is not None:
            monitoring: Any = getattr(sys, "monitoring")  # noqa: B009  # Python 3.12+, not in 3.10's stubs
            for code in self._codes:
                monitoring.set_local_events(self._tool, code, 0)
            monitoring.set_events(self._tool, 0)
            monitoring.register_callback(self._tool, monitoring.events.LINE, None)
            monitoring.register_callback(self._tool, monitoring.events.PY_START, None)
            monitoring.free_tool_id(self._tool)
            self._tool = None
        self._codes.clear()
        if self._traced:
            if sys.gettrace() == self._call:
                sys.settrace(None)
            self._traced = False
            for frame in self._frames:
                if frame.f_trace == self._trace:
                    frame.f_trace = None
        self._frames.clear()  # frames hold the user's locals: let them go

    def _reached(self, frame: FrameType) -> None:
        if any(frame is f for f in self._frames):  # not the same code called back by a library
            self._fire()

    def _fire(self) -> None:
        try:
            done = self.on_reached()
        except Exception:
            log.warning("jupyter_gpumem: stepping aside failed", exc_info=True)
            done = True
        if done:
            self.disarm()

    def _is_statement(self, code: CodeType) -> bool:
        """A top-level statement of the cell (a function of the cell is not: torch may call it)."""
        return code.co_name == "<module>" and code.co_filename == self.cell

    def _line(self, code: CodeType, line: int) -> Any:
        self._reached(sys._getframe(1))

    def _start(self, code: CodeType, offset: int) -> Any:
        if not self._is_statement(code):
            return self._disable  # never a cell's statement: no more starts of it, at no cost
        self._fire()
        return None

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self._reached(frame)
        return self._trace if self._frames else None

    def _call(self, frame: FrameType, event: str, arg: Any) -> None:
        """The thread's trace function while armed: new frames are not traced."""
        if event == "call" and self._is_statement(frame.f_code):
            self._fire()


def user_chain(
    frame: FrameType | None, cell: str, is_internal: Callable[[str], bool]
) -> list[FrameType]:
    """The cell's frame (code compiled from ``cell``) and the user frames it called directly.

    From the outermost frame of the cell inward, up to the first library frame: empty where
    the cell's code is not on the stack.
    """
    stack: list[FrameType] = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    chain: list[FrameType] = []
    for f in reversed(stack):  # outermost first
        name = f.f_code.co_filename
        if not chain:
            if name == cell:
                chain.append(f)
        elif is_internal(name):
            break
        else:
            chain.append(f)
    return chain
