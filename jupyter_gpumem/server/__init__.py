"""Jupyter Server side of the live GPU view: NVML sampler -> ring buffer -> REST handlers.

Modules, in data-flow order: `nvml` (the only ``pynvml`` importer, lazily), `fake` (its
stand-in for tests), `sampler` (one thread per server), `kernels` (kernel -> GPU processes),
`handlers` (routes), `extension` (configuration and wiring). Importing this package imports
neither torch nor pynvml.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpumem.server.extension import GpuMem

__all__ = ["GpuMem"]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Called by Jupyter Server: start the sampler and add the routes."""
    from jupyter_gpumem.server.extension import load_extension

    load_extension(serverapp)
