"""A snapshot's layout read for the breakdown: totals from its own fields, blocks read only
where the breakdown looks, and a segment unchanged since the last read not read again."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from jupyter_gpumem.analysis.breakdown import categorize
from jupyter_gpumem.analysis.library_memory import LibraryMemory
from jupyter_gpumem.analysis.replay import live_blocks, replay
from jupyter_gpumem.records import NamedStorage, Workspace
from jupyter_gpumem.tracking import snapshot
from tests.support.cycles import collected

MiB = 2**20
BASE = 0x7F0000000000


def _segment(address: int, requests: list[int], pending: int = 0) -> dict[str, Any]:
    """A snapshot's segment entry as torch writes it: allocated blocks of ``requests`` back
    to back, ``pending`` blocks freed but awaiting their streams, then the free rest."""
    blocks, at = [], address
    for i, request in enumerate(requests):
        size = -(-request // 512) * 512
        state = "active_pending_free" if i < pending else "active_allocated"
        blocks.append({"address": at, "size": size, "requested_size": request, "state": state})
        at += size
    total = 2 * MiB if at - address <= 2 * MiB else at - address
    if at < address + total:
        blocks.append(
            {"address": at, "size": address + total - at, "requested_size": 0, "state": "inactive"}
        )
    allocated = [b for b in blocks if b["state"] == "active_allocated"]
    active = [b for b in blocks if b["state"] != "inactive"]
    return {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": sum(b["size"] for b in allocated),
        "active_size": sum(b["size"] for b in active),
        "requested_size": sum(b["requested_size"] for b in active),
        "segment_type": "small" if total == 2 * MiB else "large",
        "segment_pool_id": (0, 0),
        "blocks": blocks,
    }


def _raw() -> list[dict[str, Any]]:
    small = [_segment(BASE + i * 2 * MiB, [1000 + 8 * j for j in range(40)]) for i in range(6)]
    workspace = _segment(BASE + 6 * 2 * MiB, [MiB, 3000, 3000])
    large = _segment(BASE + 7 * 2 * MiB, [4 * MiB, 4 * MiB + 100, 8 * MiB])
    return [*small, workspace, large]


LIBRARY = LibraryMemory(workspaces=(Workspace("cuBLASLt workspace", MiB),))


def _named(raw: list[dict[str, Any]]) -> dict[int, NamedStorage]:
    large = raw[-1]["blocks"]
    return {
        b["address"]: NamedStorage(
            b["address"], b["requested_size"], f"w{i}", "parameters", (), "f32", "cuda:0"
        )
        for i, b in enumerate(large[:2])
    } | {
        raw[0]["blocks"][0]["address"]: NamedStorage(
            raw[0]["blocks"][0]["address"], 1000, "feats[0]", None, (250,), "f32", "cuda:0"
        )
    }


def test_held_segments_count_from_the_snapshots_totals_as_block_by_block() -> None:
    raw = _raw()
    held = snapshot.read_segments(raw, 0)
    named = _named(raw)
    split = categorize((), (), (), (), named, held=held, library=LIBRARY)
    # read block by block: the segments holding a named storage or as much as a workspace
    read = [s.blocks.allocated_of.made is not None for s in held]
    assert read == [True, False, False, False, False, False, True, True]
    whole = categorize(live_blocks(held), (), (), (), named, library=LIBRARY)
    assert split == whole
    assert split["parameters"] == 8 * MiB + 100 and split["other"] == 1000
    assert split["library_workspace"] == MiB
    assert sum(split.values()) == sum(seg["allocated_size"] for seg in raw)


def test_a_segment_unchanged_since_the_last_read_is_not_read_again() -> None:
    raw = _raw()
    first = snapshot.read_segments(raw, 0)
    named = _named(raw)
    before = categorize((), (), (), (), named, held=first, library=LIBRARY)

    again = copy.deepcopy(raw)  # the next cell's snapshot: equal entries, new objects
    moved = again[1]
    moved["blocks"][0]["state"] = "inactive"  # a block freed: the segment's totals change
    moved["allocated_size"] -= moved["blocks"][0]["size"]
    moved["active_size"] -= moved["blocks"][0]["size"]
    moved["requested_size"] -= moved["blocks"][0]["requested_size"]
    second = snapshot.read_segments(again, 0)
    after = categorize((), (), (), (), named, held=second, library=LIBRARY)

    reused = [
        s.allocated_summary() is f.allocated_summary() for s, f in zip(second, first, strict=True)
    ]
    assert reused == [True, False, True, True, True, True, True, True]
    assert all(s.blocks.allocated_of.made is None for i, s in enumerate(second) if reused[i])
    assert after["unattributed"] == before["unattributed"] - 1000
    assert sum(after.values()) == sum(seg["allocated_size"] for seg in again)


def test_a_read_forgets_the_segments_it_no_longer_has() -> None:
    raw = _raw()
    first = snapshot.read_segments(raw, 0)
    kept = first[0].allocated_summary()
    snapshot.read_segments(raw[1:], 0)  # the first segment was released
    back = snapshot.read_segments(copy.deepcopy(raw), 0)
    assert back[0].allocated_summary() is not kept
    assert back[1].allocated_summary() is first[1].allocated_summary()


def test_blocks_awaiting_their_streams_are_counted_block_by_block() -> None:
    raw = [_segment(BASE, [1000, 2000, 3000], pending=1)]
    held = snapshot.read_segments(raw, 0)
    summary = held[0].allocated_summary()
    assert raw[0]["requested_size"] == 6000  # the snapshot's total counts the pending block
    assert (summary.size, summary.requested) == (2048 + 3072, 5000)


def test_a_layout_and_its_summaries_go_without_the_cycle_collector() -> None:
    def read_twice() -> None:
        raw = _raw()
        first = snapshot.read_segments(raw, 0)
        categorize((), (), (), (), _named(raw), held=first, library=LIBRARY)
        second = snapshot.read_segments(copy.deepcopy(raw), 0)  # the summaries kept, reused
        categorize((), (), (), (), _named(raw), held=second, library=LIBRARY)
        snapshot.SUMMARIES.clear()

    assert collected(read_twice) == {}


FIXTURE = Path(__file__).parent.parent / "fixtures" / "cuda_snapshot_train_step.json"


def test_torch_snapshots_of_an_h100_replay_to_its_counters_to_the_byte() -> None:
    """torch's own dicts (``bench/record_snapshot_fixture.py``: two Adam steps on an H100),
    read as records: the starting layout, the trace and the ending layout agree with the
    allocator's counters read beside them."""
    data = json.loads(FIXTURE.read_text())
    start = snapshot.read_segments(data["before"]["segments"], 0)
    assert sum(s.total_size for s in start) == data["reserved_before"]
    assert sum(b.size for s in start for b in s.allocated_blocks()) == data["allocated_before"]
    assert {b.state for s in start for b in s.blocks} == {"allocated", "free"}
    events = snapshot.read_events(data["after"]["device_traces"][0])
    assert len(events) == len(data["after"]["device_traces"][0])
    assert events[0].action == "snapshot" and {"alloc", "free_completed"} <= {
        e.action for e in events
    }
    result = replay(
        start,
        events,
        allocated_start=data["allocated_before"],
        reserved_start=data["reserved_before"],
    )
    assert result.exact, result.reason
    assert (result.peak_allocated, result.peak_reserved) == (
        data["max_allocated"],
        data["max_reserved"],
    )
    assert (result.allocated_end, result.reserved_end) == (
        data["allocated_after"],
        data["reserved_after"],
    )
    end = snapshot.read_segments(data["after"]["segments"], 0)
    assert sum(s.total_size for s in end) == data["reserved_after"]
    new = snapshot.new_blocks(data["after"]["segments"], 0, start)
    held_before = sum(b.size for s in start for b in s.allocated_blocks())
    assert sum(b.size for b in new) == data["allocated_after"] - held_before  # nothing freed
    assert snapshot.private_pools(data["after"]["segments"], 0, start) == ()
    assert snapshot.entry_key(data["after"]["device_traces"][0][-1]) == (
        events[-1].action,
        events[-1].address,
        events[-1].size,
        events[-1].time_us,
    )
