"""What a block counts as: its request in its category, the rest as the allocator's slack."""

import random

from jupyter_gpumem.analysis.breakdown import ALLOCATOR_SLACK, categorize, peak_phase, phase_peaks
from jupyter_gpumem.analysis.replay import Live, live_blocks, replay
from jupyter_gpumem.records import (
    ALLOCATED,
    FREE,
    BlockState,
    PhaseMark,
    SegmentState,
    Tag,
    TraceEvent,
)

MiB = 2**20
BASE = 0x7F0000000000
WEIGHT = 2 * MiB + 4096  # a parameter's storage


def _start() -> tuple[SegmentState, ...]:
    # A weight allocated before the cell into a cached 3 MiB block: the 1 MiB - 4 KiB rest was
    # too small to split off, so the block is all allocated. A 2.5 MiB free block follows.
    return (
        SegmentState(
            BASE,
            20 * MiB,
            False,
            (
                BlockState(BASE, 3 * MiB, ALLOCATED, WEIGHT),
                BlockState(BASE + 3 * MiB, 5 * MiB // 2, FREE),
                BlockState(BASE + 11 * MiB // 2, 29 * MiB // 2, ALLOCATED),  # no request known
            ),
        ),
    )


def test_requests_count_in_their_category_and_the_rest_is_slack() -> None:
    grad = BASE + 3 * MiB
    events = [
        TraceEvent("alloc", grad, WEIGHT, 10),  # the free 2.5 MiB block, unsplit
        TraceEvent("segment_alloc", BASE + 20 * MiB, 2 * MiB, 11),
        TraceEvent("alloc", BASE + 20 * MiB, 100, 11),  # a 512-byte block
    ]
    start = live_blocks(_start())
    result = replay(_start(), events)
    assert result.exact and result.peak_allocated == 20 * MiB + 512
    tags = [Tag(BASE, "parameters", 5, WEIGHT), Tag(grad, "gradients", 12, WEIGHT)]
    out = categorize(result.live_at_peak, events, tags, start, {})
    assert out["parameters"] == WEIGHT and out["gradients"] == WEIGHT
    assert out["unattributed"] == 29 * MiB // 2 + 100  # the unknown block, whole; the 100 B
    assert out[ALLOCATOR_SLACK] == (3 * MiB - WEIGHT) + (5 * MiB // 2 - WEIGHT) + (512 - 100)
    assert sum(out.values()) == result.peak_allocated


def test_a_layout_without_requests_counts_whole_blocks() -> None:
    old = tuple(
        SegmentState(s.address, s.total_size, s.is_small, tuple(
            BlockState(b.address, b.size, b.state) for b in s.blocks
        ))
        for s in _start()
    )  # fmt: skip
    start = live_blocks(old)
    out = categorize(start, [], [Tag(BASE, "parameters", 5, WEIGHT)], start, {})
    assert out["parameters"] == 3 * MiB and out[ALLOCATOR_SLACK] == 0


TORCH = "/venv/lib/python3.12/site-packages/torch"
CALLERS = {
    "fsdp all-gather": ((f"{TORCH}/_ops.py", f"{TORCH}/distributed/fsdp/_fully_shard/_fsdp_collectives.py"), "communication"),
    "ddp buckets": ((f"{TORCH}/nn/parallel/distributed.py", "/home/me/train.py"), "communication"),
    "redistribute": ((f"{TORCH}/distributed/tensor/_redistribute.py",), "communication"),
    "a layer inside DDP": ((f"{TORCH}/nn/modules/linear.py", f"{TORCH}/nn/parallel/distributed.py"), "unattributed"),
    "DTensor's op dispatch": ((f"{TORCH}/distributed/tensor/_dispatch.py", "/home/me/train.py"), "unattributed"),
    "no frames": ((), "unattributed"),
}  # fmt: skip


def test_buffers_that_torch_distributed_allocates_itself_are_communication() -> None:
    events = [TraceEvent("segment_alloc", BASE, 20 * MiB, 1)]
    for i, (files, _) in enumerate(CALLERS.values()):
        frames = tuple({"filename": f, "line": 1, "name": "f"} for f in files)
        events.append(TraceEvent("alloc", BASE + i * MiB, MiB, 2, frames))
    result = replay([], events)
    by_address = {b.address: b for b in result.live_at_peak}
    for i, (case, (_, expected)) in enumerate(CALLERS.items()):
        out = categorize([by_address[BASE + i * MiB]], events, [], (), {})
        assert out[expected] == MiB, case


SLACK = 2_000  # µs, as between the CUDA allocator's clock and Python's


def _one_address(*lives: tuple[int, int | None]) -> list[TraceEvent]:
    """Storages of one size at one address, (allocated, freed) in µs, after a segment at 0."""
    events = [TraceEvent("segment_alloc", BASE, 2 * MiB, 0)]
    for born, freed in lives:
        events.append(TraceEvent("alloc", BASE, MiB, born))
        if freed is not None:
            events.append(TraceEvent("free_requested", BASE, MiB, freed))
    return events


def _category_of(events: list[TraceEvent], nth: int, tags: list[Tag]) -> str:
    """The category of the storage that the ``nth`` alloc made, were it live at the peak."""
    allocs = [i for i, ev in enumerate(events) if ev.action == "alloc"]
    block = Live(BASE, MiB, MiB, allocs[nth])
    out = categorize([block], events, tags, (), {}, clock_slack_us=SLACK)
    return next(c for c, n in out.items() if n)


def test_a_tag_taken_just_after_the_address_is_reused_is_the_new_storages() -> None:
    # An optimizer temporary is the peak's block; the next step's gradient reuses its
    # address 100 µs after it is freed, and its hook tags it 50 µs later: within the clock
    # slack of the temporary's free, but inside the gradient's own life.
    events = _one_address((1_000, 5_000), (5_100, None))
    grad_tag = Tag(BASE, "gradients", 5_150, MiB)
    assert _category_of(events, 0, [grad_tag]) == "temporary"


def test_a_tag_within_the_clock_slack_of_a_birth_still_counts() -> None:
    events = _one_address((1_000, None))
    assert _category_of(events, 0, [Tag(BASE, "activations", 900, MiB)]) == "activations"
    assert (
        _category_of(events, 0, [Tag(BASE, "activations", 900 - SLACK - 1, MiB)]) == "unattributed"
    )


def test_a_tag_between_two_storages_goes_to_the_nearer_and_on_a_tie_to_the_later() -> None:
    events = _one_address((1_000, 2_000), (2_600, None))
    nearer_first = Tag(BASE, "gradients", 2_200, MiB)
    tie = Tag(BASE, "gradients", 2_300, MiB)
    assert _category_of(events, 0, [nearer_first]) == "gradients"
    assert _category_of(events, 1, [nearer_first]) == "unattributed"
    assert _category_of(events, 0, [tie]) == "temporary"
    assert _category_of(events, 1, [tie]) == "gradients"


def test_a_tag_clock_that_trails_the_allocators_is_brought_to_it() -> None:
    """A storage freed and one of the same size born at its address 5 us later: the tag made
    just after the second was born reads, on a clock 20 us behind, inside the first one's life.
    Activations tagged just after their births show the lag, and the tag goes where it belongs.
    """
    size = 16 * MiB
    at, others = BASE, [BASE + (k + 1) * size for k in range(20)]
    events = [TraceEvent("alloc", at, size, 1_000), TraceEvent("free_requested", at, size, 1_100)]
    events += [TraceEvent("free_completed", at, size, 1_100), TraceEvent("alloc", at, size, 1_105)]
    events += [TraceEvent("alloc", a, size, 1_200 + 10 * k) for k, a in enumerate(others)]
    lag = 20
    tags = [Tag(at, "gradients", 1_107 - lag, size)]
    tags += [Tag(a, "activations", 1_202 + 10 * k - lag, size) for k, a in enumerate(others)]
    blocks = [Live(at, size, size, 3)] + [Live(a, size, size, 4 + k) for k, a in enumerate(others)]
    out = categorize(blocks, events, tags, [], {}, clock_slack_us=2_000)
    assert out["gradients"] == size and out["activations"] == 20 * size
    # the same tags on one clock (the CPU source): no shift, the tag reads in the first life
    out = categorize(blocks, events, tags, [], {}, clock_slack_us=0)
    assert out["gradients"] == 0


def test_a_tag_goes_to_the_nearest_storage_of_its_size_past_smaller_ones_between() -> None:
    # An optimizer temporary, then two smaller storages, then the next step's gradient, all at
    # one address. The gradient's tag is taken inside its own life, 350 µs after the temporary
    # was freed (within the clock slack): the smaller storages between cannot hold it, and
    # the nearest storage of its size is the gradient, not the temporary.
    small = MiB // 4
    events = [
        TraceEvent("segment_alloc", BASE, 2 * MiB, 0),
        TraceEvent("alloc", BASE, MiB, 1_000),
        TraceEvent("free_requested", BASE, MiB, 1_100),
        TraceEvent("alloc", BASE, small, 1_150),
        TraceEvent("free_requested", BASE, small, 1_200),
        TraceEvent("alloc", BASE, small, 1_250),
        TraceEvent("free_requested", BASE, small, 1_300),
        TraceEvent("alloc", BASE, MiB, 1_400),
    ]
    grad_tag = Tag(BASE, "gradients", 1_450, MiB)
    assert _category_of(events, 0, [grad_tag]) == "temporary"
    assert _category_of(events, 3, [grad_tag]) == "gradients"


def test_each_phase_peak_is_the_most_allocated_at_any_instant_of_that_phase() -> None:
    rng = random.Random(7)
    for _ in range(200):
        times = sorted(rng.randrange(0, 60) for _ in range(rng.randrange(0, 40)))
        events = [TraceEvent("alloc", 512 * (k + 1), 512, t) for k, t in enumerate(times)]
        allocated = [rng.randrange(0, 10_000) for _ in events]
        mark_times = sorted(rng.randrange(0, 60) for _ in range(rng.randrange(1, 6)))
        phases = ("forward", "backward", "optimizer")
        marks = [PhaseMark(t, rng.choice(phases), 0) for t in mark_times]
        start = rng.randrange(0, 30)
        expected: dict[str, int] = {}
        instants = [(start, 5_000), *zip(times, allocated, strict=True)]
        for when, value in instants:
            phase = peak_phase(marks, when)[0] or "other"
            expected[phase] = max(expected.get(phase, -1), value)
        got = phase_peaks(marks, events, allocated, start_us=start, start_bytes=5_000)
        assert got == expected
    assert phase_peaks([], [], [], start_us=0, start_bytes=1) == {}
