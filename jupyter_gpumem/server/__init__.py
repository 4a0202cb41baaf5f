"""Jupyter Server side of the live GPU view: the sampler's ring buffer -> REST handlers.

Modules, in data-flow order: `kernels` (kernel -> GPU processes), `host` (host memory of a
kernel), `handlers` (routes), `extension` (configuration, wiring, shutdown). NVML itself is
read through :mod:`jupyter_gpumem.nvml`, which the kernel uses too. Importing this package
imports neither torch nor pynvml.
"""

from __future__ import annotations

from jupyter_gpumem.server.extension import GpuMem, GpuMemApp

__all__ = ["GpuMem", "GpuMemApp"]
