"""Torch's allocator snapshot dicts (``torch.cuda.memory._snapshot()``) read as our records.

Pure functions over the snapshot's segments and trace entries, as torch's own
``_memory_viz`` reads them: a segment's blocks are made into records only when read,
and the allocated totals of a segment read again unchanged are kept from the last read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jupyter_gpumem.records import (
    AllocatedBlock,
    AllocatedSummary,
    BlockState,
    SegmentState,
    TraceEvent,
)

_STATES = {"active_allocated": "allocated", "active_awaiting_free": "pending", "inactive": "free"}


def read_segments(raw: Sequence[Mapping[str, Any]], device: int) -> tuple[SegmentState, ...]:
    mine = [(seg, SnapshotBlocks(seg.get("blocks", ()), seg)) for seg in raw]
    mine = [(seg, blocks) for seg, blocks in mine if seg.get("device", 0) == device]
    SUMMARIES.retain(device, {blocks.key for _, blocks in mine})
    return tuple(
        SegmentState(
            address=int(seg["address"]),
            total_size=int(seg["total_size"]),
            is_small=seg.get("segment_type") == "small",
            blocks=blocks,
            private_pool=in_private_pool(seg),
        )
        for seg, blocks in mine
    )


def in_private_pool(seg: Mapping[str, Any]) -> bool:
    """Whether a snapshot's segment belongs to a private pool (a CUDA graph's, a ``MemPool``)."""
    return tuple(seg.get("segment_pool_id") or (0, 0)) != (0, 0)


def private_pools(
    raw: Sequence[Mapping[str, Any]], device: int, start: Sequence[SegmentState]
) -> tuple[tuple[int, int], ...]:
    """(address, size) of the private pools' segments at a window's start and in ``raw``."""
    ranges = {(s.address, s.total_size) for s in start if s.private_pool}
    ranges.update(
        (int(seg["address"]), int(seg["total_size"]))
        for seg in raw
        if seg.get("device", 0) == device and in_private_pool(seg)
    )
    return tuple(sorted(ranges))


class SnapshotBlocks(Sequence[BlockState]):
    """A segment's blocks as a snapshot lists them, made into records only when read.

    The replay reads the blocks of the segments a window touches; the rest are summed and
    categorized from :meth:`allocated_summary`: totals from the snapshot's own fields, and
    the blocks themselves read only where the breakdown looks. Pickles as a plain tuple.
    """

    __slots__ = ("_parsed", "_raw", "_segment", "_summary", "allocated_of", "key")

    def __init__(
        self, raw: Sequence[Mapping[str, Any]], segment: Mapping[str, Any] | None = None
    ) -> None:
        self._raw = raw
        self._segment = segment or {}  # the snapshot's segment entry, for its totals
        self._parsed: tuple[BlockState, ...] | None = None
        self.allocated_of = AllocatedOf(raw)
        self._summary: AllocatedSummary | None = None
        seg = self._segment  # the segment's fingerprint: its address, totals and block count
        self.key = (seg.get("device", 0), *(seg.get(k) for k in _TOTALS), len(raw))

    def _blocks(self) -> tuple[BlockState, ...]:
        if self._parsed is None:
            self._parsed = tuple(_block(b) for b in self._raw)
        return self._parsed

    def allocated_blocks(self) -> list[AllocatedBlock]:
        return self.allocated_of()

    def allocated_size(self) -> int:
        size = self._segment.get("allocated_size")
        return self.allocated_summary().size if size is None else int(size)

    def allocated_summary(self) -> AllocatedSummary:
        if self._summary is None:
            seg = self._segment
            size, requested = seg.get("allocated_size"), seg.get("requested_size")
            if size is None or requested is None or seg.get("active_size") != size:
                # no totals, or blocks awaiting their streams count in the snapshot's request
                self._summary = AllocatedSummary.of(self.allocated_blocks())
            else:
                self._summary = SUMMARIES.get(self.key) or SUMMARIES.put(
                    self.key, AllocatedSummary(int(size), int(requested), self.allocated_of)
                )
        return self._summary

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, index: Any) -> Any:
        return self._blocks()[index]

    def __iter__(self) -> Iterator[BlockState]:
        return iter(self._blocks())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return self._blocks() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._blocks())

    def __repr__(self) -> str:
        return f"SnapshotBlocks({len(self)} blocks)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, (self._blocks(),))


_TOTALS = ("address", "total_size", "allocated_size", "active_size", "requested_size")


class AllocatedOf:
    """A segment's allocated blocks, made from its snapshot entries when first asked for.

    Shared by the segment's view and the summary kept of it; it holds neither, so a layout
    and its summaries are freed by reference counting, and a summary kept for a later read
    keeps only the entries it may still read.
    """

    __slots__ = ("_raw", "made")

    def __init__(self, raw: Sequence[Mapping[str, Any]]) -> None:
        self._raw = raw
        self.made: list[AllocatedBlock] | None = None

    def __call__(self) -> list[AllocatedBlock]:
        if self.made is None:
            self.made = [
                AllocatedBlock(b["address"], b["size"], b.get("requested_size") or None)
                for b in self._raw
                if b["state"] == "active_allocated"
            ]
        return self.made


class HeldSummaries:
    """Segments' summaries (totals, index, count of each request) by their fingerprints.

    A kernel's segments mostly hold what they held at the last read. A segment read again
    with the same address, totals and block count is taken to hold the same blocks, so its
    index and counts are not made again; the breakdown of untouched segments then costs per
    segment that changed, not per block the kernel holds. A segment that traded blocks for
    others of the same totals and count keeps its old index: that can move bytes between
    the categories of its claimed storages, a workspace and unattributed, never change
    their sum, which comes from the snapshot's totals.
    """

    def __init__(self) -> None:
        self._kept: dict[tuple[Any, ...], AllocatedSummary] = {}

    def get(self, key: tuple[Any, ...]) -> AllocatedSummary | None:
        return self._kept.get(key)

    def put(self, key: tuple[Any, ...], summary: AllocatedSummary) -> AllocatedSummary:
        self._kept[key] = summary
        return summary

    def retain(self, device: Any, keys: set[tuple[Any, ...]]) -> None:
        """Forget the segments of ``device`` that a read of its whole layout no longer has."""
        self._kept = {k: v for k, v in self._kept.items() if k[0] != device or k in keys}

    def clear(self) -> None:
        self._kept.clear()


SUMMARIES = HeldSummaries()


def _block(b: Mapping[str, Any]) -> BlockState:
    return BlockState(
        int(b["address"]),
        int(b["size"]),
        _STATES.get(b["state"], "allocated"),
        int(b["requested_size"]) if b.get("requested_size") else None,
    )


def new_blocks(
    raw: Sequence[Mapping[str, Any]], device: int, start: Sequence[SegmentState]
) -> tuple[BlockState, ...]:
    """The blocks allocated in ``raw`` that were not allocated, with that size, in ``start``.

    Records only those: in a kernel holding tens of thousands of tensors, making a record of
    every block would cost more than the rest of the analysis.
    """
    before = {b.address: b.size for seg in start for b in seg.allocated_blocks()}
    return tuple(
        _block(b)
        for seg in raw
        if seg.get("device", 0) == device
        for b in seg.get("blocks", ())
        if b["state"] == "active_allocated" and before.get(b["address"]) != b["size"]
    )


def read_events(entries: Sequence[Mapping[str, Any]]) -> tuple[TraceEvent, ...]:
    """Trace entries as events; one pass, positional, as it runs over every entry of a window.

    Made with ``tuple.__new__`` as the named tuple's own constructor does, without its
    Python-level call per event."""
    make, cls = tuple.__new__, TraceEvent
    return tuple(
        [
            make(
                cls,
                (
                    e["action"],
                    e.get("addr", 0),
                    e.get("size", 0),
                    e.get("time_us", 0),
                    e.get("frames", ()),
                    e.get("stream") or 0,
                ),
            )
            for e in entries
        ]
    )


def entry_key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    return (entry.get("action"), entry.get("addr"), entry.get("size"), entry.get("time_us"))
