"""What a long call is doing, shown once it has run two seconds, gone when it returns.

``trial.search()`` and ``trial.plan()`` estimate, time and measure one configuration after
another. Past :data:`DELAY_S` a line says how long the call has run, how many of its steps are
done and which one runs now ("search: 14 s, 23 done; estimating ckpt 12 modules · bf16-autocast"): under the
cell in a notebook (an IPython display that is updated in place, so Jupyter, VS Code and Colab
all show it, widgets or not), on the terminal's last line where stderr is one, nowhere else.
A call that returns within the delay shows nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Protocol

DELAY_S = 2.0


class View(Protocol):
    def show(self, text: str) -> None: ...
    def close(self) -> None: ...


class Progress:
    """A callable for the calls' ``progress=``: each call is a step beginning, told by its line."""

    def __init__(
        self,
        what: str,
        *,
        delay_s: float = DELAY_S,
        view: View | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.what = what
        self.delay_s = delay_s
        self.done = -1  # the steps before the one running now
        self._clock = clock
        self._t0 = clock()
        self._view = view
        self._shown = False

    def __call__(self, line: str) -> None:
        self.done += 1
        elapsed = self._clock() - self._t0
        if elapsed < self.delay_s:
            return
        if self._view is None:
            self._view = here()
            if self._view is None:
                return
        self._shown = True
        self._view.show(f"{self.what}: {elapsed:.0f} s, {self.done} done; {line}")

    def close(self) -> None:
        if self._shown and self._view is not None:
            self._view.close()
        self._shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


@contextmanager
def progress_of(progress: Any, what: str) -> Iterator[Callable[[str], None] | None]:
    """What a call's ``progress=`` argument asks for, for the call's duration: True a
    :class:`Progress` line (closed when the call ends, however it ends), False none, a
    callable itself (called with each step's line)."""
    if progress is True:
        with Progress(what) as line:
            yield line
        return
    if progress is False or progress is None:
        yield None
        return
    if not callable(progress):
        raise TypeError(
            f"progress must be True (a line past {DELAY_S:.0f} s), False or a callable taking "
            f"each step's line, got {progress!r}"
        )
    yield progress


def here() -> View | None:
    """Where this process shows a line: the notebook's cell output, else a terminal."""
    shell = _kernel_shell()
    if shell is not None:
        return _CellLine()
    if sys.stderr is not None and sys.stderr.isatty():
        return _TerminalLine()
    return None


def _kernel_shell() -> Any:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    shell = ipython.get_ipython()
    return shell if getattr(shell, "kernel", None) is not None else None


class _CellLine:
    """One display under the running cell, updated in place and emptied at the end."""

    def __init__(self) -> None:
        self._handle: Any = None

    def show(self, text: str) -> None:
        from IPython.display import display

        bundle = {"text/plain": text}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)


class _TerminalLine:
    """The terminal's last line, rewritten in place and cleared at the end."""

    def __init__(self) -> None:
        self._width = 0

    def show(self, text: str) -> None:
        line = text[:119]
        sys.stderr.write("\r" + line.ljust(self._width))
        sys.stderr.flush()
        self._width = len(line)

    def close(self) -> None:
        sys.stderr.write("\r" + " " * self._width + "\r")
        sys.stderr.flush()
