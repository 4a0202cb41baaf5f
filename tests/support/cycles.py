"""The objects of ours that only the cycle collector can free, apart from what reference
counting frees.

What a `%%gpumem` cell drops should go when its last reference does. Garbage in reference
cycles waits for a collection instead, and in a kernel holding millions of objects the
collections that reach it are the slow ones. Only our own objects are counted (instances of
our classes, our functions and methods): threads left by other tests make garbage of their own.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from IPython.core.interactiveshell import InteractiveShell

import jupyter_gpumem

PACKAGE = str(Path(jupyter_gpumem.__file__).parent)


def collected(run: Callable[[], object]) -> Counter[str]:
    """Call ``run``; our objects that only the cycle collector found afterwards, by kind."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        found = Counter(kind for o in gc.garbage if (kind := _ours(o)) is not None)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return found


def cyclic_garbage(shell: InteractiveShell, source: str) -> Counter[str]:
    """Run ``source`` as a cell; our objects only the cycle collector found, by kind."""
    results = []
    found = collected(lambda: results.append(shell.run_cell(source)))
    assert results[0].success, results[0].error_in_exec
    return found


def _ours(o: object) -> str | None:
    kind = type(o)
    if kind.__module__.startswith("jupyter_gpumem"):
        return f"{kind.__module__}.{kind.__qualname__}"
    code = getattr(o, "__code__", None) or getattr(getattr(o, "__func__", None), "__code__", None)
    if code is not None and code.co_filename.startswith(PACKAGE):
        return f"{kind.__qualname__} {code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"
    return None
