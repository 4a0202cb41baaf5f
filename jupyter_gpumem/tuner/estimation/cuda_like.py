"""Which devices of a fake step run CUDA's kernels: CUDA's own, and the stand-in aimed at a card.

The modules that size what CUDA's kernels allocate for themselves (:mod:`.reduce_buffers`,
:mod:`.kernel_temporaries`) ask here, so that an estimate without CUDA (:mod:`.cuda_stand_in`)
sizes them as the card it stands for would.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Multiprocessors:
    """What the kernels read of the device: its multiprocessors and their threads."""

    count: int
    threads_each: int


_AIMED: dict[str, Multiprocessors] = {}  # a stand-in device's type -> the card's it stands for


def aim(device_type: str, multiprocessors: Multiprocessors) -> None:
    """Devices of ``device_type`` (a stand-in for CUDA) run as a card of ``multiprocessors``."""
    _AIMED[device_type] = multiprocessors


def multiprocessors(torch: Any, device: Any) -> Multiprocessors | None:
    """The multiprocessors ``device`` runs CUDA's kernels on; None where it runs none."""
    if device.type == "cuda":
        return _cuda_multiprocessors(torch, device.index or 0)
    return _AIMED.get(device.type)


@functools.cache
def _cuda_multiprocessors(torch: Any, index: int) -> Multiprocessors:
    props = torch.cuda.get_device_properties(index)
    return Multiprocessors(props.multi_processor_count, props.max_threads_per_multi_processor)
