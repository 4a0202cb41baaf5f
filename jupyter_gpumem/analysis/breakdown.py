"""What the peak was made of, when it happened, and which tensors the cell left behind.

Pure: takes the replay, the tags and phase marks recorded by the hooks, and the
storages named in the user's namespace, and returns plain records.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jupyter_gpumem.analysis.replay import Live, round_size
from jupyter_gpumem.records import (
    BlockState,
    NamedStorage,
    PhaseMark,
    Tag,
    TraceEvent,
    allocated_by_communication,
)

CATEGORIES = (
    "parameters", "gradients", "optimizer_state", "activations", "inputs", "other", "temporary", "unattributed",
    "communication", "allocator_slack",
)  # fmt: skip
# A block holds its tensor's request plus the allocator's slack: the rounding up to 512 bytes,
# and the rest of a cached free block too small to split off. The request counts in the
# tensor's category, so fp32 parameters are 4 bytes each whatever the cache's layout was.
ALLOCATOR_SLACK = "allocator_slack"
# When a storage carries several tags, the most specific wins.
_PRIORITY = {"parameters": 0, "optimizer_state": 1, "gradients": 2, "inputs": 3, "activations": 4}
CUDA_CLOCK_SLACK_US = 2_000  # the allocator's clock and Python's agree to well within this


@dataclass(frozen=True)
class TensorRecord:
    """A tensor the cell left alive, or one of the largest it freed."""

    name: str | None
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int
    device: str
    line: str | None  # "cell line 3" or "file.py:42"
    alive: bool

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "shape": list(self.shape) if self.shape is not None else None}


def categorize(
    blocks: Sequence[Live],
    events: Sequence[TraceEvent],
    tags: Sequence[Tag],
    start_blocks: Sequence[Live],
    named: Mapping[int, NamedStorage],
    *,
    clock_slack_us: int = 0,
) -> dict[str, int]:
    """Bytes per category for ``blocks``; the values sum to the blocks' total, exactly.

    Each block's request counts in its category and the rest of the block in ``ALLOCATOR_SLACK``.

    A tag belongs to a block when it was taken during the block's life (within
    ``clock_slack_us`` where the events and tags use different clocks) and names a
    storage of the block's requested size.
    """
    by_address: dict[int, list[Tag]] = {}
    for tag in tags:
        by_address.setdefault(tag.address, []).append(tag)
    allocs_at = _alloc_times(events)
    freed = freed_in_cell(events, start_blocks)
    out = dict.fromkeys(CATEGORIES, 0)
    for block in blocks:
        category = _category(block, events, by_address, allocs_at, freed, named, clock_slack_us)
        request = min(block.requested_size, block.size)
        out[category] += request
        out[ALLOCATOR_SLACK] += block.size - request
    return out


def _category(
    block: Live,
    events: Sequence[TraceEvent],
    by_address: Mapping[int, list[Tag]],
    allocs_at: Mapping[int, list[int]],
    freed: set[tuple[int, int]],
    named: Mapping[int, NamedStorage],
    slack: int,
) -> str:
    born = events[block.event_index].time_us if block.event_index >= 0 else None
    reborn = allocs_at.get(block.address, ())
    valid = []
    for tag in by_address.get(block.address, ()):
        if born is not None and (tag.time_us + slack < born or tag.nbytes != block.requested_size):
            continue  # a tag of an earlier storage at the same address
        # a later alloc at this address, before the tag, means the tag is of a later storage
        after = 0 if born is None else bisect.bisect_right(reborn, born)
        if after < len(reborn) and reborn[after] <= tag.time_us - slack:
            continue
        valid.append(tag.category)
    if valid:
        return min(valid, key=_PRIORITY.__getitem__)
    if born is not None and allocated_by_communication(events[block.event_index].frames):
        return "communication"  # all-gather and reduce-scatter buffers, DDP's buckets
    if (block.address, block.event_index) in freed:
        return "temporary"
    hit = named.get(block.address)
    if hit is not None:
        return hit.category or "other"
    return "unattributed"


def freed_in_cell(
    events: Sequence[TraceEvent], start_blocks: Sequence[Live]
) -> set[tuple[int, int]]:
    """(address, alloc event index) of every block freed during the cell; -1 for older blocks."""
    current = {b.address: -1 for b in start_blocks}
    freed: set[tuple[int, int]] = set()
    for i, ev in enumerate(events):
        if ev.action == "alloc":
            current[ev.address] = i
        elif ev.action == "free_requested" and ev.address in current:
            freed.add((ev.address, current.pop(ev.address)))
    return freed


def _alloc_times(events: Sequence[TraceEvent]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for ev in events:
        if ev.action == "alloc":
            out.setdefault(ev.address, []).append(ev.time_us)
    return out


def peak_phase(
    marks: Sequence[PhaseMark], peak_time_us: int | None
) -> tuple[str | None, int | None]:
    """The phase and loop step the cell was in at the peak; (None, None) without marks."""
    if not marks or peak_time_us is None:
        return None, None
    times = [m.time_us for m in marks]
    i = bisect.bisect_right(times, peak_time_us) - 1
    if i < 0:
        return "other", marks[0].step
    return marks[i].phase, marks[i].step


def tensor_records(
    events: Sequence[TraceEvent],
    named: Mapping[int, NamedStorage],
    *,
    device: str,
    cell: tuple[str, int] | None,
    top: int,
    marks: Sequence[PhaseMark] = (),
) -> tuple[TensorRecord, ...]:
    """Storages the cell allocated and left alive (named where possible), then the largest it freed."""
    born: dict[int, TraceEvent] = {}
    freed: list[TraceEvent] = []
    for ev in events:
        if ev.action == "alloc":
            born[ev.address] = ev
        elif ev.action == "free_requested" and ev.address in born:
            freed.append(born.pop(ev.address))
    alive = []
    for address, ev in born.items():
        n = named.get(address)
        alive.append(
            TensorRecord(
                name=n.name if n else None,
                shape=n.shape if n else None,
                dtype=n.dtype if n else None,
                nbytes=n.nbytes if n else ev.size,
                device=device,
                line=source_line(ev, cell) or _during(marks, ev),
                alive=True,
            )
        )
    alive.sort(key=lambda r: (r.name is None, -r.nbytes))
    gone = [
        TensorRecord(
            None,
            None,
            None,
            ev.size,
            device,
            source_line(ev, cell) or _during(marks, ev),
            alive=False,
        )
        for ev in sorted(freed, key=lambda e: -e.size)[:top]
    ]
    return tuple(alive[:top]) + tuple(gone)


def tensors_at_end(
    events: Sequence[TraceEvent],
    start_blocks: Sequence[Live],
    end_blocks: Sequence[BlockState],
    named: Mapping[int, NamedStorage],
    *,
    device: str,
    cell: tuple[str, int] | None,
    top: int,
    marks: Sequence[PhaseMark] = (),
) -> tuple[TensorRecord, ...]:
    """Like :func:`tensor_records` for a cell traced in part: what is alive comes from the
    allocator's layout at the end, where each block was made from the traced events."""
    before = {(b.address, b.size) for b in start_blocks}
    made: dict[int, TraceEvent] = {}
    for ev in events:
        if ev.action == "alloc":
            made[ev.address] = ev
    alive = []
    for block in end_blocks:
        if (block.address, block.size) in before:
            continue
        n = named.get(block.address)
        origin = made.get(block.address)
        line = None
        if origin is not None and round_size(origin.size) == block.size:
            line = source_line(origin, cell) or _during(marks, origin)
        alive.append(
            TensorRecord(
                name=n.name if n else None,
                shape=n.shape if n else None,
                dtype=n.dtype if n else None,
                nbytes=n.nbytes if n else block.size,
                device=device,
                line=line or "between the recorded steps",
                alive=True,
            )
        )
    alive.sort(key=lambda r: (r.name is None, -r.nbytes))
    gone = [
        r
        for r in tensor_records(events, named, device=device, cell=cell, top=top, marks=marks)
        if not r.alive
    ]
    return tuple(alive[:top]) + tuple(gone)


def _during(marks: Sequence[PhaseMark], ev: TraceEvent) -> str | None:
    """For allocations with no Python frame (autograd's engine thread): the phase they fell in."""
    phase, step = peak_phase(marks, ev.time_us)
    return None if phase is None else f"during {phase} (step {step})"


def source_line(ev: TraceEvent, cell: tuple[str, int] | None) -> str | None:
    """The cell line (as the editor numbers it), else the innermost frame outside torch."""
    fallback = None
    for frame in ev.frames:
        filename = str(frame.get("filename", ""))
        line = frame.get("line")
        if cell is not None and filename == cell[0] and isinstance(line, int):
            return f"cell line {line + cell[1]}"
        if (
            fallback is None
            and "/torch/" not in filename
            and "jupyter_gpumem" not in filename
            and filename
        ):
            fallback = f"{filename}:{line}"
    return fallback
