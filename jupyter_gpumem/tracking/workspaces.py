"""The buffers libraries keep in the caching allocator for themselves: their sizes and addresses.

torch gives cuBLAS a workspace for each handle and stream that runs a matmul (the kernel's
thread, autograd's engine thread, each side stream), and cuBLASLt one more. They are
allocated once, never freed, and belong to no tensor, so nothing else names them. Their
sizes follow torch's own rules: its getters where this torch has them, else the
environment variables it reads and its defaults per GPU generation.

A size names a workspace only where nothing else asks for it: a 512 x 512 fp32 weight asks
for the cuBLASLt workspace's 1 MiB. :func:`remade` tells them by address instead, where
torch can free them safely (:func:`clearer`): cleared, made again, the blocks that appeared.

Importing this module does not import torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from jupyter_gpumem.records import Workspace

KiB, MiB = 1 << 10, 1 << 20
CUBLAS, CUBLASLT = "cuBLAS workspace", "cuBLASLt workspace"
_CONFIG = re.compile(r":(\d+):(\d+)")  # CUBLAS_WORKSPACE_CONFIG: ":KiB:count" pairs


def workspaces(torch: Any, device: int) -> tuple[Workspace, ...]:
    """The library buffers the allocator of ``device`` may hold, largest first."""
    found = {CUBLAS: _cublas_bytes(torch, device), CUBLASLT: _cublaslt_bytes(torch)}
    sizes = sorted(((n, b) for n, b in found.items() if b), key=lambda item: -item[1])
    out: list[Workspace] = []
    for name, size in sizes:
        if all(w.requested != size for w in out):  # one size, one name: the larger library's
            out.append(Workspace(name, size))
    return tuple(out)


def _cublas_bytes(torch: Any, device: int) -> int:
    getter = getattr(torch._C, "_cuda_getCublasWorkspaceSize", None)
    if getter is not None:
        return int(getter())
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        pairs = _CONFIG.findall(config)
        if pairs:
            return sum(int(kib) * KiB * int(count) for kib, count in pairs)
    major, _ = torch.cuda.get_device_capability(device)
    # Hopper and Blackwell: 32 MiB; earlier GPUs: 2 x 4 MiB + 8 x 16 KiB
    return 32 * MiB if major in (9, 10) else 2 * 4096 * KiB + 8 * 16 * KiB


def _cublaslt_bytes(torch: Any) -> int:
    getter = getattr(torch._C, "_cuda_getCublasLtWorkspaceSize", None)
    if getter is not None:
        return int(getter())
    size = os.environ.get("CUBLASLT_WORKSPACE_SIZE", "")
    return int(size) * KiB if size.isdigit() else 1 * MiB


class Remade(NamedTuple):
    """The library workspaces made again after a clear, and the allocator's layout then."""

    workspaces: dict[int, int]  # address -> bytes requested
    snapshot: list[dict[str, Any]]  # torch.cuda.memory_snapshot() once they were made


def clearer(torch: Any) -> Callable[[Any], None] | None:
    """torch's own function that frees the cuBLAS and cuBLASLt workspaces of every thread,
    taking the device; None where this torch has none that is safe beside another thread.

    torch's public ``torch.cuda.clear_cublas_workspaces`` (or its private forerunner) reaches
    autograd's threads too, where each thread keeps its own workspaces. Else
    ``torch._C._cuda_clearCublasWorkspaces``, from torch 2.10 on, where the workspace maps it
    clears (all threads', cuBLAS's and cuBLASLt's) are locked (pytorch#167928); before, they
    were not, and a matmul on another thread at that moment could crash the process, so it is
    not used there.

    Known limitation (torch's own, as its CUDA-graph trees clear the same way): a matmul another
    thread has just begun may still run in the workspace the clear frees, and a tensor allocated
    on that thread's stream at that moment may get the same block.
    """
    for name in ("clear_cublas_workspaces", "_clear_cublas_workspaces"):
        clear = getattr(torch.cuda, name, None)
        if callable(clear):
            return clear  # type: ignore[no-any-return]
    private = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if private is None or _version(torch) < (2, 10):
        return None
    return lambda device: private()


def remade(torch: Any, device: Any, make: Callable[[], None]) -> Remade | None:
    """The library workspaces of ``device`` told by address: torch's cleared (:func:`clearer`),
    ``make()`` makes them again (a matmul on each handle and stream that should have one), and
    they are the blocks allocated since; None where this torch cannot clear them.

    What another thread allocates on ``device`` meanwhile is taken for a workspace too.
    """
    clear = clearer(torch)
    if clear is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    clear(device)
    before = {address for address, _ in allocated(memory_snapshot(torch), index)}
    make()
    after = memory_snapshot(torch)
    made = {a: n for a, n in allocated(after, index) if a not in before}
    return Remade(made, after)


def memory_snapshot(torch: Any) -> list[dict[str, Any]]:
    """The allocator's segments, without the trace entries where this torch can leave them out."""
    try:
        return torch.cuda.memory_snapshot(include_traces=False)  # type: ignore[no-any-return]
    except TypeError:  # an older torch: no include_traces
        return torch.cuda.memory_snapshot()  # type: ignore[no-any-return]


def allocated(segments: Iterable[Mapping[str, Any]], index: int) -> list[tuple[int, int]]:
    """(address, bytes requested) of the allocated blocks of device ``index`` in ``segments``."""
    return [
        (int(b["address"]), int(b.get("requested_size") or b["size"]))
        for seg in segments
        if seg.get("device", 0) == index
        for b in seg.get("blocks", ())
        if b["state"] == "active_allocated"
    ]


def _version(torch: Any) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", str(torch.__version__))
    return (int(found[1]), int(found[2])) if found else (0, 0)
