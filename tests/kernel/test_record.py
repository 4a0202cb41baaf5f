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


@pytest.mark.parametrize("name", [5, b"run", ["a"]])
def test_a_name_that_is_not_a_string_is_refused_before_the_block_runs_on_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: object
) -> None:
    import jupyter_gpumem

    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        ran = []
        with pytest.raises(TypeError, match=r"record\(name=\.\.\.\) takes a string"):
            with jupyter_gpumem.record(tmp_path / "run.json", name=name):  # type: ignore[arg-type]
                ran.append(1)
        assert ran == []
    assert list(tmp_path.iterdir()) == []


def test_every_rank_of_a_named_record_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jupyter_gpumem

    name = "warm-up \ud800"  # any string, a lone surrogate too
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        with jupyter_gpumem.record(tmp_path / "run.json", name=name):
            torch.ones(10)
    loaded = jupyter_gpumem.load_reports(tmp_path / "run.json")
    assert [(r.rank, r.name) for r in loaded.ranks] == [(0, name), (1, name)]
