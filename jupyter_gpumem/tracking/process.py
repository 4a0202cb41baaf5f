"""What the driver charges this kernel process on each device (NVML), for the report.

Known limitations: in a container NVML reports host pids, so this process may not
be found; the report then shows the figure as unknown rather than zero.
"""

from __future__ import annotations

import logging
import os

_BACKEND = None


def process_bytes(pid: int | None = None) -> dict[int, int | None]:
    """Device index (as torch numbers it) -> bytes NVML reports for ``pid``; {} if unavailable."""
    global _BACKEND
    from jupyter_gpumem.nvml.library import NvmlBackend

    if _BACKEND is None:
        _BACKEND = NvmlBackend(log=logging.getLogger("jupyter_gpumem.kernel"))
    sample = _BACKEND.read()
    if not sample.available:
        return {}
    pid = os.getpid() if pid is None else pid
    out: dict[int, int | None] = {}
    for device in sample.devices:
        mine = [p.memory_bytes for p in device.processes if p.pid == pid]
        out[device.index] = (
            sum(m for m in mine if m is not None) if mine and None not in mine else None
        )
    return out
