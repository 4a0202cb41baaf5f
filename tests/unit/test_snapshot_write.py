"""`--snapshot`'s file is written whole or not at all, and a failed write never stops the cell's
counters from being closed: it becomes a note."""

from __future__ import annotations

import errno
import os
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jupyter_gpumem.tracking.cuda import CudaSession, write_pickle

SNAPSHOT = {"segments": [], "device_traces": [[{"action": "alloc", "size": 512}]]}


class Unpicklable:
    def __reduce__(self) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_written_file_reads_back_and_nothing_else_is_left(tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    write_pickle(path, SNAPSHOT)
    assert pickle.loads(path.read_bytes()) == SNAPSHOT
    assert os.listdir(tmp_path) == ["s.pickle"]


def test_a_failed_write_leaves_the_old_file_and_no_debris(tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(b"the snapshot of an earlier run")
    with pytest.raises(OSError, match="No space left"):
        write_pickle(path, {"segments": [Unpicklable()]})  # fails halfway through the dump
    assert path.read_bytes() == b"the snapshot of an earlier run"
    assert os.listdir(tmp_path) == ["s.pickle"]


def test_a_full_disk_at_the_sync_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_pickle(tmp_path / "s.pickle", SNAPSHOT)
    assert os.listdir(tmp_path) == []


def test_a_missing_or_read_only_folder_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_pickle(tmp_path / "gone" / "s.pickle", SNAPSHOT)
    assert os.listdir(tmp_path) == []
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere
            pytest.skip("this user may write into read-only folders")
        with pytest.raises(PermissionError):
            write_pickle(locked / "s.pickle", SNAPSHOT)
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o700)


def _one_gpu() -> Any:
    """Just what `CudaSession.finish` reads of torch, for one initialised device."""
    return SimpleNamespace(
        cuda=SimpleNamespace(
            is_initialized=lambda: True,
            device_count=lambda: 1,
            memory=SimpleNamespace(memory_stats_as_nested_dict=lambda d: {}),
            get_device_properties=lambda d: SimpleNamespace(name="H100", total_memory=80 * 2**30),
        ),
        _C=SimpleNamespace(
            _cuda_memoryStats=lambda d: {},
            _cuda_getCublasWorkspaceSize=lambda: 0,
            _cuda_getCublasLtWorkspaceSize=lambda: 0,
        ),
    )


def test_a_failed_write_is_a_note_and_the_devices_are_still_closed(tmp_path: Path) -> None:
    path = tmp_path / "gone" / "s.pickle"
    session = CudaSession(_one_gpu(), trace=True, devices=None, snapshot_path=str(path))
    session._snapshot = SNAPSHOT
    recordings = session.finish()
    assert list(recordings) == [0] and recordings[0].name == "H100"
    assert session.notes == [f"no snapshot was written to {path}: No such file or directory"]
    assert os.listdir(tmp_path) == []


def test_no_snapshot_read_is_a_note(tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    session = CudaSession(_one_gpu(), trace=True, devices=None, snapshot_path=str(path))
    assert list(session.finish()) == [0]
    assert session.notes == [f"no snapshot was written to {path}: the allocator trace was not read"]
    idle = _one_gpu()
    idle.cuda.is_initialized = lambda: False
    session = CudaSession(idle, trace=True, devices=None, snapshot_path=str(path))
    assert session.finish() == {}
    assert session.notes == [f"no snapshot was written to {path}: the cell did not use CUDA"]
    assert not path.exists()
