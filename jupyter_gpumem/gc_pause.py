"""Our own work runs with Python's cycle collector paused.

Before and after a cell, `%%gpumem` makes many short-lived objects (a layout read, a trace
parsed, the analysis) in no reference cycle, so reference counting frees each as soon as we
drop it. A collection that runs while they are alive moves them into an older generation and
counts them towards the next full collection, which in a kernel holding millions of objects
is the slowest thing Python does (hundreds of milliseconds). Pausing the collector while we
work keeps them out of it; the user's code always runs with the collector as they left it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside the block; the collector is as it was after it."""
    if not gc.isenabled():  # the user's choice, or an outer pause
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def pausing(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run inside :func:`paused`."""

    @wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with paused():
            return fn(*args, **kwargs)

    return run
