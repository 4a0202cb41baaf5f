"""Every report of this kernel, in the order the cells ran."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jupyter_gpumem.report import Report

if TYPE_CHECKING:
    import pandas as pd

_REPORTS: list[Report] = []

COLUMNS = (
    "id", "name", "execution_count", "started_at", "wall_s", "status", "source", "device",
    "peak_allocated_bytes", "peak_reserved_bytes", "allocated_before_bytes",
    "allocated_after_bytes", "allocated_delta_bytes", "cache_bytes", "nvml_process_bytes",
    "non_torch_bytes", "budget_bytes", "device_name", "peak_phase",
)  # fmt: skip


def record(report: Report) -> None:
    _REPORTS.append(report)


def reports() -> list[Report]:
    """A copy of the reports kept so far, oldest first."""
    return list(_REPORTS)


def clear() -> None:
    _REPORTS.clear()


def to_dataframe() -> pd.DataFrame:
    """One row per cell and device; a cell without CUDA gives one row with empty numbers."""
    import pandas as pd

    rows = []
    for r in _REPORTS:
        base = {
            "id": r.id, "name": r.name, "execution_count": r.execution_count,
            "started_at": r.started_at, "wall_s": r.wall_s, "status": r.status,
            "budget_bytes": r.budget_bytes,
        }  # fmt: skip
        if not r.devices:
            rows.append({**base, "source": r.source})
        for d in r.devices:
            numbers = {k: getattr(d, k) for k in COLUMNS if k not in base and hasattr(d, k)}
            rows.append({**base, **numbers, "device_name": d.name, "peak_phase": d.peak_phase})
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["started_at"] = pd.to_datetime(frame["started_at"], unit="s")
    return frame
