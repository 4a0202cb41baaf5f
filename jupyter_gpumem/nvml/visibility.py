"""Which NVML devices a CUDA process sees, and in which order (`CUDA_VISIBLE_DEVICES`).

Pure functions over a description of the machine, so the mapping is testable without a GPU.

Known limitations:
    - Order follows NVML (PCI bus order), as with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. CUDA's own
      default (``FASTEST_FIRST``) only differs on machines that mix GPU models.
    - An integer that names a MIG-enabled GPU is taken to mean all of its MIG instances.
    - The server's environment is used: a kernel spec that sets its own
      ``CUDA_VISIBLE_DEVICES`` sees a different numbering.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_LEGACY_MIG = re.compile(r"^MIG-(GPU-[0-9A-Za-z-]+)/(\d+)/(\d+)$")


@dataclass(frozen=True)
class MigSlot:
    """One MIG instance of a physical GPU."""

    uuid: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None


@dataclass(frozen=True)
class PhysicalGpu:
    """One GPU as NVML enumerates it; ``mig`` is filled when MIG mode is on."""

    nvml_index: int
    uuid: str | None
    mig_enabled: bool = False
    mig: tuple[MigSlot, ...] = ()


@dataclass(frozen=True)
class VisibleDevice:
    """Device ``index`` as CUDA numbers it; ``mig_position`` indexes ``PhysicalGpu.mig``."""

    index: int
    nvml_index: int
    mig_position: int | None = None


def _expand(gpu: PhysicalGpu) -> list[tuple[int, int | None]]:
    if gpu.mig_enabled:
        return [(gpu.nvml_index, k) for k in range(len(gpu.mig))]
    return [(gpu.nvml_index, None)]


def _unique_prefix(
    candidates: Sequence[tuple[str, tuple[int, int | None]]], token: str
) -> tuple[int, int | None] | None:
    exact = [key for uuid, key in candidates if uuid == token]
    if exact:
        return exact[0]
    matches = [key for uuid, key in candidates if uuid.startswith(token)]
    return matches[0] if len(matches) == 1 else None


def _resolve_token(token: str, gpus: Sequence[PhysicalGpu]) -> list[tuple[int, int | None]] | None:
    """The (nvml_index, mig_position) entries one token names, or None when it names nothing."""
    if re.fullmatch(r"-?\d+", token):
        position = int(token)
        if not 0 <= position < len(gpus):
            return None
        return _expand(gpus[position])
    legacy = _LEGACY_MIG.match(token)
    if legacy:
        parent, gi, ci = legacy.group(1), int(legacy.group(2)), int(legacy.group(3))
        for gpu in gpus:
            if gpu.uuid == parent:
                for k, slot in enumerate(gpu.mig):
                    if (slot.gpu_instance_id, slot.compute_instance_id) == (gi, ci):
                        return [(gpu.nvml_index, k)]
        return None
    if token.startswith("MIG-"):
        migs = [
            (slot.uuid, (gpu.nvml_index, k))
            for gpu in gpus
            for k, slot in enumerate(gpu.mig)
            if slot.uuid
        ]
        found = _unique_prefix(migs, token)
        return [found] if found else None
    if token.startswith("GPU-"):
        physical = [(gpu.uuid, (gpu.nvml_index, None)) for gpu in gpus if gpu.uuid]
        found = _unique_prefix(physical, token)
        if found is None:
            return None
        by_index = {gpu.nvml_index: gpu for gpu in gpus}
        return _expand(by_index[found[0]])
    return None


def visible_devices(spec: str | None, gpus: Sequence[PhysicalGpu]) -> tuple[VisibleDevice, ...]:
    """Map a ``CUDA_VISIBLE_DEVICES`` value onto NVML's devices, numbered as CUDA numbers them.

    ``None`` (unset) shows every GPU, MIG-enabled GPUs as their instances. Tokens are indices,
    ``GPU-`` or ``MIG-`` UUIDs (unique prefixes allowed) or legacy ``MIG-GPU-<uuid>/<gi>/<ci>``.
    As in CUDA, the first token that names no device ends the list; a repeated device is skipped.
    """
    if spec is None:
        entries = [entry for gpu in gpus for entry in _expand(gpu)]
    else:
        entries = []
        for raw in spec.split(","):
            resolved = _resolve_token(raw.strip(), gpus)
            if resolved is None:
                break
            entries.extend(entry for entry in resolved if entry not in entries)
    return tuple(
        VisibleDevice(index=i, nvml_index=nvml_index, mig_position=position)
        for i, (nvml_index, position) in enumerate(entries)
    )
