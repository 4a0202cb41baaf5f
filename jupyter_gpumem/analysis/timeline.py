"""The cell's memory over time: allocated and reserved after each event, with phase bands."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

PHASES = ("forward", "backward", "optimizer", "prefill", "decode", "other")


@dataclass(frozen=True)
class PhaseBand:
    """A stretch of the cell spent in one phase of one training step."""

    start_s: float  # seconds since the cell started
    end_s: float
    phase: str  # one of PHASES
    step: int  # 0-based iteration of the training loop


@dataclass(frozen=True)
class Timeline:
    """Allocated and reserved bytes over the cell; the peak and the phases marked."""

    t_s: tuple[float, ...]  # seconds since the cell started, one per point
    allocated_bytes: tuple[int, ...]
    reserved_bytes: tuple[int, ...]
    bands: tuple[PhaseBand, ...]
    peak_t_s: float
    peak_bytes: int

    def to_dict(self) -> dict[str, object]:
        return {
            "t_s": list(self.t_s),
            "allocated_bytes": list(self.allocated_bytes),
            "reserved_bytes": list(self.reserved_bytes),
            "bands": [b.__dict__ for b in self.bands],
            "peak_t_s": self.peak_t_s,
            "peak_bytes": self.peak_bytes,
        }


def extended(tl: Timeline, end_s: float, end_bytes: int) -> Timeline:
    """``tl`` with its last point at ``end_s`` holding ``end_bytes``: a cell followed in detail
    for its first steps only still spans its whole length, its end state known."""
    if tl.t_s and end_s <= tl.t_s[-1]:
        return tl
    higher = end_bytes > tl.peak_bytes
    return Timeline(
        t_s=(*tl.t_s, end_s),
        allocated_bytes=(*tl.allocated_bytes, end_bytes),
        reserved_bytes=(*tl.reserved_bytes, end_bytes),
        bands=tl.bands,
        peak_t_s=end_s if higher else tl.peak_t_s,
        peak_bytes=end_bytes if higher else tl.peak_bytes,
    )


def held_until(tl: Timeline, end_s: float) -> Timeline:
    """``tl`` to ``end_s``, its last figures held after its last event: the time axis spans
    the whole cell, also where the cell raised or ran on without allocating."""
    if not tl.t_s or end_s <= tl.t_s[-1]:
        return tl
    return replace(
        tl,
        t_s=(*tl.t_s, end_s),
        allocated_bytes=(*tl.allocated_bytes, *tl.allocated_bytes[-1:]),
        reserved_bytes=(*tl.reserved_bytes, *tl.reserved_bytes[-1:]),
    )


def downsample(
    t_s: Sequence[float], allocated: Sequence[int], reserved: Sequence[int], max_points: int = 800
) -> tuple[tuple[float, ...], tuple[int, ...], tuple[int, ...]]:
    """At most ``max_points`` points, keeping each bucket's maximum so no peak is lost."""
    n = len(t_s)
    if n <= max_points:
        return tuple(t_s), tuple(allocated), tuple(reserved)
    size = -(-n // max_points)
    ts, al, re = [], [], []
    for start in range(0, n, size):
        stop = min(n, start + size)
        top = max(range(start, stop), key=allocated.__getitem__)
        ts.append(t_s[top])
        al.append(allocated[top])
        re.append(max(reserved[start:stop]))
    return tuple(ts), tuple(al), tuple(re)
