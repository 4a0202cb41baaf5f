"""A GPU test module's table of figures, written to ``$GPUMEM_OUT`` when the module ends."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest


def gpu_table(filename: str) -> Iterator[dict[str, Any]]:
    """Yield the table (its device, torch and ``rows``), then write it as ``filename``.

    Use it in a module-scoped fixture: such fixtures run before the autouse CUDA skip, so it
    skips without a CUDA device itself.
    """
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    found: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    found["rows"] = []
    yield found
    out = os.environ.get("GPUMEM_OUT")
    if out:
        with open(os.path.join(out, filename), "w") as f:
            json.dump(found, f, indent=1, default=str)


def estimated_and_measured(trial: Any, table: dict[str, Any], **config: Any) -> tuple[Any, Any]:
    """``trial``'s estimate of ``config`` and its measured run, side by side in a row of
    ``table``; the run must succeed."""
    est = trial.estimate(**config)
    result = trial.run(est.config)
    assert result.status == "ok", result.error
    main = None if result.report is None else result.report.main
    table["rows"].append(
        {
            "configuration": est.label,
            "estimated_bytes": est.peak_bytes,
            "measured_bytes": result.peak_allocated_bytes,
            "measured_reserved_bytes": result.peak_reserved_bytes,
            "error_pct": est.error_pct(result.peak_allocated_bytes),
            "estimated_phase": est.phase,
            "measured_phase": None if main is None else main.peak_phase,
            "measured_breakdown": dict(result.breakdown or {}),
            "estimated_breakdown": dict(est.breakdown or {}),
            "step_s": result.step_s,
            "notes": list(est.notes),
        }
    )
    return est, result
