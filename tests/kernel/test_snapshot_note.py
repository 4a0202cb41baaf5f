"""`%%gpumem --snapshot PATH` without CUDA: no file, and the report says why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem.tracking.recorder import Recorder, RecordOptions


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device writes the snapshot")
def test_without_cuda_the_report_says_no_snapshot_was_written(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    path = tmp_path / "cell.pickle"
    assert shell.run_cell("import torch").success
    cell = f"%%gpumem --snapshot {path} -o r --quiet\nx = torch.ones(1000)\n"
    assert shell.run_cell(cell).success
    r = shell.user_ns["r"]
    assert f"no snapshot was written to {path}: no CUDA device is present" in r.notes
    assert f"no snapshot was written to {path}" in str(r)
    assert not path.exists()


def test_without_torch_the_recording_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "torch")
    recorder = Recorder(RecordOptions(snapshot_path=str(tmp_path / "s.pickle")))
    recorder.start()
    recording = recorder.stop(None)
    assert recording.notes == (
        f"no snapshot was written to {tmp_path / 's.pickle'}: torch is not imported",
    )
    assert list(tmp_path.iterdir()) == []
