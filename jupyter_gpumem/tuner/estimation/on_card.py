"""An estimate moved to a card and judged there: does it fit?

The estimate is made on the GPU present. On another card by name, the library workspaces
differ by architecture (see :mod:`.cards`): the difference is added to both peaks, and the
CUDA context measured here stands for the target's.
"""

from __future__ import annotations

from dataclasses import replace

from jupyter_gpumem.tuner.estimation import cards, verdict
from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.estimation.fake_peaks import DeviceFacts
from jupyter_gpumem.tuner.estimation.nccl import NcclShare
from jupyter_gpumem.units import format_bytes

_HANDLES = 2  # cuBLAS handles a training step uses: its own thread and autograd's


def on_card(
    found: Estimate, facts: DeviceFacts, target: cards.Card | None, nccl: NcclShare | None = None
) -> Estimate:
    """``found`` with its verdict on ``target`` (default: the card present), figures moved to it;
    ``nccl``: NCCL's buffers on each rank, for a rank of a parallel configuration."""
    if found.peak_bytes is None or found.peak_reserved_bytes is None:
        return found
    here = cards.present(facts.name, facts.total_bytes, facts.capability)
    on = target or here
    delta, notes = 0, list(found.notes)
    if target is not None:
        per_handle = here.workspace_per_handle
        handles = facts.workspace_bytes / per_handle if facts.workspace_bytes else _HANDLES
        delta = round(handles * (on.workspace_per_handle - per_handle))
        notes.append(
            f"estimated on the {here.name} here for the {on.name}: its library workspaces "
            f"differ by {format_bytes(delta)}, and the CUDA context measured here stands for "
            "its own"
        )
    reserved = found.peak_reserved_bytes + delta
    return replace(
        found,
        peak_bytes=found.peak_bytes + delta,
        peak_reserved_bytes=reserved,
        device_total_bytes=on.total_bytes,
        verdict=verdict.verdict(on, reserved, found.context_bytes, found.breakdown, nccl),
        notes=tuple(notes),
    )
