"""Smoke test of bench/gpt2_overhead.py: a tiny GPT-2, one round of one step, on CPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpt2_overhead.py"
CUDA_ONLY = {"record_memory_history"}


def _load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpt2_overhead", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_small_run_reports_every_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_gpumem import logbook

    bench = _load(monkeypatch)
    out = tmp_path / "results.json"
    try:
        returned = bench.main(["--small", "--rounds", "1", "--steps", "1", "--out", str(out)])
    finally:
        logbook.clear()
    results = json.loads(out.read_text())
    assert results == json.loads(json.dumps(returned))
    assert set(results["configs"]) == set(bench.CONFIGS)
    for name, entry in results["configs"].items():
        status = entry["status"]
        if name in CUDA_ONLY and status == "skipped: no CUDA":
            continue
        if name == "memtracker" and status.startswith("unavailable:"):
            continue
        assert status == "ok", f"{name}: {status}"
        assert entry["step_s"] > 0, name
        assert len(entry["step_s_rounds"]) == 1, name
    for name, base in bench.BASELINE.items():
        assert results["configs"][name]["baseline"] == base
    assert results["configs"]["gpumem"]["cell_s"] > 0
    assert results["display_s"] is not None and results["display_s"] >= 0
    assert results["analysis_s"] is not None and results["analysis_s"] >= 0
    assert results["steps"] == 1 and results["rounds"] == 1
    assert results["torch"] and results["device"]
