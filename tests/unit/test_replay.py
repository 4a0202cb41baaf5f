"""The allocator model against hand-computed block accounting."""

from jupyter_gpumem.analysis.replay import MIN_BLOCK, replay, round_size
from jupyter_gpumem.records import ALLOCATED, FREE, BlockState, SegmentState, TraceEvent

MiB = 2**20
BASE = 0x7F0000000000


def ev(action: str, address: int, size: int) -> TraceEvent:
    return TraceEvent(action, address, size)


def test_round_size() -> None:
    assert round_size(1) == MIN_BLOCK
    assert round_size(512) == 512
    assert round_size(513) == 1024


def test_small_allocations_are_rounded_and_split() -> None:
    events = [
        ev("segment_alloc", BASE, 2 * MiB),
        ev("alloc", BASE, 100),  # block of 512
        ev("alloc", BASE + 512, 1000),  # block of 1024
        ev("free_requested", BASE, 100),
        ev("free_completed", BASE, 100),
    ]
    r = replay([], events)
    assert r.exact
    assert r.allocated_series == (0, 512, 1536, 1024, 1024)
    assert r.peak_allocated == 1536
    assert r.peak_reserved == 2 * MiB
    assert [(b.address, b.size, b.requested_size) for b in r.live_at_peak] == [
        (BASE, 512, 100),
        (BASE + 512, 1024, 1000),
    ]


def test_large_block_keeps_a_remainder_too_small_to_split() -> None:
    # A 20 MiB segment, then 19.5 MiB requested: the 0.5 MiB rest (<= 1 MiB) is not split off,
    # so the allocator counts the whole 20 MiB as allocated.
    events = [ev("segment_alloc", BASE, 20 * MiB), ev("alloc", BASE, 39 * MiB // 2)]
    r = replay([], events)
    assert r.peak_allocated == 20 * MiB
    # With a 2 MiB rest it is split, and only the rounded request counts.
    r2 = replay([], [ev("segment_alloc", BASE, 20 * MiB), ev("alloc", BASE, 18 * MiB - 100)])
    assert r2.peak_allocated == 18 * MiB


def test_freed_blocks_merge_before_reuse() -> None:
    events = [
        ev("segment_alloc", BASE, 20 * MiB),
        ev("alloc", BASE, 4 * MiB),
        ev("alloc", BASE + 4 * MiB, 4 * MiB),
        ev("free_requested", BASE, 4 * MiB),
        ev("free_completed", BASE, 4 * MiB),
        ev("free_requested", BASE + 4 * MiB, 4 * MiB),
        ev("free_completed", BASE + 4 * MiB, 4 * MiB),
        ev("alloc", BASE, 19 * MiB + 512 * 1024),  # needs the merged 20 MiB block, unsplit
        ev("free_requested", BASE, 0),
        ev("free_completed", BASE, 0),
        ev("segment_free", BASE, 20 * MiB),
    ]
    r = replay([], events)
    assert r.exact
    assert r.peak_allocated == 20 * MiB
    assert r.allocated_end == 0 and r.reserved_end == 0
    assert r.peak_index == 7


def test_pending_free_counts_as_freed_but_does_not_merge() -> None:
    events = [
        ev("segment_alloc", BASE, 20 * MiB),
        ev("alloc", BASE, 4 * MiB),
        ev("free_requested", BASE, 4 * MiB),  # stream still uses it: free_completed comes later
        ev("alloc", BASE + 4 * MiB, 4 * MiB),
        ev("free_completed", BASE, 4 * MiB),
    ]
    r = replay([], events)
    assert r.exact
    assert r.allocated_series == (0, 4 * MiB, 0, 4 * MiB, 4 * MiB)


def test_starting_layout_is_honoured_and_checked_against_counters() -> None:
    start = [
        SegmentState(
            BASE, 20 * MiB, False,
            (BlockState(BASE, 8 * MiB, ALLOCATED), BlockState(BASE + 8 * MiB, 12 * MiB, FREE)),
        )
    ]  # fmt: skip
    events = [ev("alloc", BASE + 8 * MiB, 11 * MiB + 1)]  # rest < 1 MiB: whole 12 MiB block
    r = replay(start, events, allocated_start=8 * MiB, reserved_start=20 * MiB)
    assert r.exact
    assert r.peak_allocated == 20 * MiB
    bad = replay(start, events, allocated_start=9 * MiB, reserved_start=20 * MiB)
    assert not bad.exact and "counters" in (bad.reason or "")


def test_events_the_model_cannot_explain_make_the_replay_inexact() -> None:
    r = replay([], [ev("alloc", BASE, 512)])  # no segment there
    assert not r.exact
    assert "no free block" in (r.reason or "")


def test_oom_event_keeps_what_was_live() -> None:
    events = [
        ev("segment_alloc", BASE, 20 * MiB),
        ev("alloc", BASE, 6 * MiB),
        ev("oom", 0, 80 * 2**30),
    ]
    r = replay([], events)
    assert r.oom_index == 2
    assert [b.size for b in r.live_at_oom] == [6 * MiB]


def test_segments_no_event_touches_are_held_whole_and_still_count() -> None:
    """A kernel holding many blocks: only the segment the events touch is modelled block by
    block; the others are `held`, and the peak, its live blocks and its breakdown are the same."""
    from jupyter_gpumem.analysis.breakdown import categorize
    from jupyter_gpumem.records import NamedStorage, Tag

    def segment(i: int) -> SegmentState:
        start = BASE + i * 2 * MiB
        blocks = (
            BlockState(start, 1024, ALLOCATED, 1000),
            BlockState(start + 1024, 2 * MiB - 1024, FREE),
        )
        return SegmentState(start, 2 * MiB, True, blocks)

    layout = [segment(i) for i in range(50)]
    busy = layout[7].address + 1024  # the free rest of segment 7
    events = [
        ev("alloc", busy, 4096),
        ev("free_requested", busy, 4096),
        ev("free_completed", busy, 4096),
    ]
    r = replay(layout, events, allocated_start=50 * 1024, reserved_start=100 * MiB)
    assert r.exact and r.peak_allocated == 50 * 1024 + 4096
    assert [s.address for s in r.held] == [s.address for s in layout if s is not layout[7]]
    assert {b.address for b in r.touched_at_peak} == {layout[7].address, busy}
    assert len(r.live_at_peak) == 51 and sum(b.size for b in r.live_at_peak) == r.peak_allocated

    tags = [Tag(layout[3].address, "parameters", 0, 1000), Tag(busy, "activations", 0, 4096)]
    named = {
        layout[4].address: NamedStorage(
            layout[4].address, 1000, "opt", "optimizer_state", (250,), "float32", "cuda:0"
        )
    }
    split = categorize(r.touched_at_peak, events, tags, [], named, held=r.held)
    whole = categorize(r.live_at_peak, events, tags, [], named)
    assert split == whole
    assert split["parameters"] == 1000 and split["optimizer_state"] == 1000
    assert split["activations"] == 4096 and split["unattributed"] == 48 * 1000
    assert sum(split.values()) == r.peak_allocated


def test_the_layout_after_a_window_starts_the_next_one_as_one_replay_would() -> None:
    """A window whose end was read as a trace alone hands the next window the layout its
    replay left: replaying the two windows one after the other gives what one replay of
    both gives, block for block."""
    from jupyter_gpumem.analysis.replay import layout_after

    def segment(i: int) -> SegmentState:
        start = BASE + i * 20 * MiB
        blocks = (
            BlockState(start, 4 * MiB, ALLOCATED, 4 * MiB - 100),
            BlockState(start + 4 * MiB, 16 * MiB, FREE),
        )
        return SegmentState(start, 20 * MiB, False, blocks)

    layout = [segment(i) for i in range(3)]
    busy = layout[1].address
    first = [
        ev("alloc", busy + 4 * MiB, 6 * MiB),  # splits the free rest
        ev("free_requested", busy, 4 * MiB - 100),
        ev("free_completed", busy, 4 * MiB - 100),
    ]
    second = [
        ev("alloc", busy, 3 * MiB),  # the freed head, whole: a 1 MiB rest is not split
        ev("alloc", busy + 10 * MiB, 9 * MiB + 512 * 1024),  # the 10 MiB rest, unsplit
        ev("free_requested", busy + 4 * MiB, 6 * MiB),
    ]
    after = layout_after(layout, first)
    assert after is not None
    assert after[0] is layout[0] and after[2] is layout[2]  # untouched segments kept as they are
    assert [(b.address, b.size, b.state) for b in after[1].blocks] == [
        (busy, 4 * MiB, FREE),
        (busy + 4 * MiB, 6 * MiB, ALLOCATED),
        (busy + 10 * MiB, 10 * MiB, FREE),
    ]
    whole = replay(layout, first + second)
    split = replay(after, second, allocated_start=whole.allocated_series[len(first) - 1])
    assert split.exact
    assert split.allocated_series == whole.allocated_series[len(first) :]
    assert split.peak_allocated == whole.peak_allocated == (2 * 4 + 4 + 6 + 10) * MiB
    assert split.live_at_peak == tuple(
        type(b)(
            b.address,
            b.size,
            b.requested_size,
            -1 if b.event_index < len(first) else b.event_index - len(first),
        )
        for b in whole.live_at_peak
    )


def test_no_layout_after_a_window_the_replay_cannot_follow() -> None:
    from jupyter_gpumem.analysis.replay import layout_after

    layout = [SegmentState(BASE, 2 * MiB, True, (BlockState(BASE, 2 * MiB, FREE),))]
    assert layout_after(layout, [ev("free_requested", BASE, 512)]) is None
    assert layout_after(layout, [ev("segment_alloc", BASE + 2 * MiB, 2 * MiB)]) is None
    assert layout_after(layout, []) == tuple(layout)
