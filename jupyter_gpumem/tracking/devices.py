"""Whether this process can use CUDA, asked without initialising it or poisoning ``fork``.

``torch.cuda.is_available()`` and ``device_count()`` call ``cudaGetDeviceCount``, which
initialises the driver and marks the process so that CUDA fails in every child it forks
afterwards ("Cannot re-initialize CUDA in forked subprocess"). Notebook launchers such as
``accelerate.notebook_launcher`` and ``torch.multiprocessing.start_processes(...,
start_method="fork")`` need CUDA untouched in the kernel, so until the user's own code has
initialised CUDA, the answer comes from NVML, which torch itself uses for a fork-safe check.
"""

from __future__ import annotations

import os
from typing import Any

_NVML_COUNT: dict[int, int] = {}  # pid -> device count from NVML, -1 when NVML cannot tell


def cuda_present(torch: Any) -> bool:
    """True when CUDA devices can be used; never initialises CUDA, never poisons fork.

    Once CUDA is initialised, torch's own count is safe to ask. Before that NVML counts the
    devices (once per process); a CUDA build whose NVML cannot answer is taken to have one.
    """
    cuda = torch.cuda
    if not _cuda_build(torch):
        return False
    if cuda.is_initialized():
        return bool(cuda.device_count() > 0)
    pid = os.getpid()
    if pid not in _NVML_COUNT:
        count = getattr(cuda, "_device_count_nvml", None)
        _NVML_COUNT[pid] = int(count()) if count is not None else -1
    return _NVML_COUNT[pid] != 0


def cuda_count(torch: Any) -> int:
    """How many CUDA devices this process sees, asked as :func:`cuda_present` asks."""
    if not cuda_present(torch):
        return 0
    if torch.cuda.is_initialized():
        return int(torch.cuda.device_count())
    return max(1, _NVML_COUNT[os.getpid()])


def _cuda_build(torch: Any) -> bool:
    """True for a torch built with CUDA (a module-level seam, so tests can pretend)."""
    return bool(torch.cuda._is_compiled())
