"""Which GPU processes belong to a notebook's kernel.

First by pid: the kernel's process (from its provisioner) and its descendants, as the server
sees them. When that finds nothing (no local process, or a kernel in another pid namespace),
the kernel is asked for its own pid with a ``usage_request`` on the control channel; the answer
is cached per kernel process, so polling clients do not repeat the question.

Known limitations:
    - When the server and kernel share a container, NVML reports host pids that neither can
      see; no process is matched then (``matched_by`` is null).
    - ``usage_request`` needs ipykernel >= 6.11; other kernels do not answer it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from queue import Empty
from typing import Any

from jupyter_gpumem.nvml.readings import Sample

__all__ = [
    "KernelProcesses",
    "ReportedPids",
    "descendants",
    "kernel_trees",
    "match_processes",
    "request_kernel_pid",
    "running_kernel_pids",
    "server_side_pid",
]

MATCHED_BY_PID = "pid"
MATCHED_BY_KERNEL = "kernel-reported"


@dataclass(frozen=True)
class KernelProcess:
    device_index: int
    pid: int
    command: str | None
    memory_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "device_index": self.device_index,
            "pid": self.pid,
            "command": self.command,
            "memory_bytes": self.memory_bytes,
        }


@dataclass(frozen=True)
class KernelProcesses:
    """The answer of ``kernels/<id>/processes``: ``pids`` are those that were looked for."""

    kernel_id: str
    pids: tuple[int, ...]
    matched_by: str | None
    processes: tuple[KernelProcess, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel_id": self.kernel_id,
            "pids": list(self.pids),
            "matched_by": self.matched_by,
            "processes": [p.to_json() for p in self.processes],
        }


def server_side_pid(kernel: Any) -> int | None:
    """The pid of a kernel manager's local process, or None (remote or not started)."""
    provisioner = getattr(kernel, "provisioner", None)
    pid = getattr(getattr(provisioner, "process", None), "pid", None)
    if pid is None:
        pid = getattr(provisioner, "pid", None)
    return pid if isinstance(pid, int) else None


def running_kernel_pids(kernel_manager: Any) -> list[int]:
    """Pids of all running local kernels; safe to call from another thread."""
    pids = []
    for kernel_id in list(kernel_manager.list_kernel_ids()):
        try:
            pid = server_side_pid(kernel_manager.get_kernel(kernel_id))
        except KeyError:
            continue  # shut down meanwhile
        if pid is not None:
            pids.append(pid)
    return pids


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(child) for child in f.read().split())
        except OSError:
            continue
    return out


def descendants(pid: int) -> set[int]:
    """``pid`` and all its descendants (from ``/proc``; just ``pid`` where that is missing)."""
    found = {pid}
    todo = [pid]
    while todo:
        for child in _children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kernel_trees(kernel_pids: Iterable[int]) -> set[int]:
    """The kernels' pids and all their descendants."""
    return {pid for kernel_pid in kernel_pids for pid in descendants(kernel_pid)}


def match_processes(sample: Sample | None, pids: Iterable[int]) -> tuple[KernelProcess, ...]:
    """The sample's processes whose pid is one of ``pids``, in device order."""
    wanted = set(pids)
    if sample is None:
        return ()
    return tuple(
        KernelProcess(device.index, p.pid, p.command, p.memory_bytes)
        for device in sample.devices
        for p in device.processes
        if p.pid in wanted
    )


async def request_kernel_pid(kernel: Any, timeout_s: float = 1.0) -> int | None:
    """Ask a kernel for its own pid (``usage_request``); None if it does not answer in time."""
    from jupyter_client.asynchronous import AsyncKernelClient

    client = AsyncKernelClient(**kernel.get_connection_info(session=True))
    client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    try:
        request = client.session.msg("usage_request", {})
        client.control_channel.send(request)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (remaining := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                reply = await client.control_channel.get_msg(timeout=remaining)
            except Empty:
                return None
            if reply.get("parent_header", {}).get("msg_id") == request["header"]["msg_id"]:
                pid = reply.get("content", {}).get("pid")
                return pid if isinstance(pid, int) else None
        return None
    finally:
        client.stop_channels()


class ReportedPids:
    """Per-kernel cache of what kernels report about their pid (also negative answers)."""

    def __init__(self, retry_s: float = 30.0, timeout_s: float = 1.0) -> None:
        self._retry_s = retry_s
        self._timeout_s = timeout_s
        self._cache: dict[str, tuple[int | None, int | None, float]] = {}

    async def get(self, kernel_id: str, kernel: Any) -> int | None:
        """The kernel's own pid, asking it at most once per process (and per ``retry_s``)."""
        local_pid = server_side_pid(kernel)
        cached = self._cache.get(kernel_id)
        if cached is not None and cached[0] == local_pid:
            reported, asked = cached[1], cached[2]
            if reported is not None or time.monotonic() - asked < self._retry_s:
                return reported
        reported = await request_kernel_pid(kernel, self._timeout_s)
        self._cache[kernel_id] = (local_pid, reported, time.monotonic())
        return reported

    def keep_only(self, kernel_ids: Iterable[str]) -> None:
        """Drop what is cached about kernels that are gone."""
        alive = set(kernel_ids)
        for kernel_id in [k for k in self._cache if k not in alive]:
            del self._cache[kernel_id]


async def kernel_processes(
    kernel_id: str, kernel: Any, sample: Sample | None, reported: ReportedPids
) -> KernelProcesses:
    """Match a kernel to the sample's processes: by pid first, then by what it reports."""
    pid = server_side_pid(kernel)
    pids = descendants(pid) if pid is not None else set()
    found = match_processes(sample, pids)
    if found:
        return KernelProcesses(kernel_id, tuple(sorted(pids)), MATCHED_BY_PID, found)
    if sample is None or not any(d.processes for d in sample.devices):
        return KernelProcesses(kernel_id, tuple(sorted(pids)), None, ())
    own = await reported.get(kernel_id, kernel)
    if own is not None and own not in pids:
        pids.add(own)
        found = match_processes(sample, [own])
        if found:
            return KernelProcesses(kernel_id, tuple(sorted(pids)), MATCHED_BY_KERNEL, found)
    return KernelProcesses(kernel_id, tuple(sorted(pids)), None, ())
