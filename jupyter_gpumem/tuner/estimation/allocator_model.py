"""The CUDA caching allocator played forward: it picks the blocks, for runs that never touched a GPU.

:mod:`jupyter_gpumem.analysis.replay` replays a recorded trace, where the real allocator chose
every address. An estimate has no real allocator, so this model chooses them as the real one does
by default, and writes down what it did as the allocator's own trace (``segment_alloc``,
``alloc``, ``free_requested``, ``free_completed``), which :func:`~jupyter_gpumem.analysis.replay.replay`
reads like any recorded window. The model counts as it goes, so :meth:`CachingAllocator.played`
gives what that replay would, without playing the events again (a long decode's trace holds a
million of them).

The rules (``c10/cuda/CUDACachingAllocator.cpp``, default settings):

- a request is rounded up to a multiple of 512 bytes; up to 1 MiB it is served from the small
  pool, above from the large pool;
- the smallest free block of the pool that is large enough is taken, the lowest address first;
- a block is split when what remains is at least 512 bytes (small pool) or more than 1 MiB
  (large pool); otherwise the whole block is allocated and counted;
- with no block large enough, a segment is reserved: 2 MiB for the small pool, 20 MiB for
  requests under 10 MiB, else the request rounded up to 2 MiB;
- a freed block merges with free neighbours of its segment; segments are kept (reserved);
- a private pool (a CUDA graph's) serves only the requests made in it, from segments of its own,
  which ``empty_cache`` keeps.

Pure: touches neither torch nor CUDA.

Known limitations:
- One stream: blocks of segments made on other streams are never handed out.
- No device limit: where the real allocator would release its cache and retry before failing,
  the model keeps reserving, so reserved bytes near the limit are an upper bound.
- ``expandable_segments``, ``max_split_size_mb``, ``roundup_power2_divisions`` and the
  ``cudaMallocAsync`` backend are not modelled.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.analysis.replay import (
    MIN_BLOCK,
    SMALL_SEGMENT,
    SMALL_SIZE,
    Live,
    Replay,
    round_size,
)
from jupyter_gpumem.records import ALLOCATED, FREE, BlockState, SegmentState, TraceEvent

LARGE_SEGMENT = 20 << 20  # requests in (1 MiB, 10 MiB) share segments of this size
MIN_LARGE_ALLOC = 10 << 20  # requests from this size on get a segment of their own
ROUND_LARGE = 2 << 20  # which is rounded up to this


def segment_size(size: int) -> int:
    """Bytes the allocator reserves (cudaMalloc) when no cached block fits ``size``."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return ROUND_LARGE * -(-size // ROUND_LARGE)


@dataclass(slots=True, eq=False)
class _Block:
    address: int
    size: int
    allocated: bool
    segment: int
    small: bool
    usable: bool  # False for blocks of segments on other streams
    pool: int = 0  # 0: the default pool; others: private pools (CUDA graphs')
    requested: int | None = None  # what the allocated block's tensor asked for, where known
    alloc_index: int = -1  # the event that allocated it; -1 for a block of the starting layout
    prev: _Block | None = None
    next: _Block | None = None


class CachingAllocator:
    """The allocator's blocks and segments; ``malloc`` and ``free`` append to ``events``, and
    the counters after each event to ``allocated_series`` and ``reserved_series``.

    ``segments`` is the layout to start from (as a snapshot gives it); the segments whose
    addresses are in ``foreign`` belong to other streams: reserved, but never allocated from.
    """

    def __init__(
        self, segments: Sequence[SegmentState] = (), *, foreign: Collection[int] = ()
    ) -> None:
        self.events: list[TraceEvent] = []
        self.allocated_series: list[int] = []
        self.reserved_series: list[int] = []
        self.allocated = 0
        self.reserved = 0
        # each free: its event, and the freed block (address, size, request, alloc event)
        self._freed_at: list[int] = []
        self._freed: list[tuple[int, int, int, int]] = []
        self._blocks: dict[int, _Block] = {}
        self._heads: dict[int, _Block] = {}  # segment address -> its first block
        # (pool, small) -> free blocks as (size, address)
        self._free: dict[tuple[int, bool], list[tuple[int, int]]] = {(0, True): [], (0, False): []}
        end = 1 << 32
        for seg in sorted(segments, key=lambda s: s.address):
            self._add_segment(seg, usable=seg.address not in foreign)
            end = max(end, seg.address + seg.total_size)
        self._start = (self.allocated, self.reserved)
        self._next_address = ROUND_LARGE * -(-(end + ROUND_LARGE) // ROUND_LARGE)

    # -- the allocator's two calls ---------------------------------------------------------
    def malloc(
        self,
        requested: int,
        time_us: int = 0,
        frames: Sequence[Mapping[str, Any]] = (),
        pool: int = 0,
    ) -> int:
        """Allocate ``requested`` bytes in ``pool`` (0: the default one); returns the block's
        address. ``frames``: who asked."""
        size = round_size(requested)
        small = size <= SMALL_SIZE
        free = self._free.get((pool, small))
        if free is None:  # a private pool's first request of this kind (no list made per call)
            free = self._free[pool, small] = []
        i = bisect.bisect_left(free, (size, -1))
        if i < len(free):
            block = self._blocks[free.pop(i)[1]]
        else:
            block = self._new_segment(segment_size(size), small, time_us, pool)
        remaining = block.size - size
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = _Block(
                block.address + size,
                remaining,
                False,
                block.segment,
                small,
                True,
                pool,
                prev=block,
                next=block.next,
            )
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._blocks[rest.address] = rest
            bisect.insort(free, (rest.size, rest.address))
        block.allocated, block.requested = True, requested
        block.alloc_index = len(self.events)
        self.allocated += block.size
        self.events.append(TraceEvent("alloc", block.address, requested, time_us, frames))
        self.allocated_series.append(self.allocated)
        self.reserved_series.append(self.reserved)
        return block.address

    def free(self, address: int, time_us: int = 0) -> None:
        """Free the block at ``address``, merging it with free neighbours."""
        block = self._blocks.get(address)
        if block is None or not block.allocated:
            raise ValueError(f"free of {address:#x}, which the model does not hold as allocated")
        self._freed_at.append(len(self.events))
        self._freed.append((address, block.size, _request(block), block.alloc_index))
        block.allocated, block.requested = False, None
        self.allocated -= block.size
        self.events.append(TraceEvent("free_requested", address, block.size, time_us))
        self.events.append(TraceEvent("free_completed", address, block.size, time_us))
        self.allocated_series += (self.allocated, self.allocated)
        self.reserved_series += (self.reserved, self.reserved)
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated and neighbour.usable:
                _drop(
                    self._free[neighbour.pool, neighbour.small], (neighbour.size, neighbour.address)
                )
                block = self._merge(block, neighbour)
        if block.usable:
            bisect.insort(self._free[block.pool, block.small], (block.size, block.address))

    def empty_cache(self, time_us: int = 0) -> None:
        """Release every segment of the default pool that holds no allocated block, as
        ``torch.cuda.empty_cache()``."""
        for address, head in list(self._heads.items()):
            if head.allocated or head.next is not None or not head.usable or head.pool:
                continue
            _drop(self._free[0, head.small], (head.size, address))
            del self._blocks[address], self._heads[address]
            self.reserved -= head.size
            self.events.append(TraceEvent("segment_free", address, head.size, time_us))
            self.allocated_series.append(self.allocated)
            self.reserved_series.append(self.reserved)

    def block_size(self, address: int) -> int | None:
        """The size of the allocated block that starts at ``address``; None if there is none."""
        block = self._blocks.get(address)
        return block.size if block is not None and block.allocated else None

    def layout(self) -> tuple[SegmentState, ...]:
        """The segments and their blocks now, as a snapshot would show them."""
        out = []
        for address, head in sorted(self._heads.items()):
            blocks: list[BlockState] = []
            total = 0
            block: _Block | None = head
            while block is not None:
                state = ALLOCATED if block.allocated else FREE
                blocks.append(BlockState(block.address, block.size, state, block.requested))
                total += block.size
                block = block.next
            out.append(SegmentState(address, total, head.small, tuple(blocks), head.pool != 0))
        return tuple(out)

    def played(self, first: int = 0) -> Replay:
        """What :func:`~jupyter_gpumem.analysis.replay.replay` gives for the events from
        ``first`` on, over the layout before them: the peaks from the model's own counters and
        the blocks live at the allocated peak from its own blocks, every segment's (nothing
        held apart)."""
        allocated, reserved = self.allocated_series, self.reserved_series
        a0, r0 = (allocated[first - 1], reserved[first - 1]) if first else self._start
        peak, peak_index = a0, -1
        if len(allocated) > first:
            most = max(allocated[first:])
            if most > a0:
                peak, peak_index = most, allocated.index(most, first) - first
        peak_reserved = max(r0, max(reserved[first:], default=r0))
        return Replay(
            exact=True,
            reason=None,
            allocated_start=a0,
            allocated_end=self.allocated,
            reserved_start=r0,
            reserved_end=self.reserved,
            peak_allocated=peak,
            peak_reserved=peak_reserved,
            peak_index=peak_index,
            touched_at_peak=self._live_after(first + peak_index, first),
            allocated_series=tuple(allocated[first:]),
            reserved_series=tuple(reserved[first:]),
        )

    def _live_after(self, index: int, first: int) -> tuple[Live, ...]:
        """The blocks allocated just after event ``index`` (before ``first``: at its start),
        by address; each one's alloc event counted from ``first``, -1 where it came before."""

        def since(at: int) -> int:
            return at - first if at >= first else -1

        live = [
            Live(b.address, b.size, _request(b), since(b.alloc_index))
            for b in self._blocks.values()
            if b.allocated and b.alloc_index <= index
        ]
        later = bisect.bisect_right(self._freed_at, index)
        live += [
            Live(address, size, requested, since(at))
            for address, size, requested, at in self._freed[later:]
            if at <= index
        ]
        return tuple(sorted(live))

    def close(self) -> None:
        """Unlink the blocks, each of which holds its neighbours (a reference cycle), so that
        the model is freed as soon as it is dropped; it takes no call after this."""
        for block in self._blocks.values():
            block.prev = block.next = None
        self._blocks.clear()
        self._heads.clear()

    # -- helpers -----------------------------------------------------------------------------
    def _add_segment(self, seg: SegmentState, *, usable: bool) -> None:
        chain = seg.blocks or (BlockState(seg.address, seg.total_size, FREE),)
        prev: _Block | None = None
        for b in sorted(chain, key=lambda b: b.address):
            allocated = b.state == ALLOCATED
            block = _Block(
                b.address,
                b.size,
                allocated,
                seg.address,
                seg.is_small,
                usable,
                requested=b.requested_size if allocated else None,
                prev=prev,
            )
            if prev is None:
                self._heads[seg.address] = block
            else:
                prev.next = block
            self._blocks[b.address] = block
            if allocated:
                self.allocated += b.size
            prev = block
        # neighbouring free blocks of a snapshot are already merged by the allocator; merge
        # here too, since a layout edited by the caller (freed tensors) may have new ones
        at: _Block | None = self._heads[seg.address]
        while at is not None:
            nxt = at.next
            if nxt is not None and not at.allocated and not nxt.allocated:
                at = self._merge(at, nxt)
                continue
            if not at.allocated and usable:
                bisect.insort(self._free[0, at.small], (at.size, at.address))
            at = nxt
        self.reserved += seg.total_size

    def _new_segment(self, size: int, small: bool, time_us: int, pool: int) -> _Block:
        address = self._next_address
        self._next_address += ROUND_LARGE * -(-size // ROUND_LARGE)
        block = _Block(address, size, False, address, small, True, pool)
        self._blocks[address] = block
        self._heads[address] = block
        self.reserved += size
        self.events.append(TraceEvent("segment_alloc", address, size, time_us))
        self.allocated_series.append(self.allocated)
        self.reserved_series.append(self.reserved)
        return block

    def _merge(self, block: _Block, other: _Block) -> _Block:
        first, second = (other, block) if other.address < block.address else (block, other)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        del self._blocks[second.address]
        return first


def _request(block: _Block) -> int:
    """An allocated block's request; the whole block where its layout did not say."""
    return block.size if block.requested is None else block.requested


def _drop(pool: list[tuple[int, int]], entry: tuple[int, int]) -> None:
    """Take ``entry`` out of a sorted free list by bisection (``list.remove`` scans it all)."""
    i = bisect.bisect_left(pool, entry)
    if i == len(pool) or pool[i] != entry:
        raise ValueError(f"the free list holds no block {entry[1]:#x} of {entry[0]} bytes")
    del pool[i]
