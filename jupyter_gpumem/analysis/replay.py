"""Replay the CUDA caching allocator's trace to get exact per-interval peaks.

The allocator's trace records *requested* sizes, while its ``allocated_bytes``
counter (``torch.cuda.memory_allocated``) counts *block* sizes: the request
rounded up, or a whole free block when the remainder was too small to split.
To reproduce the counter to the byte, the replay keeps a model of every
segment's blocks, starting from the layout at the start of the interval, and
applies the allocator's rounding and split rules to each event.

Pure: takes plain records, touches neither torch nor CUDA.

Known limitations:
- Expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``),
  ``roundup_power2_divisions`` and ``max_split_size_mb`` change the block rules;
  the replay then reports itself inexact and callers fall back to counters.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from jupyter_gpumem.records import (
    ALLOCATED,
    FREE,
    PENDING,
    SEGMENT_ACTIONS,
    AllocatedBlock,
    BlockState,
    SegmentState,
    TraceEvent,
)

SMALL_SIZE = 1 << 20  # requests up to 1 MiB come from the small pool
SMALL_SEGMENT = 2 << 20  # the small pool's segments are exactly 2 MiB
MIN_BLOCK = 512


class Live(NamedTuple):
    """A block that was allocated at the peak (a named tuple: analyses make one per block)."""

    address: int
    size: int
    requested_size: int
    event_index: int  # index of its alloc event, -1 if allocated before the interval


@dataclass(frozen=True)
class Replay:
    """What the interval did to one device's allocator."""

    exact: bool
    reason: str | None  # why the replay is not exact
    allocated_start: int
    allocated_end: int
    reserved_start: int
    reserved_end: int
    peak_allocated: int
    peak_reserved: int
    peak_index: int  # index of the event that reached the peak, -1 if the start was the peak
    touched_at_peak: tuple[Live, ...]  # live blocks at the peak, of the segments events touched
    allocated_series: tuple[int, ...]  # allocated after each event
    reserved_series: tuple[int, ...]  # reserved after each event
    oom_index: int | None = None  # first out-of-memory event, if any
    touched_at_oom: tuple[Live, ...] = ()
    # Segments no event touched: each of their allocated blocks is live all through the
    # interval. Kept whole so that a kernel holding many blocks costs no work per block here.
    held: tuple[SegmentState, ...] = ()

    @property
    def live_at_peak(self) -> tuple[Live, ...]:
        """Every block allocated at the peak, by address."""
        return _with_held(self.touched_at_peak, self.held)

    @property
    def live_at_oom(self) -> tuple[Live, ...]:
        return _with_held(self.touched_at_oom, self.held) if self.oom_index is not None else ()


@dataclass(slots=True, eq=False)
class _Block:
    address: int
    size: int
    state: str
    segment: int
    requested: int = 0
    alloc_index: int = -1
    prev: _Block | None = None
    next: _Block | None = None


@dataclass
class _Model:
    """The allocator's blocks, keyed by address."""

    blocks: dict[int, _Block] = field(default_factory=dict)
    small_segments: set[int] = field(default_factory=set)
    allocated: int = 0
    reserved: int = 0
    # each free: (event index, address, size, requested, alloc index); plain numbers, made
    # into a record only where the blocks live at the peak are asked for
    freed: list[tuple[int, int, int, int, int]] = field(default_factory=list)

    def add_segment(
        self, address: int, size: int, is_small: bool, blocks: Sequence[BlockState]
    ) -> None:
        self.reserved += size
        if is_small:
            self.small_segments.add(address)
        chain = blocks or (BlockState(address, size, FREE),)
        prev: _Block | None = None
        for b in sorted(chain, key=lambda b: b.address):
            block = _Block(b.address, b.size, b.state, address, prev=prev)
            if prev is not None:
                prev.next = block
            self.blocks[b.address] = block
            if b.state == ALLOCATED:
                self.allocated += b.size
                block.requested = _requested(b)
            prev = block

    def alloc(self, address: int, requested: int, index: int) -> None:
        block = self.blocks.get(address)
        if block is None or block.state != FREE:
            raise _Mismatch(f"alloc at {address:#x} where the model has no free block")
        size = round_size(requested)
        if size > block.size:
            raise _Mismatch(f"alloc of {size} bytes at {address:#x} exceeds its free block")
        remaining = block.size - size
        small = size <= SMALL_SIZE
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = _Block(
                address + size, remaining, FREE, block.segment, prev=block, next=block.next
            )
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self.blocks[rest.address] = rest
        block.state, block.requested, block.alloc_index = ALLOCATED, requested, index
        self.allocated += block.size

    def free_requested(self, address: int, index: int) -> None:
        block = self.blocks.get(address)
        if block is None or block.state != ALLOCATED:
            raise _Mismatch(f"free of {address:#x}, which the model does not hold as allocated")
        block.state = PENDING
        self.allocated -= block.size
        self.freed.append((index, address, block.size, block.requested, block.alloc_index))

    def free_completed(self, address: int) -> None:
        block = self.blocks.get(address)
        if block is None or block.state != PENDING:
            raise _Mismatch(f"free completed at {address:#x} without a pending free")
        block.state = FREE
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.state == FREE:
                block = self._merge(block, neighbour)

    def _merge(self, block: _Block, other: _Block) -> _Block:
        first, second = (other, block) if other.address < block.address else (block, other)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        del self.blocks[second.address]
        return first

    def segment_free(self, address: int, size: int) -> None:
        block = self.blocks.get(address)
        if block is None or block.state != FREE or block.size != size:
            raise _Mismatch(f"segment free at {address:#x} while the model has it in use")
        del self.blocks[address]
        self.small_segments.discard(address)
        self.reserved -= size

    def __enter__(self) -> _Model:
        return self

    def __exit__(self, *exc: object) -> None:
        """Unlink the blocks: each holds its neighbours, so the chains are reference cycles."""
        for block in self.blocks.values():
            block.prev = block.next = None

    def live(self) -> tuple[Live, ...]:
        return tuple(
            Live(b.address, b.size, b.requested, b.alloc_index)
            for b in self.blocks.values()
            if b.state == ALLOCATED
        )


class _Mismatch(Exception):
    """The trace disagrees with the model: the replay cannot be exact."""


def _requested(block: BlockState | AllocatedBlock) -> int:
    """An allocated block's request; the whole block where the layout did not say."""
    return block.size if block.requested_size is None else block.requested_size


def _with_held(touched: tuple[Live, ...], held: Sequence[SegmentState]) -> tuple[Live, ...]:
    if not held:
        return touched
    return tuple(sorted((*touched, *live_blocks(held)), key=lambda b: b.address))


def segment_allocated(seg: SegmentState) -> int:
    """Bytes of the segment's allocated blocks."""
    return seg.allocated_size()


def touched_segments(segments: Sequence[SegmentState], events: Sequence[TraceEvent]) -> set[int]:
    """Addresses of the segments that hold the address of some event."""
    if not events or not segments:
        return set()
    ordered = sorted(segments, key=lambda s: s.address)
    starts = [s.address for s in ordered]
    touched: set[int] = set()
    seen: set[int] = set()
    for ev in events:
        address = ev.address
        if address in seen:
            continue
        seen.add(address)
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0 and address < starts[i] + ordered[i].total_size:
            touched.add(starts[i])
    return touched


def live_blocks(segments: Sequence[SegmentState]) -> tuple[Live, ...]:
    """The allocated blocks of a starting layout, as blocks live before the interval."""
    return tuple(
        Live(b.address, b.size, _requested(b), -1)
        for seg in segments
        for b in seg.allocated_blocks()
    )


def round_size(requested: int) -> int:
    """The allocator's default rounding: at least 512 bytes, in multiples of 512."""
    if requested < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * -(-requested // MIN_BLOCK)


def replay(
    segments: Sequence[SegmentState],
    events: Sequence[TraceEvent],
    *,
    allocated_start: int | None = None,
    reserved_start: int | None = None,
    keep_live_at_peak: bool = True,
) -> Replay:
    """Replay ``events`` over the allocator layout ``segments``.

    ``allocated_start``/``reserved_start`` are the counters read at the start;
    when given, the model's own totals must agree or the replay is marked inexact.
    """
    with _Model() as model:  # unlinked when done: no cycle left for the collector
        touched = touched_segments(segments, events)
        held = tuple(seg for seg in segments if seg.address not in touched)
        model.allocated = sum(segment_allocated(seg) for seg in held)
        model.reserved = sum(seg.total_size for seg in held)
        for seg in segments:
            if seg.address in touched:
                model.add_segment(seg.address, seg.total_size, seg.is_small, seg.blocks)
        reason: str | None = None
        if allocated_start is not None and allocated_start != model.allocated:
            reason = (
                f"start layout holds {model.allocated} allocated bytes, counters {allocated_start}"
            )
        if reserved_start is not None and reserved_start != model.reserved:
            reason = (
                reason
                or f"start layout holds {model.reserved} reserved bytes, counters {reserved_start}"
            )
        a0, r0 = model.allocated, model.reserved
        peak_a, peak_r, peak_index = a0, r0, -1
        live_at_peak = model.live() if keep_live_at_peak else ()
        alloc_series: list[int] = []
        reserved_series: list[int] = []
        oom_index: int | None = None
        live_at_oom: tuple[Live, ...] = ()
        for i, ev in enumerate(events):
            if reason is None:
                try:
                    _apply(model, ev, i)
                except _Mismatch as exc:
                    reason = str(exc)
            if ev.action == "oom" and oom_index is None:
                oom_index, live_at_oom = i, model.live()
            alloc_series.append(model.allocated)
            reserved_series.append(model.reserved)
            if model.reserved > peak_r:
                peak_r = model.reserved
            if model.allocated > peak_a:
                peak_a, peak_index = model.allocated, i
                if keep_live_at_peak:
                    live_at_peak = ()  # rebuilt once after the loop, not at every peak
        if keep_live_at_peak and peak_index >= 0:
            live_at_peak = _live_at(model, peak_index) if reason is None else ()
        return Replay(
            exact=reason is None,
            reason=reason,
            allocated_start=a0,
            allocated_end=model.allocated,
            reserved_start=r0,
            reserved_end=model.reserved,
            peak_allocated=peak_a,
            peak_reserved=peak_r,
            peak_index=peak_index,
            touched_at_peak=live_at_peak,
            allocated_series=tuple(alloc_series),
            reserved_series=tuple(reserved_series),
            oom_index=oom_index,
            touched_at_oom=live_at_oom,
            held=held if keep_live_at_peak and (reason is None or peak_index < 0) else (),
        )


def layout_after(
    segments: Sequence[SegmentState], events: Sequence[TraceEvent]
) -> tuple[SegmentState, ...] | None:
    """The allocator's layout after ``events``, from the layout before them.

    Segments no event touched are kept as they are; the touched ones are rebuilt from the
    replay. None where the replay disagrees with the trace, or a segment came or went
    (its pool is not in the trace).
    """
    if any(ev.action in SEGMENT_ACTIONS for ev in events):
        return None
    touched = touched_segments(segments, events)
    with _Model() as model:  # unlinked when done: no cycle left for the collector
        for seg in segments:
            if seg.address in touched:
                model.add_segment(seg.address, seg.total_size, seg.is_small, seg.blocks)
        try:
            for i, ev in enumerate(events):
                _apply(model, ev, i)
        except _Mismatch:
            return None
        chains: dict[int, list[_Block]] = {}
        for block in model.blocks.values():
            chains.setdefault(block.segment, []).append(block)
        out = [seg for seg in segments if seg.address not in touched]
        for seg in segments:
            if seg.address in touched:
                chain = sorted(chains.get(seg.address, ()), key=lambda b: b.address)
                blocks = tuple(
                    BlockState(
                        b.address, b.size, b.state, b.requested if b.state == ALLOCATED else None
                    )
                    for b in chain
                )
                out.append(replace(seg, blocks=blocks))
        return tuple(sorted(out, key=lambda s: s.address))


def _apply(model: _Model, ev: TraceEvent, index: int) -> None:
    if ev.action == "alloc":
        model.alloc(ev.address, ev.size, index)
    elif ev.action == "free_requested":
        model.free_requested(ev.address, index)
    elif ev.action == "free_completed":
        model.free_completed(ev.address)
    elif ev.action == "segment_alloc":
        model.add_segment(ev.address, ev.size, ev.size == SMALL_SEGMENT, ())
    elif ev.action == "segment_free":
        model.segment_free(ev.address, ev.size)
    elif ev.action in ("segment_map", "segment_unmap"):
        raise _Mismatch("expandable segments are not modelled")
    # "oom", "snapshot" and unknown future actions change no counter


def _live_at(model: _Model, index: int) -> tuple[Live, ...]:
    """The blocks allocated just after event ``index``, from the end state and the frees.

    An allocated block keeps its size until it is freed, so the blocks live then are those
    still live at the end that were allocated by then, and those freed later.
    """
    at_end = [b for b in model.live() if b.event_index <= index]
    freed_later = [
        Live(address, size, requested, alloc)
        for i, address, size, requested, alloc in model.freed
        if i > index and alloc <= index
    ]
    return tuple(sorted((*at_end, *freed_later), key=lambda b: b.address))


def replay_exact(
    events: Sequence[TraceEvent], *, allocated_start: int = 0, start: Sequence[Live] = ()
) -> Replay:
    """Replay events whose sizes are already exact, such as the CPU dispatch recorder's.

    No segments and no rounding: every alloc is its own block of ``size`` bytes,
    so reserved equals allocated. Allocated drops at ``free_requested`` as in
    :func:`replay`. A free of an address that is not live (allocated before the
    interval, or a broken trace) subtracts the event's size and marks the replay
    inexact; so does a second alloc at a live address. ``start`` holds blocks known
    to be live before the interval; their bytes add to ``allocated_start``.
    """
    live: dict[int, Live] = {b.address: b for b in start}
    pending: set[int] = set()
    allocated_start += sum(b.size for b in start)
    allocated = allocated_start
    reason: str | None = None
    peak, peak_index = allocated, -1
    series: list[int] = []
    oom_index: int | None = None
    live_at_oom: tuple[Live, ...] = ()
    for i, ev in enumerate(events):
        if ev.action == "alloc":
            if ev.address in live:
                reason = reason or f"alloc at {ev.address:#x}, which is already live"
            live[ev.address] = Live(ev.address, ev.size, ev.size, i)
            allocated += ev.size
        elif ev.action == "free_requested":
            block = live.pop(ev.address, None)
            if block is None:
                reason = reason or f"free of {ev.address:#x}, which is not live"
            allocated -= ev.size if block is None else block.size
            pending.add(ev.address)
        elif ev.action == "free_completed":
            if ev.address not in pending:
                reason = reason or f"free completed at {ev.address:#x} without a pending free"
            pending.discard(ev.address)
        elif ev.action == "oom" and oom_index is None:
            oom_index, live_at_oom = i, tuple(live.values())
        series.append(allocated)
        if allocated > peak:
            peak, peak_index = allocated, i
    live_at_peak = _exact_live_after(events, peak_index, start) if peak_index >= 0 else tuple(start)
    return Replay(
        exact=reason is None,
        reason=reason,
        allocated_start=allocated_start,
        allocated_end=allocated,
        reserved_start=allocated_start,
        reserved_end=allocated,
        peak_allocated=peak,
        peak_reserved=peak,
        peak_index=peak_index,
        touched_at_peak=live_at_peak,
        allocated_series=tuple(series),
        reserved_series=tuple(series),
        oom_index=oom_index,
        touched_at_oom=live_at_oom,
    )


def _exact_live_after(
    events: Sequence[TraceEvent], last: int, start: Sequence[Live] = ()
) -> tuple[Live, ...]:
    live: dict[int, Live] = {b.address: b for b in start}
    for i in range(last + 1):
        ev = events[i]
        if ev.action == "alloc":
            live[ev.address] = Live(ev.address, ev.size, ev.size, i)
        elif ev.action == "free_requested":
            live.pop(ev.address, None)
    return tuple(live.values())
