"""The allocator model: the caching allocator's rules, checked against a real trace and the replay."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from jupyter_gpumem.analysis.replay import replay
from jupyter_gpumem.records import ALLOCATED, FREE, BlockState, SegmentState, TraceEvent
from jupyter_gpumem.tuner.estimation.allocator_model import CachingAllocator, segment_size
from jupyter_gpumem.tuner.estimation.fake_peaks import cpu_peaks, cuda_peaks
from jupyter_gpumem.tuner.estimation.fake_step import FakeRun

MiB = 1 << 20
FIXTURE = Path(__file__).parent.parent / "fixtures" / "cuda_trace_train_step.json"


def test_segment_sizes_follow_the_allocator() -> None:
    assert segment_size(512) == segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 512) == segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB
    assert segment_size(11 * MiB + 1) == 12 * MiB


def test_rounding_splitting_and_reuse() -> None:
    alloc = CachingAllocator()
    a = alloc.malloc(100)
    b = alloc.malloc(700)
    assert b == a + 512  # small blocks split off one 2 MiB segment
    assert (alloc.allocated, alloc.reserved) == (512 + 1024, 2 * MiB)
    big = alloc.malloc(5 * MiB)  # a 20 MiB segment, split: the rest is over 1 MiB
    assert alloc.reserved == 22 * MiB and alloc.allocated == 1536 + 5 * MiB
    nearly = alloc.malloc(15 * MiB - 512)  # leaves 512 bytes: not split, the whole block counts
    assert nearly == big + 5 * MiB and alloc.allocated == 1536 + 20 * MiB
    alloc.free(nearly)
    alloc.free(big)  # merges with its free neighbour: one 20 MiB block again
    assert alloc.malloc(20 * MiB) == big and alloc.reserved == 22 * MiB
    alloc.free(a)
    assert alloc.malloc(300) == a  # the smallest free block that fits, lowest address first
    with pytest.raises(ValueError, match="not hold"):
        alloc.free(a + 1)


def test_its_trace_replays_exactly() -> None:
    start = (
        SegmentState(
            1 << 40,
            20 * MiB,
            False,
            (
                BlockState(1 << 40, 4 * MiB, ALLOCATED),
                BlockState((1 << 40) + 4 * MiB, 4 * MiB, FREE),
                BlockState((1 << 40) + 8 * MiB, 12 * MiB, FREE),  # merged with the one before
            ),
        ),
    )
    alloc = CachingAllocator(start)
    assert (alloc.allocated, alloc.reserved) == (4 * MiB, 20 * MiB)
    merged = alloc.layout()
    assert [b.size for b in merged[0].blocks] == [4 * MiB, 16 * MiB]
    assert alloc.malloc(16 * MiB) == (1 << 40) + 4 * MiB
    live = [alloc.malloc(size) for size in (3, 5000, 3 * MiB, 40 * MiB, 700_000)]
    for address in live[::2]:
        alloc.free(address)
    result = replay(merged, alloc.events, allocated_start=4 * MiB, reserved_start=20 * MiB)
    assert result.exact, result.reason
    assert (result.allocated_end, result.reserved_end) == (alloc.allocated, alloc.reserved)
    again = replay(
        alloc.layout(), [], allocated_start=alloc.allocated, reserved_start=alloc.reserved
    )
    assert again.exact


def test_segments_of_other_streams_are_never_used() -> None:
    other = SegmentState(1 << 40, 20 * MiB, False, (BlockState(1 << 40, 20 * MiB, FREE),))
    alloc = CachingAllocator((other,), foreign={1 << 40})
    assert alloc.malloc(2 * MiB) != 1 << 40 and alloc.reserved == 40 * MiB


def test_the_real_allocators_counters_from_its_requests() -> None:
    """The fixture's requests, in order, from its starting layout: the counters of the real
    allocator (torch 2.11, H200) at the peak and at the end, to the byte."""
    data = json.loads(FIXTURE.read_text())
    start = tuple(
        SegmentState(
            s["address"],
            s["total_size"],
            s["is_small"],
            tuple(BlockState(**b) for b in s["blocks"]),
        )
        for s in data["segments_before"]
    )
    alloc = CachingAllocator(start)
    assert (alloc.allocated, alloc.reserved) == (data["allocated_before"], data["reserved_before"])
    ours: dict[int, int] = {}
    peak = alloc.allocated
    for ev in (TraceEvent(**e) for e in data["events"]):
        if ev.action == "alloc":
            ours[ev.address] = alloc.malloc(ev.size)
            peak = max(peak, alloc.allocated)
        elif ev.action == "free_requested":
            alloc.free(ours.pop(ev.address, ev.address))
    assert peak == data["independent_peak_allocated"]
    assert (alloc.allocated, alloc.reserved) == (data["allocated_after"], data["reserved_after"])


def _run() -> FakeRun:
    """Two parameters of 3 MiB and 1 KiB (the first on a real block), a warm-up step that makes
    a 2 MiB state, a measured step with a 6 MiB activation and a 1 MiB temporary."""
    sizes = (3 * MiB, 1024, 2 * MiB, 6 * MiB, MiB, 6 * MiB, MiB)
    events = (
        ("alloc", 3, 2), ("alloc", 4, 3), ("free", 4, 4), ("alloc", 2, 5), ("free", 3, 6),
        ("alloc", 5, 9), ("alloc", 6, 10), ("free", 6, 11), ("free", 5, 12),
    )  # fmt: skip
    return FakeRun(
        device="cuda:0",
        sizes=sizes,
        real={0: 1 << 40},
        existing=(0, 1),
        events=events,
        window=5,
        window_clock=7,
        live_at_window=(0, 1, 2),
        reachable=frozenset({0, 1, 2}),
        tags=((0, "parameters"), (1, "parameters"), (2, "optimizer_state"), (5, "activations")),
        marks=(),
    )


def test_cuda_peaks_start_from_the_real_layout() -> None:
    resident = BlockState((1 << 40) + 3 * MiB, 5 * MiB, ALLOCATED)  # not the trial's
    segment = SegmentState(
        1 << 40, 20 * MiB, False, (BlockState(1 << 40, 3 * MiB, ALLOCATED), resident,
                                   BlockState((1 << 40) + 8 * MiB, 12 * MiB, FREE))
    )  # fmt: skip
    peaks = cuda_peaks(_run(), (segment,))
    assert peaks.resident_bytes == 5 * MiB
    expected = {"parameters": 3 * MiB + 1024, "optimizer_state": 2 * MiB, "activations": 6 * MiB}
    assert peaks.peak_bytes == 5 * MiB + sum(expected.values()) + MiB
    assert peaks.breakdown["held_before"] == 5 * MiB and peaks.breakdown["temporary"] == MiB
    assert peaks.breakdown["unattributed"] == 0 and peaks.held_bytes == 5 * MiB
    assert {k: peaks.breakdown[k] for k in expected} == expected
    assert sum(peaks.breakdown.values()) == peaks.peak_bytes


def test_cpu_peaks_count_exact_bytes_of_what_is_held() -> None:
    peaks = cpu_peaks(_run())
    assert peaks.peak_bytes == 3 * MiB + 1024 + 2 * MiB + 6 * MiB + MiB
    assert peaks.breakdown["temporary"] == MiB and peaks.resident_bytes is None


def test_empty_cache_releases_only_segments_with_nothing_allocated() -> None:
    alloc = CachingAllocator()
    kept, dropped = alloc.malloc(30 * MiB), alloc.malloc(40 * MiB)
    small = alloc.malloc(4096)
    alloc.free(dropped)
    alloc.free(small)
    assert alloc.reserved == 30 * MiB + 40 * MiB + 2 * MiB
    alloc.empty_cache()
    assert alloc.reserved == 30 * MiB and alloc.allocated == 30 * MiB
    assert [s.total_size for s in alloc.layout()] == [30 * MiB]
    assert alloc.block_size(kept) == 30 * MiB


def test_storages_that_loading_made_are_placed_as_it_placed_them() -> None:
    """A 4-bit weight loaded as 112 MiB of bf16, quantized to 28 MiB: the 28 MiB goes in a
    segment of its own while the bf16 one is held; a second weight's bf16 reuses the first's
    freed block and its 28 MiB is carved from the rest. What is left free is released."""
    sizes = (28 * MiB, 28 * MiB, 6 * MiB)
    script = (("alloc", 112 * MiB), ("place", 0), ("free", 0))
    second = (("alloc", 80 * MiB), ("place", 1), ("free", 0))
    run = replace(
        _run(), sizes=sizes, real={}, existing=(0, 1), loading={0: script, 1: second},
        events=(("alloc", 2, 2), ("free", 2, 3)), window=0, window_clock=1,
        live_at_window=(0, 1), reachable=frozenset({0, 1}), tags=((0, "parameters"),),
    )  # fmt: skip
    peaks = cuda_peaks(run, ())
    # the first weight's 28 MiB segment, then the 112 MiB one that holds the second's 28 MiB
    assert peaks.peak_bytes == 2 * 28 * MiB + 6 * MiB
    assert peaks.peak_reserved_bytes == 28 * MiB + 112 * MiB
    plain = cuda_peaks(replace(run, loading={}), ())
    assert plain.peak_reserved_bytes == 2 * 28 * MiB + 20 * MiB  # packed tight, no loading


def test_the_most_each_category_holds_at_once() -> None:
    from jupyter_gpumem.tuner.estimation.fake_peaks import most_held

    most = most_held(_run())
    assert most == {
        "parameters": 3 * MiB + 1024,
        "optimizer_state": 2 * MiB,
        "activations": 6 * MiB,
    }
    # the activation freed before a second one of the same category: the most is one of them
    twice = replace(_run(), tags=((5, "activations"), (6, "activations")))
    assert most_held(twice)["activations"] == 6 * MiB + MiB  # both alive between 10 and 11


def test_a_private_pool_keeps_its_segments_to_itself() -> None:
    """A CUDA graph's pool: its requests never take the default pool's free blocks, nor the
    default pool its; empty_cache keeps its segments, and the layout marks them private."""
    alloc = CachingAllocator()
    freed = alloc.malloc(4 * MiB)
    alloc.free(freed)
    pooled = alloc.malloc(4 * MiB, pool=1)
    assert pooled != freed and alloc.reserved == 2 * 20 * MiB  # a segment of the pool's own
    again = alloc.malloc(2 * MiB, pool=1)  # carved from the pool's segment
    assert pooled < again < pooled + 20 * MiB
    alloc.free(pooled)
    alloc.free(again)
    assert alloc.malloc(3 * MiB) == freed  # the default pool's block, not the pool's
    alloc.empty_cache()
    assert [(s.total_size, s.private_pool) for s in alloc.layout()] == [
        (20 * MiB, False),
        (20 * MiB, True),
    ]
    assert replay(alloc.layout(), [], allocated_start=3 * MiB, reserved_start=40 * MiB).exact


def test_storages_made_in_a_graph_pool_are_placed_in_a_pool_of_their_own() -> None:
    """The same run with its step's activation made in a CUDA graph's pool: it takes a segment
    of the pool's own instead of the default pool's free block, reserved beside it."""
    plain = cuda_peaks(_run(), ())
    pooled = cuda_peaks(replace(_run(), pooled=frozenset({5})), ())
    assert pooled.peak_bytes == plain.peak_bytes
    assert pooled.peak_reserved_bytes == plain.peak_reserved_bytes + 20 * MiB


def test_a_capture_empties_the_default_pools_cache_first() -> None:
    """A 30 MiB temporary freed, then one of a CUDA graph's pool: held beside the first's
    cached segment (80 MiB reserved), unless a capture emptied the cache between (50 MiB)."""
    run = FakeRun(
        device="cuda:0",
        sizes=(4 * MiB, 30 * MiB, 30 * MiB),
        real={},
        existing=(0,),
        events=(("alloc", 1, 1), ("free", 1, 2), ("alloc", 2, 4), ("free", 2, 5)),
        window=0,
        window_clock=1,
        live_at_window=(0,),
        reachable=frozenset({0}),
        tags=((0, "parameters"),),
        marks=(),
        pooled=frozenset({2}),
    )
    assert cuda_peaks(run, ()).peak_reserved_bytes == 20 * MiB + 30 * MiB + 30 * MiB
    emptied = cuda_peaks(replace(run, emptied=(3,)), ())
    assert emptied.peak_reserved_bytes == 20 * MiB + 30 * MiB
    assert emptied.peak_bytes == 4 * MiB + 30 * MiB


def test_cleared_workspaces_leave_the_peak_and_go_with_the_next_capture() -> None:
    """A 32 MiB cuBLAS workspace held from before, then a 40 MiB temporary: both at the peak,
    unless CUDA graph trees cleared the workspace and a capture released its segment first."""
    from jupyter_gpumem.tuner.estimation.fake_peaks import WorkspaceBlock

    base = 1 << 40
    workspace = SegmentState(base, 32 * MiB, False, (WorkspaceBlock(base, 32 * MiB, ALLOCATED),))
    run = FakeRun(
        device="cuda:0",
        sizes=(40 * MiB,),
        real={},
        existing=(),
        events=(("alloc", 0, 4), ("free", 0, 5)),
        window=0,
        window_clock=1,
        live_at_window=(),
        reachable=frozenset(),
        tags=(),
        marks=(),
    )
    kept = cuda_peaks(run, (workspace,))
    assert kept.peak_bytes == kept.peak_reserved_bytes == 72 * MiB
    assert kept.breakdown["library_workspace"] == 32 * MiB
    cleared = cuda_peaks(replace(run, cleared=(2,), emptied=(3,)), (workspace,))
    assert cleared.peak_bytes == cleared.peak_reserved_bytes == 40 * MiB
    assert cleared.breakdown["library_workspace"] == 0
    assert cleared.breakdown["unattributed"] == 0
    assert sum(cleared.breakdown.values()) == cleared.peak_bytes


@pytest.mark.parametrize("seed", range(40))
def test_its_own_count_is_the_replay_of_its_trace(seed: int) -> None:
    """From any event on, the peaks, series and live blocks the model counts are what the
    replay of its trace gives, over the layout it had there."""
    rng = random.Random(seed)
    start = (
        SegmentState(
            1 << 40,
            20 * MiB,
            False,
            (
                BlockState(1 << 40, 4 * MiB, ALLOCATED, None),
                BlockState((1 << 40) + 4 * MiB, 16 * MiB, FREE),
            ),
        ),
    )
    alloc = CachingAllocator(start if seed % 2 else ())
    live = [1 << 40] if seed % 2 else []
    layouts = {0: alloc.layout()}
    sizes = (1, 511, 513, 4096, 300_000, MiB, MiB + 1, 3 * MiB, 9 * MiB, 12 * MiB, 45 * MiB)
    for _ in range(rng.randrange(20, 120)):
        if live and rng.random() < 0.45:
            alloc.free(live.pop(rng.randrange(len(live))))
        elif rng.random() < 0.05:
            alloc.empty_cache()
        else:
            live.append(alloc.malloc(rng.choice(sizes) + rng.randrange(0, 2048)))
        if rng.random() < 0.2:
            layouts[len(alloc.events)] = alloc.layout()
    for first, layout in layouts.items():
        counted = alloc.played(first)
        at_start = (4 * MiB, 20 * MiB) if seed % 2 else (0, 0)
        before = (alloc.allocated_series[first - 1], alloc.reserved_series[first - 1])
        before = before if first else at_start
        replayed = replay(
            layout, alloc.events[first:], allocated_start=before[0], reserved_start=before[1]
        )
        assert replayed.exact, replayed.reason
        for name in ("allocated_start", "allocated_end", "reserved_start", "reserved_end",
                     "peak_allocated", "peak_reserved", "peak_index", "live_at_peak",
                     "allocated_series", "reserved_series"):  # fmt: skip
            assert getattr(counted, name) == getattr(replayed, name), name
