"""A step-time change against a baseline, and whether it stands out of the timing noise.

Repeated steps of one configuration do not take the same time (other processes, caches, a
CPU's clock). Where the timings of either configuration spread (slowest less fastest) as far
as their medians differ, the change is *within noise*: it is written so, never as a
percentage. A change is made once, by :func:`step_change`, and every rendering (reasoning
text, HTML, the tuner's table and charts) writes it through :func:`figure`, so one change has
one figure wherever it appears.

Pure: numbers in, numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["WITHIN_NOISE", "StepChange", "figure", "spread", "step_change", "widest"]

WITHIN_NOISE = "within noise"


@dataclass(frozen=True)
class StepChange:
    """A step time against the baseline's, with the noise it is read against."""

    step_s: float
    base_s: float  # above 0
    noise_s: float | None  # the wider spread of the two's repeated timings; None: unknown

    @property
    def delta_s(self) -> float:
        return self.step_s - self.base_s

    @property
    def pct(self) -> float:
        """The change in % of the baseline's step, unrounded (for analysis, not for display)."""
        return 100 * self.delta_s / self.base_s

    @property
    def within_noise(self) -> bool:
        """Whether the timings spread at least as far as the change: it may be noise."""
        return self.noise_s is not None and abs(self.delta_s) <= self.noise_s

    @property
    def figure(self) -> str:
        """``+25%``, or ``within noise``."""
        return figure(self.pct, self.within_noise)

    def against(self, baseline: str) -> str:
        """``+25% against the baseline``, or ``within noise of the baseline``."""
        if self.within_noise:
            return f"{WITHIN_NOISE} of {baseline}"
        return f"{self.figure} against {baseline}"


def figure(pct: float, within_noise: bool) -> str:
    """How every rendering writes a change: ``+25%`` (whole %, never ``-0%``), or
    ``within noise``."""
    return WITHIN_NOISE if within_noise else f"{round(pct):+d}%"


def spread(times: Sequence[float]) -> float | None:
    """How far repeated timings spread: the slowest less the fastest; None for fewer than two."""
    return max(times) - min(times) if len(times) > 1 else None


def widest(*spreads: float | None) -> float | None:
    """The widest of the known spreads; None where none is known."""
    known = [s for s in spreads if s is not None]
    return max(known) if known else None


def step_change(
    step_s: float | None, base_s: float | None, *spreads: float | None
) -> StepChange | None:
    """``step_s`` against ``base_s``, read against the widest of ``spreads`` (each
    configuration's); None where either time is unknown or the baseline's is not above 0."""
    if step_s is None or base_s is None or base_s <= 0:
        return None
    return StepChange(step_s, base_s, widest(*spreads))
