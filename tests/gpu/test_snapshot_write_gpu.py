"""`%%gpumem --snapshot` on a real GPU: the file whole or not at all, the report closed either way."""

from __future__ import annotations

import errno
import os
import pickle
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

CELL = """
a = torch.empty(25_000_000, device="cuda")
b = a[:1000] * 2
del a
"""


@pytest.fixture
def cuda_shell(shell: InteractiveShell) -> InteractiveShell:
    assert shell.run_cell("import torch\nwarm = torch.ones(1, device='cuda')").success
    return shell


def test_the_snapshot_is_written_with_nothing_beside_it(
    cuda_shell: InteractiveShell, tmp_path: Path
) -> None:
    path = tmp_path / "cell.pickle"
    assert cuda_shell.run_cell(f"%%gpumem -o r --quiet --snapshot {path}\n{CELL}").success
    snapshot = pickle.loads(path.read_bytes())
    assert snapshot["device_traces"][0] and os.listdir(tmp_path) == ["cell.pickle"]
    assert not any("no snapshot" in n for n in cuda_shell.user_ns["r"].notes)


def test_a_full_disk_is_a_note_and_the_counters_are_closed(
    cuda_shell: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    path = tmp_path / "cell.pickle"
    path.write_bytes(b"an earlier snapshot")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", full)
        result = cuda_shell.run_cell(f"%%gpumem -o r --quiet --snapshot {path}\n{CELL}")
    assert result.success, result.error_in_exec
    r = cuda_shell.user_ns["r"]
    assert f"no snapshot was written to {path}: No space left on device" in r.notes
    assert r.devices and r.peak_allocated_bytes >= 100_000_000  # the device was still closed
    assert path.read_bytes() == b"an earlier snapshot" and os.listdir(tmp_path) == ["cell.pickle"]
    # the next cell measures as ever: nothing of the failed one was left open
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    assert cuda_shell.run_cell(f"%%gpumem -o r2 --quiet --snapshot {path}\n{CELL}").success
    r2 = cuda_shell.user_ns["r2"]
    assert r2.peak_allocated_bytes == torch.cuda.max_memory_allocated()
    assert pickle.loads(path.read_bytes())["device_traces"][0]
    assert not any("no snapshot" in n for n in r2.notes)
