"""One case per family of the model zoo on the GPU: estimated from the meta device, then measured.

The cases of ``bench/zoo.py`` at their tiny size (seconds each), the first of each family and
every ``generate`` cache: the estimate is within 2% of the measured allocated peak and 5% of
the reserved one, or it is refused with its reason (a sliding window's cache that generate
compiles). A cache that generate compiles runs as ``bench/model_zoo.py`` runs it, at its bench
size in a process of its own with a cold Inductor cache: its CUDA graph pool holds buffers of the
L2's size and a cuBLAS workspace, which dwarf a tiny model, and a process that compiled before
(an earlier test's) makes fewer of them. ``bench/model_zoo.py`` runs every case at its bench size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import model_zoo  # noqa: E402 (bench/ on the path first)
import zoo  # noqa: E402

from jupyter_gpumem.tuner.estimation import graph_pool  # noqa: E402

SIZE = "tiny"


def _one_per_family() -> list[Any]:
    return [
        pytest.param(c, id=c.name, marks=pytest.mark.skipif(bool(why), reason=why or ""))
        for c in zoo.first_of_each_family(generate=True)
        for why in [zoo.available(c)]
    ]


def _compiled(case: zoo.Case) -> bool:
    """Whether generate compiles the case's decode calls on CUDA (a static cache)."""
    kwargs = case.generate
    return kwargs.get("cache_implementation") == "static" and not kwargs.get("disable_compile")


@pytest.mark.parametrize("case", _one_per_family())
def test_the_zoo_case_is_estimated_as_measured(case: zoo.Case, tmp_path: Path) -> None:
    if _compiled(case):
        _compiled_as_the_zoo_runs_it(case, tmp_path)
        return
    import transformers

    transformers.logging.set_verbosity_error()
    found, meta = model_zoo.estimate(case, SIZE, "cuda")
    assert all(p.is_meta for p in meta.model.parameters())
    del meta
    real = case.build("cuda", SIZE)
    allocated, reserved = model_zoo.measured(case, real, SIZE)
    assert found.peak_bytes is not None, found.reason
    assert found.peak_reserved_bytes is not None
    assert found.peak_bytes == pytest.approx(allocated, rel=0.02), found.breakdown
    assert found.peak_reserved_bytes == pytest.approx(reserved, rel=0.05)


def _compiled_as_the_zoo_runs_it(case: zoo.Case, tmp_path: Path) -> None:
    out = tmp_path / "row.json"
    bench = Path(model_zoo.__file__)
    cmd = [sys.executable, str(bench), str(out), "--case", case.name, "--size", "bench"]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([*cmd, "--no-fits"], text=True, capture_output=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(out.read_text())
    if row["estimated_allocated"] is None:  # a sliding window's count, guarded on per call
        assert row["reason"] == graph_pool.RECOMPILES.format("StaticSlidingWindowLayer")
        return
    assert graph_pool.NOTE in row["notes"]
    assert row["estimated_allocated"] == pytest.approx(row["measured_allocated"], rel=0.02), row
    assert row["estimated_reserved"] == pytest.approx(row["measured_reserved"], rel=0.05), row
