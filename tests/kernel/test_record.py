"""``jupyter_gpumem.record()``: its file checked before the block runs, written whole or not at all."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.session import record  # noqa: E402


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", r"record\(''\): give a file name, such as 'run.json'"),
        ("/no/such/folder/run.json", "its folder does not exist"),
        (".", "give a file name"),
    ],
)
def test_a_path_that_cannot_be_written_is_refused_before_the_block_runs(
    path: str, message: str
) -> None:
    ran = []
    with pytest.raises(ValueError, match=message), record(path):
        ran.append(1)
    assert ran == []


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="that is a folder"), record(tmp_path / "."):
        pass
    (tmp_path / "run.json").mkdir()
    with pytest.raises(ValueError, match="that is a folder"), record(tmp_path / "run.json"):
        pass


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_a_folder_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="cannot be written"), record(tmp_path / "run.json"):
            pass
    finally:
        tmp_path.chmod(0o700)


def test_a_rank_that_is_not_a_number_is_refused_before_the_block_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "abc")
    ran = []
    with pytest.raises(ValueError, match="the RANK environment variable is 'abc'"):
        with record(tmp_path / "run.json"):
            ran.append(1)
    assert ran == []


def test_a_full_disk_keeps_the_report_and_leaves_no_debris(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: Path, data: str, *args: object, **kwargs: object) -> int:
        with open(self, "w") as f:
            f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.warns(UserWarning, match="could not write the report.*No space left"):
        with record(tmp_path / "run.json") as m:
            x = torch.ones(1000)
    assert list(tmp_path.iterdir()) == []  # neither the file nor a partial one
    assert m.report is not None and m.report.peak_allocated_bytes >= x.nbytes
