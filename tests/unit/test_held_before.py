"""What the process held before an estimate: named, left out on request, never on another card.

The allocator model starts from a recorded layout (no GPU): a 3 MiB parameter on its real block,
two cuBLAS workspaces, the cuBLASLt workspace (1 MiB) and a 1 MiB weight of the user's beside it
in a small segment, and a 2 GiB tensor of the user's in a segment of its own. The workspaces are
told by address, as ``device_facts`` finds them on a GPU, so the weight of a workspace's size is
held; where torch cannot clear the workspaces, sizes tell them, and the estimate says so.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from jupyter_gpumem.records import ALLOCATED, BlockState, SegmentState
from jupyter_gpumem.tracking import workspaces
from jupyter_gpumem.tuner.estimation.cards import card
from jupyter_gpumem.tuner.estimation.estimate import Estimate, from_peaks
from jupyter_gpumem.tuner.estimation.fake_peaks import (
    DeviceFacts,
    FoundWorkspaces,
    Peaks,
    WorkspaceBlock,
    cuda_peaks,
    held_blocks,
    layout_of,
)
from jupyter_gpumem.tuner.estimation.fake_step import FakeRun
from jupyter_gpumem.tuner.estimation.on_card import checked_count_held, counts_held, on_card
from jupyter_gpumem.tuner.estimation.verdict import verdict

MiB, GiB = 1 << 20, 1 << 30
PARAM, WORKSPACE, SMALL = 1 << 40, (1 << 40) + 64 * MiB, (1 << 40) + 128 * MiB
HELD = (1 << 40) + 256 * MiB
POOL = 1 << 41  # a CUDA graph pool's segments
LT, WEIGHT = SMALL, SMALL + MiB  # the cuBLASLt workspace, and the user's 512 x 512 fp32 weight
WORKSPACES = {WORKSPACE: 32 * MiB, WORKSPACE + 32 * MiB: 32 * MiB, LT: MiB}
H200 = DeviceFacts(
    name="NVIDIA H200",
    total_bytes=card("H200").total_bytes,
    capability=(9, 0),
    workspace_bytes=0,
    context_bytes=500 * MiB,
)
BY_SIZE = DeviceFacts(**{**H200.__dict__, "workspace_sizes": (32 * MiB, MiB)})


def _segment(address: int, total: int, blocks: list[tuple[int, int, str]], small: bool = False) -> dict[str, Any]:  # fmt: skip
    """A segment as ``torch.cuda.memory_snapshot()`` gives it: blocks as (offset, size, state)."""
    return {
        "device": 0, "address": address, "total_size": total, "stream": 0,
        "segment_type": "small" if small else "large",
        "blocks": [
            {"address": address + offset, "size": size, "requested_size": size, "state": state}
            for offset, size, state in blocks
        ],
    }  # fmt: skip


def _snapshot(held: bool = True) -> list[dict[str, Any]]:
    """The parameter's segment, the cuBLAS workspaces', the small one of the cuBLASLt workspace
    and the user's 1 MiB weight (free where not ``held``), and, where ``held``, the user's 2 GiB
    tensor's."""
    used, free = "active_allocated", "inactive"
    segments = [
        _segment(PARAM, 20 * MiB, [(0, 3 * MiB, used), (3 * MiB, 17 * MiB, free)]),
        _segment(WORKSPACE, 64 * MiB, [(0, 32 * MiB, used), (32 * MiB, 32 * MiB, used)]),
        _segment(SMALL, 2 * MiB, [(0, MiB, used), (MiB, MiB, used if held else free)], True),
    ]
    if held:
        segments.append(_segment(HELD, 2 * GiB, [(0, 2 * GiB, used)]))
    return segments


def _layout(held: bool = True) -> tuple[SegmentState, ...]:
    """The layout ``start_layout`` makes of :func:`_snapshot`: the workspaces by their addresses."""
    segments, foreign = layout_of(_snapshot(held), 0, 0, (), WORKSPACES)
    assert not foreign
    return segments


def _run() -> FakeRun:
    """The parameter (on its real block), then a 6 MiB activation and a 1 MiB temporary."""
    return FakeRun(
        device="cuda:0",
        sizes=(3 * MiB, 6 * MiB, MiB),
        real={0: PARAM},
        existing=(0,),
        events=(("alloc", 1, 2), ("alloc", 2, 3), ("free", 2, 4), ("free", 1, 5)),
        window=0,
        window_clock=1,
        live_at_window=(0,),
        reachable=frozenset({0}),
        tags=((0, "parameters"), (1, "activations")),
        marks=(),
    )


def _estimate(peaks: Peaks, target: str | None = None) -> Estimate:
    found = from_peaks(peaks, H200, t0=time.perf_counter(), label="baseline", device="cuda:0")
    return on_card(found, H200, None if target is None else card(target))


def _peaks(count_held: bool, held: bool = True) -> Peaks:
    return cuda_peaks(_run(), _layout(held), workspaces=H200.workspace_sizes, count_held=count_held)


def test_what_was_held_is_its_own_category_with_a_note() -> None:
    peaks = _peaks(count_held=True)
    assert peaks.held_bytes == 2 * GiB + MiB and peaks.held_counted
    assert peaks.breakdown["held_before"] == 2 * GiB + MiB  # the 1 MiB weight too
    assert peaks.breakdown["library_workspace"] == 65 * MiB  # the workspaces alone
    assert peaks.breakdown["unattributed"] == 0
    assert peaks.breakdown["parameters"] == 3 * MiB and peaks.breakdown["activations"] == 6 * MiB
    assert peaks.peak_bytes == 2 * GiB + MiB + 65 * MiB + 3 * MiB + 6 * MiB + MiB
    assert sum(peaks.breakdown.values()) == peaks.peak_bytes
    est = _estimate(peaks)
    assert est.held_bytes == 2 * GiB + MiB and est.held_counted
    assert est.notes == (
        "held before the call: 2.00 GiB (not the model's; count_held=False leaves it out)",
    )
    assert est.verdict is not None and est.verdict.reserved_bytes == peaks.peak_reserved_bytes
    text = est.text()
    assert "held before" in text and "library workspace" in text and "unattributed" not in text
    assert "note: held before the call: 2.00 GiB" in text


def test_a_tensor_of_a_workspaces_size_is_held_where_no_workspace_is() -> None:
    """The issue's Llama: sixteen 512 x 512 fp32 weights of 1 MiB each, cuBLASLt's request.
    By address the weight is held and the workspace is not; by size both were workspaces."""
    layout = _layout()
    blocks = {b.address: b for seg in layout for b in seg.blocks}
    assert isinstance(blocks[LT], WorkspaceBlock) and not isinstance(blocks[WEIGHT], WorkspaceBlock)
    assert type(blocks[PARAM]) is BlockState and blocks[LT].state == ALLOCATED
    held = held_blocks(_run(), layout)
    assert held == {WEIGHT: MiB, HELD: 2 * GiB}  # the parameter is the run's own
    plain, _ = layout_of(_snapshot(), 0, 0, ())  # where torch cannot tell them by address
    assert held_blocks(_run(), plain, BY_SIZE.workspace_sizes) == {HELD: 2 * GiB}
    # what the trial clears is freed, workspace or not; a block of another stream is foreign
    dropped, _ = layout_of(_snapshot(), 0, 0, {WEIGHT}, WORKSPACES)
    assert held_blocks(_run(), dropped) == {HELD: 2 * GiB}
    other = [{**seg, "stream": 7} if seg["address"] == HELD else seg for seg in _snapshot()]
    assert layout_of(other, 0, 0, (), WORKSPACES)[1] == frozenset({HELD})
    assert layout_of(_snapshot(), 1, 0, (), WORKSPACES) == ((), frozenset())  # another device


def test_workspaces_told_by_size_are_named_and_the_estimate_says_so() -> None:
    plain, _ = layout_of(_snapshot(), 0, 0, ())
    peaks = cuda_peaks(_run(), plain, workspaces=BY_SIZE.workspace_sizes)
    assert peaks.held_bytes == 2 * GiB  # the 1 MiB weight taken for a workspace
    assert peaks.breakdown["library_workspace"] == 66 * MiB
    found = from_peaks(peaks, BY_SIZE, t0=time.perf_counter(), label="b", device="cuda:0")
    notes = on_card(found, BY_SIZE, None).notes
    assert notes[-1] == (
        "library workspaces told by the size they ask for (32.0 MiB or 1.00 MiB), not by address "
        "(this torch cannot clear them safely, or clearing them found none): a tensor held of that "
        "size counts as a workspace, not as held before the call"
    )
    assert not any("told by the size" in n for n in _estimate(_peaks(count_held=True)).notes)


def test_a_layout_that_is_no_longer_as_found_is_found_again() -> None:
    """``start_layout`` finds the workspaces again (clearing them) only where the snapshot
    doubts what was found: a workspace gone, or a block of a workspace's request unknown."""
    found = FoundWorkspaces(WORKSPACES, frozenset({WEIGHT}), frozenset({32 * MiB, MiB}))
    assert found.describes(_snapshot(), 0)
    assert found.describes(_snapshot(held=False), 0)  # what the user freed changes nothing
    cleared = [seg for seg in _snapshot() if seg["address"] != WORKSPACE]
    assert not found.describes(cleared, 0)  # the cuBLAS workspaces were cleared
    new = _segment(1 << 44, 2 * MiB, [(0, MiB, "active_allocated")], small=True)
    assert not found.describes([*_snapshot(), new], 0)  # a new tensor of 1 MiB, or a workspace
    unknown = FoundWorkspaces(WORKSPACES, frozenset(), frozenset({32 * MiB, MiB}))
    assert not unknown.describes(_snapshot(), 0)  # the user's weight, not known yet


def test_count_held_false_estimates_a_process_that_holds_nothing_else() -> None:
    counted, left_out = _peaks(count_held=True), _peaks(count_held=False)
    fresh = _peaks(count_held=True, held=False)
    assert left_out.peak_bytes == counted.peak_bytes - 2 * GiB - MiB == fresh.peak_bytes
    # the run's 1 MiB temporary takes the weight's place beside the cuBLASLt workspace, where
    # counted it needs a small segment of its own
    assert left_out.peak_reserved_bytes == counted.peak_reserved_bytes - 2 * GiB - 2 * MiB
    assert left_out.peak_reserved_bytes == fresh.peak_reserved_bytes
    assert left_out.breakdown == fresh.breakdown and left_out.breakdown["held_before"] == 0
    assert left_out.held_bytes == 2 * GiB + MiB and not left_out.held_counted
    est = _estimate(left_out)
    assert est.notes == (
        "held before the call: 2.00 GiB, left out (count_held=False): the estimate is for a "
        "process holding nothing else",
    )
    assert _estimate(fresh).notes == ()  # nothing held, nothing said


def test_a_verdict_for_another_card_never_counts_what_is_held_here() -> None:
    rtx = card("RTX-4090")
    assert counts_held(True, H200, None) and counts_held(True, H200, card("H200"))
    assert not counts_held(True, H200, rtx) and not counts_held(False, H200, None)
    est = _estimate(_peaks(count_held=counts_held(True, H200, rtx)), "RTX-4090")
    fresh = _estimate(_peaks(count_held=True, held=False), "RTX-4090")
    assert est.verdict is not None and fresh.verdict is not None
    assert est.verdict.needed_bytes == fresh.verdict.needed_bytes < 1 * GiB
    assert est.peak_bytes == fresh.peak_bytes and est.breakdown == fresh.breakdown
    assert est.notes[-1] == (
        "held before the call: 2.00 GiB on this H200, left out: it is held here, not on the RTX-4090"
    )
    # the same card by name is this one: what is held is there
    same = _estimate(_peaks(count_held=counts_held(True, H200, card("H200"))), "H200")
    assert same.verdict is not None and same.verdict.reserved_bytes > 2 * GiB


def _with_graph_pool() -> list[dict[str, Any]]:
    """:func:`_snapshot` less the 2 GiB tensor, with a compiled model's CUDA graph pool: two
    segments of a private pool, every block free (as a captured graph leaves its pool)."""
    pool = [
        {**_segment(POOL + i * 64 * MiB, size, [(0, size, "inactive")]), "segment_pool_id": (0, 1)}
        for i, size in enumerate((40 * MiB, 20 * MiB))
    ]
    return [*_snapshot(held=False), *pool]


def test_a_cuda_graph_pool_counts_in_reserved_and_is_never_allocated_from() -> None:
    """The zoo's lived-in process: a compiled generate left 114 MiB of graph pools reserved, and
    every estimate after it was 114 MiB short of the reserved peak measured there."""
    segments, foreign = layout_of(_with_graph_pool(), 0, 0, (), WORKSPACES)
    pooled = [s for s in segments if s.private_pool]
    assert [s.total_size for s in pooled] == [40 * MiB, 20 * MiB]
    assert foreign == frozenset(s.address for s in pooled)  # reserved, never handed out
    plain = _peaks(count_held=True, held=False)
    peaks = cuda_peaks(_run(), segments, foreign, workspaces=H200.workspace_sizes)
    assert peaks.peak_bytes == plain.peak_bytes and peaks.breakdown == plain.breakdown
    assert peaks.peak_reserved_bytes == plain.peak_reserved_bytes + 60 * MiB
    assert peaks.pool_bytes == 60 * MiB and plain.pool_bytes == 0
    est = _estimate(peaks)
    assert est.held_pool_bytes == 60 * MiB
    assert est.notes == (
        "CUDA graph pools of this process reserve 60.0 MiB before the call (a compiled model's, "
        "kept while it lives): in the reserved peak, never used by this workload; "
        "count_held=False leaves them out",
    )
    # a process that holds nothing else (and another card) has no pools
    left_out = cuda_peaks(
        _run(), segments, foreign, workspaces=H200.workspace_sizes, count_held=False
    )
    assert left_out.peak_reserved_bytes == plain.peak_reserved_bytes and left_out.pool_bytes == 0
    assert _estimate(left_out).notes == ()


def test_held_memory_that_dominates_a_verdict_says_how_to_leave_it_out() -> None:
    over = verdict(card("L4"), 30 * GiB, GiB, {"held_before": 20 * GiB, "parameters": 9 * GiB})
    assert not over.fits
    assert "most of the peak is held before the call (20.0 GiB) and parameters" in over.line()
    assert over.remedies[0].startswith("held before the call: deleting what this process holds")
    assert "count_held=False" in over.remedies[0]


@pytest.mark.parametrize("value", ["no", 0, None, 1.0])
def test_count_held_must_be_a_bool(value: object) -> None:
    with pytest.raises(TypeError, match=r"count_held must be True .* or False .*, got"):
        checked_count_held(value)
    assert checked_count_held(False) is False


class _Device:
    """The allocator of one device whose library workspaces torch clears and a matmul makes
    again, each at the first of its addresses that is free; the user's weight stays put."""

    def __init__(self) -> None:
        self.blocks = {SMALL: MiB, WEIGHT: MiB, WORKSPACE: 32 * MiB}  # cuBLASLt's, the user's
        self.workspaces = {SMALL, WORKSPACE}
        self.cleared = 0

    def clear(self) -> None:
        self.cleared += 1
        for address in self.workspaces:
            del self.blocks[address]
        self.workspaces = set()

    def make(self) -> None:
        for addresses, size in (((1 << 44, 1 << 46), 32 * MiB), ((SMALL, SMALL + 2 * MiB), MiB)):
            if size not in {self.blocks[a] for a in self.workspaces}:
                address = next(a for a in addresses if a not in self.blocks)
                self.blocks[address] = size
                self.workspaces.add(address)

    def snapshot(self, **_: object) -> list[dict[str, Any]]:
        return [
            _segment(a, n, [(0, n, "active_allocated")], n <= MiB) for a, n in self.blocks.items()
        ]


def _torch(device: _Device, version: str, *, public: bool = False) -> Any:
    cuda = SimpleNamespace(memory_snapshot=device.snapshot, current_device=lambda: 0)
    if public:
        cuda.clear_cublas_workspaces = lambda _device: device.clear()
    c = SimpleNamespace(_cuda_clearCublasWorkspaces=device.clear)
    return SimpleNamespace(__version__=version, cuda=cuda, _C=c)


def test_workspaces_are_found_by_clearing_them_and_making_them_again() -> None:
    device = _Device()
    got = workspaces.remade(_torch(device, "2.13.0+cu128"), SimpleNamespace(index=0), device.make)
    assert got is not None and device.cleared == 1
    assert got.workspaces == {SMALL: MiB, 1 << 44: 32 * MiB}  # not the weight of 1 MiB
    assert {b["address"] for seg in got.snapshot for b in seg["blocks"]} == set(device.blocks)


def test_workspaces_are_cleared_only_where_torch_does_so_safely() -> None:
    """Before 2.10 torch's workspace maps are not locked: clearing them beside another thread's
    matmul could crash it, so sizes tell them there (unless torch offers its own function)."""
    device = _Device()
    assert workspaces.clearer(_torch(device, "2.9.1+cu126")) is None
    assert workspaces.remade(_torch(device, "2.9.1"), SimpleNamespace(index=0), device.make) is None
    assert device.cleared == 0
    assert workspaces.clearer(_torch(device, "2.10.0")) is not None
    public = workspaces.clearer(_torch(device, "2.9.1", public=True))
    assert public is not None
    public("cuda:0")
    assert device.cleared == 1
    bare = SimpleNamespace(__version__="2.13.0", cuda=SimpleNamespace(), _C=SimpleNamespace())
    assert workspaces.clearer(bare) is None  # a CPU build: nothing to clear


def test_a_layout_finds_the_workspaces_again_only_where_it_doubts_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jupyter_gpumem.tuner.estimation import fake_peaks

    device = _Device()
    torch = _torch(device, "2.13.0+cu128")
    torch.cuda.current_stream = lambda _device: SimpleNamespace(cuda_stream=0)
    torch._C._cuda_getCublasWorkspaceSize = lambda: 32 * MiB
    torch._C._cuda_getCublasLtWorkspaceSize = lambda: MiB
    monkeypatch.setattr(fake_peaks, "_make_workspaces", lambda _torch, _device: device.make())
    monkeypatch.setattr(fake_peaks, "_FOUND", {})
    cuda = SimpleNamespace(index=0)

    def marked() -> set[int]:
        segments, _ = fake_peaks.start_layout(torch, cuda, ())
        return {b.address for seg in segments for b in seg.blocks if isinstance(b, WorkspaceBlock)}

    assert fake_peaks.library_workspaces(torch, cuda) == {SMALL, 1 << 44}
    assert marked() == {SMALL, 1 << 44} and device.cleared == 1  # as found: not cleared again
    device.blocks[1 << 45] = MiB  # a new tensor of the cuBLASLt workspace's size
    assert marked() == {SMALL, 1 << 44} and device.cleared == 2  # found again: not a workspace
    assert marked() == {SMALL, 1 << 44} and device.cleared == 2  # and known from then on
    device.clear()  # the user's, or CUDA-graph trees' (torch.compile)
    device.blocks[SMALL] = MiB  # a tensor takes the cuBLASLt workspace's old block
    device.make()
    assert marked() == {1 << 44, SMALL + 2 * MiB} and device.cleared == 4
    assert fake_peaks.held_blocks(_run(), fake_peaks.start_layout(torch, cuda, ())[0]) == {
        SMALL: MiB,
        WEIGHT: MiB,
        1 << 45: MiB,
    }
    # a torch whose clear frees nothing: a matmul makes nothing, and sizes tell the workspaces
    stuck = _Device()
    torch._C._cuda_clearCublasWorkspaces = lambda: None
    monkeypatch.setattr(fake_peaks, "_make_workspaces", lambda _torch, _device: stuck.make())
    torch.cuda.memory_snapshot = stuck.snapshot
    assert fake_peaks.library_workspaces(torch, cuda) is None and not marked()


def test_on_another_card_the_breakdown_still_sums_to_the_peak() -> None:
    here = _estimate(_peaks(count_held=False))
    for other in ("RTX-4090", "A100-40GB", "T4"):
        there = _estimate(_peaks(count_held=False), other)
        assert there.breakdown is not None and here.breakdown is not None
        assert sum(there.breakdown.values()) == there.peak_bytes
        moved = there.peak_bytes - here.peak_bytes
        assert there.breakdown["library_workspace"] == here.breakdown["library_workspace"] + moved
