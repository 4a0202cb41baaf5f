"""Recognise decoding: a model fed back, call after call, the cache it returned.

A root module called without gradients is *decoding* when its inputs hold state that the
same module returned on its previous call (a hand-written loop passing ``past`` back), or
when its output carries a transformers ``Cache`` seen on an earlier call (``generate``
passes the cache as a keyword, which module hooks do not see). The first call of such a
run is the *prefill*; the cache's tensors are tagged ``kv_cache`` whenever they are seen.

Never imports torch or transformers: the caller passes torch, and a ``Cache`` is recognised
only where transformers is already imported.

Known limitations:
    - A static cache reused by a second ``generate`` in the same cell makes its prefill
      read as a decode step (the cache object is the same).
    - Recurrent state fed back under ``no_grad`` (an RNN's hidden state) reads as a cache.
    - A step lasts until the next model call: what the cell does after its last generation
      step, until it calls a model again, reads as part of that step.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from jupyter_gpumem.held.tensor_walk import Walker

MAX_LEAVES = 512  # tensors looked at in one call's inputs or output
CACHE_BUDGET = 4_000  # objects visited walking one cache


class DecodeWatch:
    """Per cell: which root-module calls are prefill or decode, and which tensors are cache."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.decode_steps = 0
        self._returned: dict[int, list[weakref.ref[Any]]] = {}  # root id -> its output's leaves
        self._fed_back: dict[int, set[int]] = {}  # root id -> output leaf positions given back
        self._caches: weakref.WeakSet[Any] = weakref.WeakSet()

    @property
    def decoding(self) -> bool:
        return self.decode_steps > 0

    def before(self, module: Any, args: tuple[Any, ...]) -> tuple[bool, list[Any]]:
        """(is a decode step, tensors of the cache) for a root call about to run."""
        returned = self._returned.get(id(module))
        if not returned:
            return False, []
        # By identity, not address: a freed output's memory may well hold the next input.
        where = {id(t): i for i, ref in enumerate(returned) if (t := ref()) is not None}
        cache = []
        positions = self._fed_back.setdefault(id(module), set())
        for t in _leaves(args, self.torch):
            i = where.get(id(t))
            if i is not None:
                positions.add(i)
                cache.append(t)
        return bool(cache), cache

    def after(self, module: Any, output: Any, fed_back: bool) -> tuple[str | None, list[Any]]:
        """(``prefill``, ``decode`` or None, tensors of the cache) for a root call that ran."""
        leaves = list(_leaves(output, self.torch))
        self._returned[id(module)] = [weakref.ref(t) for t in leaves]
        positions = self._fed_back.get(id(module), set())
        cache = [t for i, t in enumerate(leaves) if i in positions]
        phase = "decode" if fed_back else None
        for found in _caches(output):
            cache.extend(_tensors_of(found, self.torch))
            if found in self._caches:
                phase = "decode"
            else:
                self._caches.add(found)
                phase = phase or "prefill"
        if phase == "decode":
            self.decode_steps += 1
        return phase, cache


def _leaves(value: Any, torch: Any) -> Iterator[Any]:
    """The tensors of a call's inputs or output, through tuples, lists and mappings."""
    todo, seen = [value], 0
    while todo and seen < MAX_LEAVES:
        item = todo.pop()
        if isinstance(item, torch.Tensor):
            seen += 1
            yield item
        elif isinstance(item, (tuple, list)):
            todo.extend(reversed(item))
        elif isinstance(item, Mapping):
            todo.extend(reversed(list(item.values())))


def _caches(output: Any) -> Iterator[Any]:
    """The transformers ``Cache`` objects an output carries at its top level."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    kind = getattr(cache_utils, "Cache", None)
    if kind is None:
        return
    if isinstance(output, Mapping):
        values: Iterable[Any] = output.values()
    elif isinstance(output, (tuple, list)):
        values = output
    else:
        return
    yield from (value for value in values if isinstance(value, kind))


def _tensors_of(cache: Any, torch: Any) -> list[Any]:
    out: list[Any] = []
    Walker(torch, graphs=False, budget=CACHE_BUDGET, on_tensor=out.append).walk(cache)
    return out
