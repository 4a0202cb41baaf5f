"""The objects a cell leaves for the cycle collector, apart from what reference counting frees.

What a `%%gpumem` cell drops should go when its last reference does. Garbage in reference
cycles waits for a collection instead, and in a kernel holding millions of objects the
collections that reach it are the slow ones.
"""

from __future__ import annotations

import gc
from collections import Counter

from IPython.core.interactiveshell import InteractiveShell


def cyclic_garbage(shell: InteractiveShell, source: str) -> Counter[str]:
    """Run ``source`` as a cell; what only the cycle collector found afterwards, by type."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        result = shell.run_cell(source)
        gc.collect()
        found = Counter(_kind(o) for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert result.success, result.error_in_exec
    return found


def _kind(o: object) -> str:
    code = getattr(o, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"{type(o).__module__}.{type(o).__qualname__}{where}"
