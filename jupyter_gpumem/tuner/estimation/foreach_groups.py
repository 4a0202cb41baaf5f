"""Foreach ops run once per kind of element: an optimizer's lists of a model's parameters.

A foreach op (``torch._foreach_*``) applies one elementwise op to each element of its lists,
and what element i makes depends on element i alone: its shape, strides, dtype and device, and
the kind of the scalar beside it. An optimizer's step over a transformer passes lists of
hundreds of tensors in a handful of layouts, and the fake mode works out every element's
result in Python, op after op.

:func:`grouped` runs the op on one element of each kind (the first of its kind, in list
order) and gives every other element an empty output of its kind's layout, in list order: the
same storages, of the same sizes, born in the same order as the op on the whole lists makes.
An op whose lists are not all of one length, whose outputs are not one list of plain tensors,
or whose output storage is not what an empty tensor of its layout holds runs on the whole
lists instead. ``ENABLED = False`` runs every element (the equality tests compare the two).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

ENABLED = True
_LEAST = 4  # elements below which grouping saves nothing


def grouped(torch: Any, func: Any) -> Callable[..., Any] | None:
    """``func`` run by kinds of element, where it is a foreach op; None for any other op."""
    if not ENABLED or not _is_foreach(func):
        return None
    return functools.partial(_run, torch, func)


def _is_foreach(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    return name.startswith("_foreach_")


def _run(torch: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    lists = [i for i, a in enumerate(args) if isinstance(a, (list, tuple))]
    named = [k for k, v in kwargs.items() if isinstance(v, (list, tuple))]
    lengths = {len(args[i]) for i in lists} | {len(kwargs[k]) for k in named}
    if len(lengths) != 1:
        return func(*args, **kwargs)
    (n,) = lengths
    if n < _LEAST:
        return func(*args, **kwargs)
    columns = [args[i] for i in lists] + [kwargs[k] for k in named]
    first: dict[tuple[Any, ...], int] = {}  # kind -> its first element
    kind_of = []
    for i in range(n):
        kind = _kind(torch, [c[i] for c in columns])
        if kind is None:
            return func(*args, **kwargs)
        kind_of.append(first.setdefault(kind, i))
    if len(first) == n:
        return func(*args, **kwargs)
    picked = list(first.values())
    chosen = [[a[i] for i in picked] if j in lists else a for j, a in enumerate(args)]
    out = func(
        *chosen, **{k: [v[i] for i in picked] if k in named else v for k, v in kwargs.items()}
    )
    if out is None or (isinstance(out, (list, tuple)) and not out):  # in place: nothing made
        return out
    if not (
        isinstance(out, (list, tuple))
        and len(out) == len(picked)
        and all(type(o) is type(out[0]) and isinstance(o, torch.Tensor) for o in out)
    ):
        return func(*args, **kwargs)
    made = dict(zip(picked, out, strict=True))
    checked: set[int] = set()
    whole = []
    for i, first_of_kind in enumerate(kind_of):
        if i == first_of_kind:
            whole.append(made[i])
            continue
        like = made[first_of_kind]
        copy = _empty_like(torch, like)
        if first_of_kind not in checked:  # each kind's first copy against the op's own
            if not _same_storage(like, copy):
                return func(*args, **kwargs)
            checked.add(first_of_kind)
        whole.append(copy)
    return type(out)(whole) if isinstance(out, tuple) else whole


def _kind(torch: Any, element: list[Any]) -> tuple[Any, ...] | None:
    """What element i's result depends on: each tensor's layout, each scalar's type, and which
    of its tensors are the same tensor (``addcmul(v, g, g)``); None where a tensor has values."""
    fake = torch._subclasses.fake_tensor.FakeTensor
    tensors: list[Any] = []
    key: list[Any] = []
    for x in element:
        if isinstance(x, torch.Tensor):
            if not isinstance(x, fake) or x.constant is not None:
                return None
            same = next((j for j, t in enumerate(tensors) if t is x), -1)
            tensors.append(x)
            key.append((
                type(x), tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.device,
                x.layout, x.requires_grad, same,
            ))  # fmt: skip
        else:
            key.append(type(x))
    return tuple(key)


def _empty_like(torch: Any, t: Any) -> Any:
    return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device=t.device)


def _same_storage(made: Any, copy: Any) -> bool:
    return (
        type(made) is type(copy)
        and made.storage_offset() == copy.storage_offset() == 0
        and made.untyped_storage().nbytes() == copy.untyped_storage().nbytes()
        and made.layout == copy.layout
    )
