"""Bytes no tensor owns: library workspaces, CUDA graph pools, and why the rest is unattributed."""

import types

import pytest

from jupyter_gpumem.analysis import library_memory as lm
from jupyter_gpumem.analysis.attribution import Attribution
from jupyter_gpumem.analysis.breakdown import categorize
from jupyter_gpumem.analysis.replay import live_blocks, replay
from jupyter_gpumem.records import ALLOCATED, BlockState, SegmentState, TraceEvent, Workspace
from jupyter_gpumem.report.build import residue_notes
from jupyter_gpumem.tracking import snapshot, workspaces

MiB = 2**20
BASE = 0x7F0000000000
POOL = 0x7E0000000000
CUBLAS = Workspace("cuBLAS workspace", 32 * MiB)
CUBLASLT = Workspace("cuBLASLt workspace", 1 * MiB)
CELL = ("<ipython-input-3-abc>", 0)


def _held() -> tuple[SegmentState, ...]:
    """Before the cell: a cuBLAS workspace, a tensor nothing names, and a graph pool's block."""
    return (
        SegmentState(
            BASE,
            40 * MiB,
            False,
            (
                BlockState(BASE, 32 * MiB, ALLOCATED, 32 * MiB),
                BlockState(BASE + 32 * MiB, 8 * MiB, ALLOCATED, 8 * MiB),
            ),
        ),
        SegmentState(
            POOL, 20 * MiB, False, (BlockState(POOL, 20 * MiB, ALLOCATED, 6 * MiB),), True
        ),
    )


def test_unclaimed_blocks_are_named_by_size_and_pool_and_the_rest_says_why() -> None:
    start = _held()
    new = BASE + 64 * MiB
    events = [
        TraceEvent("segment_alloc", new, 20 * MiB, 10),
        TraceEvent("alloc", new, 1 * MiB, 11, ()),  # the cuBLASLt workspace, inside a matmul
        TraceEvent("alloc", new + MiB, 2 * MiB, 12, ()),  # autograd's thread: no frame
        TraceEvent("alloc", new + 3 * MiB, 2 * MiB, 13, ({"filename": CELL[0], "line": 4},), 7),
        TraceEvent(
            "alloc",
            new + 5 * MiB,
            4 * MiB,
            14,
            (
                {"filename": "/v/site-packages/torch/nn/functional.py", "line": 9},
                {"filename": "/v/site-packages/bitsandbytes/functional.py", "line": 3},
                {"filename": CELL[0], "line": 2},
            ),
        ),
        TraceEvent("alloc", new + 9 * MiB, 3 * MiB, 15, ({"filename": CELL[0], "line": 5},)),
    ]
    result = replay(start, events)
    assert result.exact
    library = lm.LibraryMemory((CUBLAS, CUBLASLT), ((POOL, 20 * MiB),))
    residue = lm.Residue()
    out = categorize(
        result.live_at_peak,
        events,
        [],
        live_blocks(start),
        {},
        library=library,
        residue=residue,
        cell=CELL,
    )
    assert out["library_workspace"] == 33 * MiB
    assert out["cuda_graph_pool"] == 6 * MiB
    assert residue.library == {
        "cuBLAS workspace": 32 * MiB,
        "cuBLASLt workspace": MiB,
        "CUDA graph pool": 6 * MiB,
    }
    assert residue.unattributed == {
        lm.OLDER: 8 * MiB,
        lm.NO_FRAME: 2 * MiB,
        lm.OTHER_STREAM: 2 * MiB,
        lm.inside("bitsandbytes"): 4 * MiB,
        lm.at("cell line 5"): 3 * MiB,
    }
    assert out["unattributed"] == sum(residue.unattributed.values())
    assert sum(out.values()) == result.peak_allocated


def test_without_library_knowledge_the_same_blocks_are_unattributed() -> None:
    start = _held()
    result = replay(start, [])
    out = categorize(result.live_at_peak, [], [], live_blocks(start), {})
    assert out["unattributed"] == 46 * MiB and out["library_workspace"] == 0


def test_a_tag_or_a_name_wins_over_a_workspace_size() -> None:
    from jupyter_gpumem.records import NamedStorage, Tag

    start = _held()
    result = replay(start, [])
    named = {BASE + 32 * MiB: NamedStorage(BASE + 32 * MiB, 8 * MiB, "x", None, (2,), "f", "c")}
    out = categorize(
        result.live_at_peak,
        [],
        [Tag(BASE, "activations", 1, 32 * MiB)],
        live_blocks(start),
        named,
        library=lm.LibraryMemory((CUBLAS,)),
    )
    assert out["activations"] == 32 * MiB and out["other"] == 8 * MiB
    assert out["library_workspace"] == 0


def _found(breakdown: dict[str, int], residue: lm.Residue) -> Attribution:
    return Attribution(breakdown, None, None, None, (), None, residue)  # type: ignore[arg-type]


def test_notes_say_what_the_buffers_are_and_why_over_two_percent_is_unattributed() -> None:
    residue = lm.Residue({"cuBLAS workspace": 64 * MiB, "cuBLASLt workspace": MiB})
    residue.add_unattributed(lm.NO_FRAME, 3 * MiB)
    notes = residue_notes(_found({"unattributed": 3 * MiB}, residue), 100 * MiB)
    assert notes == [
        "library buffers at the peak: cuBLAS workspace 64.0 MiB, cuBLASLt workspace 1.00 MiB",
        f"3.00 MiB unattributed (3.0% of the peak): 3.00 MiB {lm.NO_FRAME}",
    ]
    quiet = residue_notes(_found({"unattributed": 2 * MiB}, lm.Residue()), 100 * MiB)
    assert quiet == []  # 2% is within what the report leaves unsaid


def _torch(major: int, **getters: int) -> types.SimpleNamespace:
    c = types.SimpleNamespace(**{f"_cuda_get{k}": (lambda v=v: v) for k, v in getters.items()})
    return types.SimpleNamespace(
        _C=c, cuda=types.SimpleNamespace(get_device_capability=lambda d: (major, 0))
    )


def test_workspace_sizes_follow_torchs_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    assert workspaces.workspaces(_torch(9), 0) == (CUBLAS, CUBLASLT)
    older = workspaces.workspaces(_torch(8), 0)
    assert older[0] == Workspace("cuBLAS workspace", 8 * MiB + 128 * 1024)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8")
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "4096")
    sizes = workspaces.workspaces(_torch(9), 0)
    assert sizes == (
        Workspace("cuBLAS workspace", 8 * MiB + 128 * 1024),
        Workspace("cuBLASLt workspace", 4 * MiB),
    )
    # a torch with getters: theirs; one size shared by both is the cuBLAS workspace
    both = _torch(9, CublasWorkspaceSize=32 * MiB, CublasLtWorkspaceSize=32 * MiB)
    assert workspaces.workspaces(both, 0) == (CUBLAS,)


def test_private_pools_are_read_from_the_layout_and_the_snapshot() -> None:
    raw = [
        {"device": 0, "address": 10, "total_size": 5, "segment_pool_id": (0, 0), "blocks": []},
        {"device": 0, "address": 40, "total_size": 8, "segment_pool_id": (1, 2), "blocks": []},
        {"device": 1, "address": 90, "total_size": 8, "segment_pool_id": (1, 2), "blocks": []},
    ]
    segments = snapshot.read_segments(raw, 0)
    assert [s.private_pool for s in segments] == [False, True]
    start = (SegmentState(20, 4, True, (), True),)
    assert snapshot.private_pools(raw, 0, start) == ((20, 4), (40, 8))
    pools = lm.LibraryMemory(private_pools=((20, 4), (40, 8)))
    assert [pools.in_pool(a) for a in (19, 20, 23, 24, 47, 48)] == [
        False, True, True, False, True, False,
    ]  # fmt: skip


def test_a_cells_graph_pools_are_named_in_its_notes() -> None:
    from jupyter_gpumem.records import CellRecording, DeviceRecording, TraceWindow
    from jupyter_gpumem.report.build import build_report, graph_pool_note

    start = _held()
    window = TraceWindow(start, (), 46 * MiB, 60 * MiB, 46 * MiB, 60 * MiB, 0, None,
                         private_pools=((POOL, 20 * MiB),))  # fmt: skip
    device = DeviceRecording(0, "GPU", 80 << 30, 46 * MiB, 60 * MiB, 46 * MiB, 60 * MiB,
                             46 * MiB, 60 * MiB, (window,), workspaces=(CUBLAS,))  # fmt: skip
    rec = CellRecording(
        started_at=0.0, wall_s=0.1, devices={0: device}, cuda_available=True, error=None
    )
    report = build_report(rec, all_devices=True)
    assert "cuda:0: " + graph_pool_note(20 * MiB) in report.notes


def test_segments_no_event_touched_are_counted_in_bulk_as_block_by_block() -> None:
    """The breakdown of untouched segments, counted from their totals and the claimed
    storages only, is the per-block rule's to the byte: categories, workspaces by size,
    pools, and why the rest is unattributed."""
    from jupyter_gpumem.records import NamedStorage, Tag

    small = BASE + 64 * MiB
    start = (
        *_held(),
        SegmentState(
            small,
            2 * MiB,
            True,
            (
                BlockState(small, MiB, ALLOCATED, MiB),  # a workspace's size, unclaimed
                BlockState(small + MiB, 512 * 1024, ALLOCATED, 1000),
                BlockState(small + MiB + 512 * 1024, 512 * 1024, ALLOCATED, None),
            ),
        ),
    )
    result = replay(start, [])
    assert result.touched_at_peak == () and len(result.held) == len(start)
    library = lm.LibraryMemory((CUBLAS, CUBLASLT), ((POOL, 20 * MiB),))
    cases = [
        ([], {}),
        (
            [Tag(BASE, "activations", 1, 32 * MiB), Tag(POOL, "parameters", 1, 6 * MiB)],
            {small + MiB: NamedStorage(small + MiB, 1000, "x", "gradients", (250,), "f", "c")},
        ),
        ([Tag(small, "optimizer_state", 1, MiB), Tag(small + 5, "inputs", 1, 8)], {}),
    ]
    for tags, named in cases:
        bulk_residue, block_residue = lm.Residue(), lm.Residue()
        bulk = categorize(
            (), [], tags, [], named, held=result.held, library=library, residue=bulk_residue
        )
        per_block = categorize(
            result.live_at_peak, [], tags, live_blocks(start), named,
            library=library, residue=block_residue,
        )  # fmt: skip
        assert bulk == per_block
        assert bulk_residue == block_residue
        assert sum(bulk.values()) == result.peak_allocated
