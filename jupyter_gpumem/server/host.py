"""Host memory of a notebook's kernel: the resident set (RSS) of its process tree.

This is what the live view can still show without a GPU, and it answers "is my kernel
growing?" with one. Read from ``/proc`` (no extra dependency): ``/proc/<pid>/statm`` for each
process of the tree (the kernel and its descendants, as `kernels.descendants` finds them) and
``/proc/meminfo`` for the machine. An unknown value is ``None`` with the reason, never 0.

Known limitations:
    - Linux only; elsewhere ``rss_bytes`` is null with the reason "no /proc on this platform".
    - RSS counts pages shared between processes (libraries, shared memory) once per process,
      so a tree's sum can exceed what it really holds.
    - ``host_total_bytes`` is the machine's memory (``MemTotal``); a container's cgroup limit
      may be lower.
    - A remote kernel (no local process) has no host memory here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_gpumem.server.kernels import descendants, server_side_pid

__all__ = ["KernelHost", "kernel_host", "meminfo", "rss_bytes"]

PROC = Path("/proc")
NO_PROC = "no /proc on this platform"
NO_LOCAL_PROCESS = "the kernel has no local process (remote, or not started yet)"
EXITED = "the kernel process has exited"


@dataclass(frozen=True)
class KernelHost:
    """The answer of ``kernels/<id>/host``. ``pids`` are the processes whose RSS was summed."""

    kernel_id: str
    pid: int | None
    pids: tuple[int, ...]
    rss_bytes: int | None
    host_total_bytes: int | None
    host_available_bytes: int | None
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel_id": self.kernel_id,
            "pid": self.pid,
            "pids": list(self.pids),
            "rss_bytes": self.rss_bytes,
            "host_total_bytes": self.host_total_bytes,
            "host_available_bytes": self.host_available_bytes,
            "reason": self.reason,
        }


def _page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 4096


def rss_bytes(pid: int, proc: Path = PROC) -> int | None:
    """One process's resident set in bytes, or None when it is gone or unreadable."""
    try:
        fields = (proc / str(pid) / "statm").read_text().split()
        return int(fields[1]) * _page_size()
    except (OSError, IndexError, ValueError):
        return None


def meminfo(proc: Path = PROC) -> dict[str, int]:
    """``/proc/meminfo`` in bytes (the fields given in kB); empty where it cannot be read."""
    out: dict[str, int] = {}
    try:
        lines = (proc / "meminfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def kernel_host(kernel_id: str, kernel: Any, proc: Path = PROC) -> KernelHost:
    """The RSS of a kernel's process tree, with the machine's total and available memory.

    Reads a handful of small ``/proc`` files: cheap enough for a request handler.
    """
    info = meminfo(proc)
    total, available = info.get("MemTotal"), info.get("MemAvailable")
    pid = server_side_pid(kernel)
    if not (proc / "self").exists():
        return KernelHost(kernel_id, pid, (), None, total, available, NO_PROC)
    if pid is None:
        return KernelHost(kernel_id, None, (), None, total, available, NO_LOCAL_PROCESS)
    counted: list[int] = []
    rss = 0
    for each in sorted(descendants(pid)):
        value = rss_bytes(each, proc)
        if value is not None:
            counted.append(each)
            rss += value
    if pid not in counted:
        return KernelHost(kernel_id, pid, (), None, total, available, EXITED)
    return KernelHost(kernel_id, pid, tuple(counted), rss, total, available, None)
