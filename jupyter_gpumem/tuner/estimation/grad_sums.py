"""The autograd engine's sums of gradients, which a real GPU makes in place and fake tensors cannot.

Where one input of a node gets gradients from several nodes (a residual stream, a shared
relative-position table, tied embeddings), the engine adds each later arrival to what the
node's input buffer holds (``accumulate`` in ``torch/csrc/autograd/input_buffer.cpp``, torch
2.4 to 2.13): in place (``old.add_(new)``) where grad mode is off and the buffer holds the only
reference to a dense tensor that is no tensor subclass, else out of place. A fake tensor is a
tensor subclass, so a fake step makes a new block the size of the gradient for every such sum,
which the real step does not: a DeBERTa-v3 step on an H200 summed 29 gradients in place, 28 of
8 MiB and one of 125 MiB (its tied embeddings), all 29 new blocks in the fake step
(``bench/op_order.py``).

:class:`GradSums` finds the engine's sums among the backward's ops. The nodes that send a
gradient to an input another node also sends one to get a post hook (run when the node's
function has returned); an ``add`` made while that node is still the engine's current node,
after its hook ran, is the engine's, and one it makes in place if the old buffer is no view
(a view's base holds the storage as well). The storage log then places the sum in the old
buffer's block where the old buffer dies as the sum replaces it (:meth:`.StorageLog.summed`): which is
the engine's own test, that nothing else held it.

A fake step makes the sums in place on CUDA and on the stand-in device (:mod:`.cuda_like`),
where its figures stand for CUDA's allocator; on the CPU it leaves them out of place, as the
CPU tracker sees them: its own dispatch mode makes the engine's tensors Python objects with more
than one reference, so the engine sums out of place there too.

Known limitations:
- A sum whose result type is not the buffer's (an fp32 gradient added to a bf16 buffer) stays
  out of place: on the GPU it is made in the buffer's dtype, which the later ops then see.
- Backward passes run inside a backward (reentrant checkpointing) are not watched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any


class GradSums:
    """Which ``add`` of a watched backward is the engine summing two gradients."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._add = torch.ops.aten.add.Tensor
        self._after: Any = None  # the node whose function returned last, of those hooked

    @contextlib.contextmanager
    def watching(self, loss: Any) -> Iterator[None]:
        """Hooks on the nodes of ``loss``'s graph that send a gradient where another does."""
        root = getattr(loss, "grad_fn", None)
        handles = []
        if hasattr(self._torch._C, "_current_autograd_node"):
            for node in _fan_in_senders(root):
                try:
                    handles.append(node.register_hook(self._returned))
                except (RuntimeError, TypeError):  # a node that takes no hooks: its sums stay
                    continue
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            self._after = None

    def _returned(self, grad_inputs: Any, grad_outputs: Any, *rest: Any) -> None:
        self._after = self._torch._C._current_autograd_node()

    def is_sum(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None) -> bool:
        """Whether ``func(*args)`` is the engine adding a gradient to an input buffer's, one it
        would add in place on the GPU (dense, of the buffer's dtype and shape)."""
        if func is not self._add or self._after is None or len(args) != 2 or kwargs:
            return False
        torch = self._torch
        if torch.is_grad_enabled() or torch._C._current_autograd_node() is not self._after:
            return False
        old, new = args
        if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor):
            return False
        if torch.result_type(old, new) != old.dtype or new.shape != old.shape:
            return False
        if old._is_view():  # its base holds the storage too: not the only reference
            return False
        return dense(tuple(old.shape), old.stride())


def dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` and ``strides`` covers its memory exactly once, in some
    order of its dimensions (``is_non_overlapping_and_dense``)."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(shape, strides, strict=True) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _fan_in_senders(root: Any) -> list[Any]:
    """The nodes under ``root`` that send a gradient to an input (a node and its input number)
    that some other node sends one to as well."""
    senders: dict[tuple[Any, int], list[Any]] = {}
    seen: set[Any] = set()
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for target, number in node.next_functions:
            if target is not None:
                senders.setdefault((target, number), []).append(node)
                stack.append(target)
    out: dict[Any, None] = {}
    for nodes in senders.values():
        if len(nodes) > 1:
            out.update(dict.fromkeys(nodes))
    return list(out)
