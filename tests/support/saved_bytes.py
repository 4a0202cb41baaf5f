"""The bytes each module's forward saves for backward, measured apart from the extension.

A reference for the peak by module: ``saved_tensors_hooks`` note every storage saved while a
module's forward is the innermost one open (forward pre- and post-hooks on the modules asked
about), first saver wins. Parameters' storages are left out, views of them included (``F.linear``
saves its weight transposed), as ``%%gpumem`` leaves them out of activations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def saved_bytes_by_module(
    modules: Mapping[str, torch.nn.Module], run: Callable[[], Any]
) -> tuple[dict[str, int], Any]:
    """``{name: bytes}`` saved for backward inside each module while ``run()`` runs, and its
    result (kept, so what it saved stays alive)."""
    stack: list[str] = []
    first: dict[tuple[str, int], tuple[str, int]] = {}  # storage -> (saver, bytes)

    weights = {
        (str(p.device), p.untyped_storage().data_ptr())
        for module in modules.values()
        for p in [*module.parameters(), *module.buffers()]
    }

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if stack and key not in weights:
            first.setdefault(key, (stack[-1], storage.nbytes()))
        # Detached: a saved output kept as itself would hold its own grad_fn in a cycle, and
        # the graph would outlive the result when no backward runs.
        return t.detach()

    def enter(name: str) -> Callable[..., None]:
        return lambda module, args: stack.append(name)

    def leave(module: Any, args: Any, output: Any) -> None:
        stack.pop()  # a hook's return value would replace the output

    handles = []
    for name, module in modules.items():
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = run()
    finally:
        for handle in handles:
            handle.remove()
    out = dict.fromkeys(modules, 0)
    for saver, nbytes in first.values():
        out[saver] += nbytes
    return out, result
