"""When a cell is recorded in detail, and the light hooks that follow it in between.

A training loop repeats itself: what users read in a report (breakdown at the peak,
its phase, the tensors involved) is decided in its first steps. So a cell is
recorded in full detail (allocator trace with Python stacks, tag hooks, the CPU
dispatch source) for its first ``steps`` training steps only; after that a single
optimizer hook reads the allocator's peak counters at step boundaries, twenty times
a second at most (a reading costs about 0.1 ms). When those counters show a peak
above every step seen so far, detail is switched on again for the next steps, so a
peak that comes late (a longer sequence at step 500) still gets its breakdown. The exact peak itself
never depends on the schedule: it comes from independent peak counters.

A step ends when an optimizer finishes ``step()``. A cell that never steps an
optimizer (inference, a hand-written update) counts forward calls of its root
modules instead: between windows, those are watched by a hook on each root module.
A CPU cell that counts neither (loops of tensor ops over plain tensors) is recorded in
detail for its first ``CPU_DETAIL_S`` seconds, up to the next statement of its own code
(:mod:`.safe_point`); the CPU has no peak counters, so later peaks are not followed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpumem.tracking.dynamo_skip import run_plainly

DETAIL_STEPS = 3  # optimizer steps recorded in detail at the start and after a new peak
DETAIL_FORWARDS = 8  # root-module forwards, for cells that never step an optimizer
MAX_REENTRIES = 2  # new detail windows after the first, per cell
SAMPLE_INTERVAL_S = 0.05  # at most one counter reading per device this often
CPU_DETAIL_S = 0.5  # a CPU cell without steps: seconds recorded in detail


@dataclass
class DetailSchedule:
    """Counts steps and says when a detailed window ends and when to sample."""

    steps: int = DETAIL_STEPS
    forwards: int = DETAIL_FORWARDS
    reentries: int = MAX_REENTRIES
    sample_interval_s: float = SAMPLE_INTERVAL_S
    optimizer_steps: int = 0
    root_forwards: int = 0
    window_began_at: int = 0  # position when the current window began
    windows: int = 1
    _last_sample: float = field(default=0.0, repr=False)

    @property
    def position(self) -> int:
        """The loop step the cell is in: optimizer steps done, else root forwards begun."""
        return self.optimizer_steps if self.optimizer_steps else self.root_forwards

    def boundary(self, kind: str) -> bool:
        """Count a boundary (``step`` or ``forward``); True if it is one the schedule uses."""
        if kind == "step":
            self.optimizer_steps += 1
            if self.optimizer_steps == 1:
                self.window_began_at = 0  # from here on steps, not forwards, are counted
            return True
        self.root_forwards += 1
        return self.optimizer_steps == 0

    def window_done(self) -> bool:
        done = self.position - self.window_began_at
        return done >= (self.steps if self.optimizer_steps else self.forwards)

    def sample_due(self) -> bool:
        now = time.perf_counter()
        if now - self._last_sample < self.sample_interval_s:
            return False
        self._last_sample = now
        return True

    def may_reenter(self) -> bool:
        return self.windows <= self.reentries

    def reentered(self) -> None:
        self.windows += 1
        self.window_began_at = self.position


class RootWatch:
    """Between detailed windows, the only module hooks left: one on each root module."""

    def __init__(self) -> None:
        self.on_forward: Callable[[Any, Any], None] | None = None
        self._handles: list[Any] = []

    def start(self, roots: Iterable[Any], on_forward: Callable[[Any, Any], None]) -> None:
        self.on_forward = on_forward
        run_plainly(self._forward)  # see dynamo_skip
        for module in roots:
            self._handles.append(module.register_forward_pre_hook(self._forward))

    def stop(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.on_forward = None  # holds the recorder: let it go with its cell

    def _forward(self, module: Any, args: Any) -> None:
        if self.on_forward is not None:
            self.on_forward(module, args)
