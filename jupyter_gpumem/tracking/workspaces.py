"""The buffers libraries keep in the caching allocator for themselves, by the size they ask for.

torch gives cuBLAS a workspace for each handle and stream that runs a matmul (the kernel's
thread, autograd's engine thread, each side stream), and cuBLASLt one more. They are
allocated once, never freed, and belong to no tensor, so nothing else names them. Their
sizes follow torch's own rules: its getters where this torch has them, else the
environment variables it reads and its defaults per GPU generation.

Importing this module does not import torch.
"""

from __future__ import annotations

import os
import re
from typing import Any

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
