"""Storages resized from Python, as FSDP2 frees and refills its unsharded parameters.

``UntypedStorage.resize_`` runs no ATen op, so only the listener in
:mod:`jupyter_gpumem.tracking.storage_resizes` lets the CPU source and the fake run see it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.analysis.replay import replay_exact  # noqa: E402
from jupyter_gpumem.tracking import storage_resizes  # noqa: E402
from jupyter_gpumem.tracking.dispatch import DispatchRecorder  # noqa: E402

FULL = 4096 * 4


def _actions(events) -> list[tuple[str, int]]:
    return [(e.action, e.size) for e in events if e.action != "free_requested"]


def test_a_followed_storage_resized_to_nothing_and_back_is_a_free_then_an_alloc() -> None:
    unsharded = torch.empty(4096)  # made in the window, like FSDP2's unsharded parameter
    recorder = DispatchRecorder()
    recorder.start([unsharded])
    unsharded.untyped_storage().resize_(0)  # after the block's forward
    unsharded.untyped_storage().resize_(FULL)  # before its backward
    events = recorder.stop()
    assert _actions(events) == [("free_completed", FULL), ("alloc", FULL)]
    replay = replay_exact(events, allocated_start=FULL)
    assert replay.allocated_end == FULL and replay.peak_allocated == FULL


def test_a_storage_grown_from_nothing_is_new_memory_and_its_release_is_seen() -> None:
    recorder = DispatchRecorder()
    recorder.start()
    t = torch.empty(0)
    t.untyped_storage().resize_(FULL)
    t.untyped_storage().resize_(0)
    events = recorder.stop()
    assert _actions(events) == [("alloc", FULL), ("free_completed", FULL)]


def test_an_unknown_storage_shrunk_is_not_counted_and_the_method_comes_back() -> None:
    original = torch.UntypedStorage.resize_
    old = torch.empty(4096)  # older than the window and not followed: not ours to count
    recorder = DispatchRecorder()
    recorder.start()
    assert torch.UntypedStorage.resize_ is not original
    old.untyped_storage().resize_(0)
    assert _actions(recorder.stop()) == []
    assert torch.UntypedStorage.resize_ is original


def test_listeners_nest_and_each_sees_the_size_before() -> None:
    seen: list[tuple[str, int, int]] = []

    def first(st, before):
        seen.append(("first", before, st.nbytes()))

    def second(st, before):
        seen.append(("second", before, st.nbytes()))

    original = torch.UntypedStorage.resize_
    storage_resizes.listen(torch, first)
    storage_resizes.listen(torch, second)
    try:
        torch.empty(8).untyped_storage().resize_(64)
        storage_resizes.unlisten(torch, first)
        assert torch.UntypedStorage.resize_ is not original
        torch.empty(4).untyped_storage().resize_(0)
    finally:
        storage_resizes.unlisten(torch, second)
        storage_resizes.unlisten(torch, first)
    assert torch.UntypedStorage.resize_ is original
    assert seen == [("first", 32, 64), ("second", 32, 64), ("second", 16, 0)]
