"""An estimate moved to a card and judged there: does it fit?

The estimate is made on the GPU present. On another card by name, the library workspaces
differ by architecture (see :mod:`.cards`): the difference is added to both peaks, and the
CUDA context measured here stands for the target's. What this process holds on the GPU present
before the call is never counted for another card (:func:`counts_held`); a note says what it
held and whether the estimate counts it.
"""

from __future__ import annotations

from dataclasses import replace

from jupyter_gpumem.tuner.estimation import cards, verdict
from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.estimation.fake_peaks import DeviceFacts, workspace_note
from jupyter_gpumem.tuner.estimation.nccl import NcclShare
from jupyter_gpumem.units import format_bytes

_HANDLES = 2  # cuBLAS handles a training step uses: its own thread and autograd's


def checked_count_held(count_held: object) -> bool:
    """``count_held`` as given by the user; TypeError saying what is allowed."""
    if not isinstance(count_held, bool):
        raise TypeError(
            f"count_held must be True (count what this process already holds on the GPU) or "
            f"False (estimate for a process that holds nothing else), got {count_held!r}"
        )
    return count_held


def counts_held(count_held: bool, facts: DeviceFacts, target: cards.Card | None) -> bool:
    """Whether the estimate counts what this process holds on the GPU present: as asked, and
    never for ``target`` where that is another card (it is held here, not there)."""
    return count_held and _other(facts, target) is None


def _other(facts: DeviceFacts, target: cards.Card | None) -> tuple[str, str] | None:
    """(the card present, ``target``) by name where ``target`` is another card; else None."""
    here = cards.present(facts.name, facts.total_bytes, facts.capability).name
    return None if target is None or target.name == here else (here, target.name)


def held_note(found: Estimate, facts: DeviceFacts, target: cards.Card | None) -> str | None:
    """What the process held before the call, and whether the estimate counts it."""
    if not found.held_bytes:
        return None
    held = f"held before the call: {format_bytes(found.held_bytes)}"
    if found.held_counted:
        return f"{held} (not the model's; count_held=False leaves it out)"
    other = _other(facts, target)
    if other is not None:
        return f"{held} on this {other[0]}, left out: it is held here, not on the {other[1]}"
    return (
        f"{held}, left out (count_held=False): the estimate is for a process holding nothing else"
    )


def pool_note(found: Estimate) -> str | None:
    """The CUDA graph pools the process reserved before the call, which the estimate counts."""
    if not found.held_pool_bytes:
        return None
    return (
        f"CUDA graph pools of this process reserve {format_bytes(found.held_pool_bytes)} before "
        "the call (a compiled model's, kept while it lives): in the reserved peak, never used by "
        "this workload; count_held=False leaves them out"
    )


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
    held = held_note(found, facts, target)
    if held is not None:
        notes.append(held)
    pools = pool_note(found)
    if pools is not None:
        notes.append(pools)
    told = workspace_note(facts)
    if told is not None:
        notes.append(told)
    reserved = found.peak_reserved_bytes + delta
    return replace(
        found,
        peak_bytes=found.peak_bytes + delta,
        peak_reserved_bytes=reserved,
        breakdown=_workspaces_moved(found.breakdown, delta),
        device_total_bytes=on.total_bytes,
        verdict=verdict.verdict(on, reserved, found.context_bytes, found.breakdown, nccl),
        notes=tuple(notes),
    )


def _workspaces_moved(breakdown: dict[str, int] | None, delta: int) -> dict[str, int] | None:
    """``breakdown`` with the target's library workspaces, so that it still sums to the peak."""
    if not breakdown or not delta:
        return breakdown
    into = "library_workspace" if breakdown.get("library_workspace") else "unattributed"
    return {**breakdown, into: breakdown.get(into, 0) + delta}
