"""Our code that torch calls back is run by Dynamo as plain Python, never compiled.

After a graph break, ``torch.compile``d code runs on eagerly with Dynamo's frame hook still
set: an op there enters our dispatch mode, a storage freed there calls our weakref callback,
a new line calls our trace function. Each is a Python frame that Dynamo would compile as if
it were the user's, with graphs, graph breaks and warnings (``time.time_ns``) that the plain
cell does not have, and with our bookkeeping compiled away. These entry points are marked on
their code objects so that Dynamo runs them, and all they call, untouched: no wrapper frame
(a failing op's traceback stays the plain cell's) and no cost per call. Where Dynamo traces
a call to a marked function (a module hook inside a compiled forward) it still inlines it.

Known limitations: a torch without ``torch._C._dynamo.eval_frame.set_code_exec_strategy``
cannot mark code; there these frames may still be compiled.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def run_plainly(*functions: Callable[..., Any]) -> None:
    """Have Dynamo run ``functions`` (plain or bound), and all they call, as plain Python.

    Marks are kept on the code objects; marking again is cheap and harmless.
    """
    torch = sys.modules.get("torch")
    dynamo = getattr(getattr(torch, "_C", None), "_dynamo", None)
    eval_frame = getattr(dynamo, "eval_frame", None)
    mark = getattr(eval_frame, "set_code_exec_strategy", None)
    strategy = getattr(eval_frame, "_FrameExecStrategy", None)
    action = getattr(eval_frame, "_FrameAction", None)
    if mark is None or strategy is None or action is None:
        return
    skip = strategy(action.SKIP, action.SKIP)  # this frame, and every frame it calls
    for fn in functions:
        mark(getattr(fn, "__func__", fn).__code__, skip)
