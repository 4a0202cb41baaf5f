"""Our hooks step aside for the torch code that refuses them, warns about them or guards on them.

``torch.func.grad``, ``vjp``, ``jacrev`` and ``hessian`` run under
``torch.autograd.graph.disable_saved_tensors_hooks``, which raises if any saved-tensor hooks
are pushed. While a cell is tagged, that function is wrapped: when our hooks are on top of
the stack they come off for the transform and go back after it, so the transform runs as in
the plain cell (its saved tensors are then not tagged as activations). A user's own hooks
above ours are left alone, and the transform refuses them as it would in the plain cell.

A module compiled with ``torch.compile`` guards on how many global module hooks torch holds,
so our global hooks are taken out of torch's dicts while a compiled module runs
(:class:`HooksOut`): compiled in a tracked cell, it runs in a plain cell without compiling
again, and the other way round.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class HooksAside:
    """The wrapper of ``disable_saved_tensors_hooks``, installed while any tagger's hooks are."""

    def __init__(self) -> None:
        self._packs: list[Callable[..., Any]] = []  # the pack hooks of the taggers installed
        self._original: Callable[..., Any] | None = None

    def add(self, pack: Callable[..., Any]) -> None:
        graph = sys.modules["torch"].autograd.graph
        if self._original is None:
            self._original = graph.disable_saved_tensors_hooks
            graph.disable_saved_tensors_hooks = self._disabled
        self._packs.append(pack)

    def discard(self, pack: Callable[..., Any]) -> None:
        """Forget ``pack``; the last one gone puts torch's own function back. Safe to repeat."""
        if pack in self._packs:
            self._packs.remove(pack)
        if not self._packs and self._original is not None:
            graph = sys.modules["torch"].autograd.graph
            if graph.disable_saved_tensors_hooks == self._disabled:  # the user's own patch stays
                graph.disable_saved_tensors_hooks = self._original
            self._original = None

    @property
    def installed(self) -> bool:
        return self._original is not None

    @contextmanager
    def _disabled(self, error_message: str) -> Iterator[None]:
        autograd = sys.modules["torch"]._C._autograd
        top = autograd._top_saved_tensors_default_hooks(False)
        ours = top is not None and any(top[0] == pack for pack in self._packs)
        original = self._original or _torch_own()
        if ours:
            autograd._pop_saved_tensors_default_hooks()
        try:
            with original(error_message):
                yield
        finally:
            if ours:
                autograd._push_saved_tensors_default_hooks(*top)


def _torch_own() -> Callable[..., Any]:
    from torch.autograd.graph import disable_saved_tensors_hooks

    return disable_saved_tensors_hooks


HOOKS_ASIDE = HooksAside()


class GlobalHooksUnseen:
    """``torch.compile(module)`` warns, at every call, when global module hooks exist: while a
    cell is tagged, ours are not counted, so it warns only about the user's own, as in the
    plain cell (its warning would also leave ``__warningregistry__`` in the user's namespace)."""

    def __init__(self) -> None:
        self._ids: set[int] = set()
        self._original: Callable[[], Any] | None = None

    def add(self, handles: list[Any]) -> None:
        module = sys.modules["torch"].nn.modules.module
        if self._original is None:
            self._original = module._has_any_global_hook
            module._has_any_global_hook = self._has_any_but_ours
        self._ids.update(h.id for h in handles)

    def discard(self, handles: list[Any]) -> None:
        """Forget ``handles``; with none left, torch's own check comes back. Safe to repeat."""
        self._ids.difference_update(h.id for h in handles)
        if not self._ids and self._original is not None:
            module = sys.modules["torch"].nn.modules.module
            if module._has_any_global_hook == self._has_any_but_ours:
                module._has_any_global_hook = self._original
            self._original = None

    @property
    def installed(self) -> bool:
        return self._original is not None

    def _has_any_but_ours(self) -> bool:
        module = sys.modules["torch"].nn.modules.module
        hooks = (
            module._global_backward_pre_hooks,
            module._global_backward_hooks,
            module._global_forward_pre_hooks,
            module._global_forward_hooks,
            module._global_forward_hooks_always_called,
            module._global_forward_hooks_with_kwargs,
        )
        return any(key not in self._ids for found in hooks for key in found)


GLOBAL_HOOKS_UNSEEN = GlobalHooksUnseen()


class HooksOut:
    """Hooks taken out of torch's dicts of hooks, until they are put back."""

    def __init__(self) -> None:
        self._taken: list[tuple[Any, int, Any]] = []  # (dict, handle id, its value there)

    def take_out(self, handles: list[Any]) -> None:
        """Take the entries of ``handles`` (``RemovableHandle``) out of the dicts they are in."""
        for handle in handles:
            for ref in (handle.hooks_dict_ref, *handle.extra_dict_ref):
                hooks = ref()
                if hooks is not None and handle.id in hooks:
                    self._taken.append((hooks, handle.id, hooks.pop(handle.id)))

    def put_back(self) -> None:
        """Put back what was taken out; safe to repeat."""
        taken, self._taken = self._taken, []
        for hooks, key, value in taken:
            hooks[key] = value

    def forget(self) -> None:
        """Drop what was taken out without putting it back (the hooks were removed meanwhile)."""
        self._taken = []
