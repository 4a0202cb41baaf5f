"""Leak hints: memory that outlives a cell for a reason the user can fix.

Pure functions over measured byte counts; the measuring (IPython state, tensors,
the garbage collector) lives in `jupyter_gpumem.held.ipython_refs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from jupyter_gpumem.units import format_bytes

KINDS = ("output-cache", "traceback", "autograd-graph", "cycles", "growth")
MiB = 2**20
# Below these a hint costs the reader more than freeing the memory gains: a hint is shown from
# 1 MiB up, and one about memory held now also from 1% of the cell's peak up. Growth adds up
# over runs whatever the peak, so it needs only the 1 MiB (growth_hint asks that per run too).
FLOOR_BYTES = MiB
FLOOR_SHARE_OF_PEAK = 0.01


@dataclass(frozen=True)
class LeakHint:
    """Memory held for a fixable reason: what, how much, and what to do about it.

    The message is a template whose ``{name}`` fields are byte amounts, so that each front
    end writes them in its own units; ``message`` writes them in binary units.
    """

    kind: str  # one of KINDS
    bytes: int  # bytes held; for "growth", the typical growth per run
    template: str  # the message, with {name} for each of `amounts`
    fix: str
    where: tuple[str, ...] = ()  # the holders, e.g. ("Out[3]", "_") or variable names
    amounts: Mapping[str, int] = field(default_factory=dict)  # bytes, by template field

    @property
    def message(self) -> str:
        return self.template.format_map({k: format_bytes(n) for k, n in self.amounts.items()})

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "bytes": self.bytes,
            "message": self.message,
            "template": self.template,
            "amounts": dict(self.amounts),
            "fix": self.fix,
            "where": list(self.where),
        }


@dataclass(frozen=True)
class Freed:
    """What `release` gave back. None means "not measured" (say so, do not guess)."""

    cuda_bytes: int | None  # drop of memory_allocated, all devices; None: CUDA not initialised
    cpu_bytes: int | None  # CPU storages the cleared holders referenced that are now gone
    cache_returned_bytes: int | None  # reserved memory empty_cache() gave back to the driver
    cleared: tuple[str, ...]

    @property
    def total_bytes(self) -> int:
        """Tensor memory that came back (CUDA allocated drop plus CPU storages)."""
        return max(0, self.cuda_bytes or 0) + (self.cpu_bytes or 0)

    def __str__(self) -> str:
        parts = []
        if self.cuda_bytes is not None:
            parts.append(f"{format_bytes(max(0, self.cuda_bytes))} of CUDA tensors")
        if self.cpu_bytes is not None:
            parts.append(f"{format_bytes(self.cpu_bytes)} of CPU tensors")
        line = "freed " + (
            " and ".join(parts) if parts else "nothing measurable (torch not imported)"
        )
        if self.cache_returned_bytes:
            line += f"; {format_bytes(self.cache_returned_bytes)} of cache returned to the driver"
        cleared = ", ".join(self.cleared) if self.cleared else "nothing to clear"
        return f"{line} (cleared: {cleared})"


def worth_showing(hint: LeakHint, peak_bytes: int | None) -> bool:
    """Whether ``hint`` holds enough to be shown beside a cell whose peak was ``peak_bytes``."""
    if hint.bytes < FLOOR_BYTES:
        return False
    if hint.kind == "growth" or peak_bytes is None:
        return True
    return hint.bytes >= FLOOR_SHARE_OF_PEAK * peak_bytes


def _names(where: Sequence[str], limit: int = 4) -> str:
    """The holders for a template: braces in names are escaped."""
    shown = ", ".join(where[:limit])
    shown += f" and {len(where) - limit} more" if len(where) > limit else ""
    return shown.replace("{", "{{").replace("}", "}}")


def output_cache_hint(nbytes: int, where: Sequence[str]) -> LeakHint | None:
    """Tensors kept alive only by IPython's output history (``Out``, ``_``, ``_N``)."""
    if nbytes <= 0:
        return None
    return LeakHint(
        "output-cache",
        nbytes,
        "IPython's output cache holds {bytes} of tensors "
        f"that nothing else references ({_names(where)}).",
        "Run `%gpumem free`, or end cells that return a tensor with a semicolon (`;`) so that "
        "the output is not cached.",
        tuple(where),
        {"bytes": nbytes},
    )


def traceback_hint(nbytes: int, where: Sequence[str]) -> LeakHint | None:
    """Tensors kept alive by the frames of the last exception's traceback."""
    if nbytes <= 0:
        return None
    return LeakHint(
        "traceback",
        nbytes,
        "The last error's traceback keeps {bytes} of tensors alive "
        f"in the locals of {_names(where)}.",
        "Run `%gpumem free` (it clears the stored traceback); `%debug` will then be unavailable.",
        tuple(where),
        {"bytes": nbytes},
    )


def graph_hint(nbytes: int, where: Sequence[str]) -> LeakHint | None:
    """Saved-for-backward tensors of an autograd graph kept alive by stored outputs."""
    if nbytes <= 0:
        return None
    plural = "keep their" if len(where) > 1 else "keeps its"
    return LeakHint(
        "autograd-graph",
        nbytes,
        f"{_names(where)} {plural} autograd graph alive: about {{bytes}} of "
        "tensors saved for backward.",
        "Store `loss.item()` or `loss.detach()` instead (e.g. when logging losses), "
        "or `del` the variable once backward() is done.",
        tuple(where),
        {"bytes": nbytes},
    )


def cycles_hint(nbytes: int, tensors: int) -> LeakHint | None:
    """Tensors reachable only from reference cycles, waiting for the garbage collector."""
    if nbytes <= 0:
        return None
    return LeakHint(
        "cycles",
        nbytes,
        f"{{bytes}} in {tensors} tensor(s) is unreachable but not yet freed: "
        "reference cycles hold it until the garbage collector runs.",
        "Run `import gc; gc.collect()` (or `%gpumem free`); to free it at once, break the "
        "cycle (e.g. an object, closure or hook that refers back to its owner).",
        (),
        {"bytes": nbytes},
    )


def growth_hint(
    after_bytes: Sequence[int],
    *,
    label: str = "this cell",
    min_runs: int = 3,
    min_growth_bytes: int = MiB,
    tolerance: float = 0.25,
) -> LeakHint | None:
    """A hint when memory grows by a similar amount on each re-run of one cell.

    ``after_bytes`` are the allocated-after bytes (or peaks) of consecutive runs of the
    same cell, oldest first. Each of the last ``min_runs`` runs (or more) must grow by at
    least ``min_growth_bytes``, within ``tolerance`` of the median growth of those runs.
    """
    if min_runs < 2:
        raise ValueError(f"min_runs must be at least 2, got {min_runs}")
    if len(after_bytes) < min_runs:
        return None
    steps: list[int] = []
    for before, after in zip(after_bytes[-2::-1], after_bytes[::-1], strict=False):
        step = after - before
        if step < min_growth_bytes:
            break
        steps.append(step)
    if len(steps) < min_runs - 1:
        return None
    typical = int(median(steps))
    similar = 0
    while similar < len(steps) and abs(steps[similar] - typical) <= tolerance * typical:
        similar += 1
    if similar < min_runs - 1:
        return None
    steps = steps[:similar]
    total = sum(steps)
    return LeakHint(
        "growth",
        typical,
        f"{_names([label])} grows by {{bytes}} per run "
        f"(+{{total}} over the last {len(steps) + 1} runs).",
        "Something the cell creates outlives it: a list or dict it appends to, or a stored "
        "tensor with its graph. Append `.item()`/`.detach()` values, or reset the container "
        "at the top of the cell.",
        (label,),
        {"bytes": typical, "total": total},
    )
