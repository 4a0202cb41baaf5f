"""The random generators' state (torch, CUDA, Python, NumPy): read, put back, kept around a run.

Trials restore it between configurations, and a fake run leaves it as it found it
(checkpointing and dropout draw from it). CUDA's generators are read only where CUDA is
already up: ``torch.cuda.is_available()`` would initialise the driver, and a kernel that
did could no longer fork ranks that use CUDA (they would be spawned, at a higher cost).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def rng_state(torch: Any) -> dict[str, Any]:
    """Every generator's state now."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def set_rng_state(torch: Any, state: dict[str, Any]) -> None:
    """Put back what :func:`rng_state` read."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])


@contextmanager
def rng_kept(torch: Any) -> Iterator[None]:
    """The random generators as they were, whatever the block does."""
    state = rng_state(torch)
    try:
        yield
    finally:
        set_rng_state(torch, state)
