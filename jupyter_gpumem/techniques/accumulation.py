"""Gradient accumulation: one optimizer step over ``k`` micro-batches of the same batch.

The batch is cut along its first dimension into ``k`` equal views (nothing is copied: the
full batch stays where the user made it, as a loader's batch would), each micro-batch's
loss is divided by ``k`` before its backward, and the optimizer steps once. With a loss that
averages over the batch, the gradients are the full batch's: the same effective batch and
loss scale, with the activations of one micro-batch alive at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ACCUMULATE_HELP = (
    "accumulate is the number of micro-batches per optimizer step: a whole number from 1"
)


def check_accumulate(k: object) -> int:
    """``k`` as a positive int, or ValueError saying what is allowed."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{ACCUMULATE_HELP}, got {repr(k)[:40]}")
    return k


def micro_batches(batch: Any, k: int) -> list[Any]:
    """``batch`` cut into ``k`` equal micro-batches along the first dimension of its tensors.

    A batch is a tensor, or a tuple, list or dict of them (nested); what is not a tensor is
    given to every micro-batch as it is. ValueError where the rows do not split evenly.
    """
    if k == 1:
        return [batch]
    rows = _rows(batch)
    if not rows:
        raise ValueError(f"accumulate={k} cuts the batch's tensors, and the batch holds none")
    if len(rows) > 1:
        raise ValueError(
            f"accumulate={k} cuts the batch along its first dimension, whose tensors disagree "
            f"on it ({', '.join(map(str, sorted(rows)))} rows)"
        )
    (n,) = rows
    if n % k:
        raise ValueError(
            f"accumulate={k} needs a batch whose {n} rows split evenly: use a divisor of {n}"
        )
    return [_cut(batch, i * (n // k), n // k) for i in range(k)]


def _rows(batch: Any) -> set[int]:
    import torch

    if isinstance(batch, torch.Tensor):
        return {batch.shape[0]} if batch.dim() else set()
    items = (
        batch.values()
        if isinstance(batch, Mapping)
        else batch
        if isinstance(batch, (tuple, list))
        else ()
    )
    return set().union(*(_rows(item) for item in items)) if items else set()


def _cut(batch: Any, start: int, size: int) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.narrow(0, start, size) if batch.dim() else batch
    if isinstance(batch, Mapping):
        return type(batch)({key: _cut(value, start, size) for key, value in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(_cut(item, start, size) for item in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_cut(item, start, size) for item in batch)
    return batch
