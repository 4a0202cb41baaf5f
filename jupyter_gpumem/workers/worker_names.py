"""Names for a worker process's tensors, from the locals of the function it runs.

A rank's model, optimizer and batches live in the locals of the user's function, which the
kernel's namespace never sees. At the worker's first root module call and its first
optimizer step, the frames between the hook and the bottom of the stack are read once: each
local that is a module, an optimizer or a tensor is kept by weak reference under its name.
When the measurement ends, the ones still alive join the namespace its report names tensors
from, so a DDP model that outlives its function in a reference cycle reads
``model.module.0.weight``, not "(unnamed)".
"""

from __future__ import annotations

import importlib
import sys
import weakref
from typing import Any


class WorkerLocals:
    """Weak references to the worker function's models, optimizers and tensors, by name."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self._refs: dict[str, weakref.ref[Any]] = {}
        self._handles: list[Any] = []
        self._kinds = (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)
        self._read_at_forward = self._read_at_step = False

    def install(self) -> None:
        hooks = self.torch.nn.modules.module
        self._handles.append(hooks.register_module_forward_pre_hook(self._on_forward))
        optim = importlib.import_module("torch.optim.optimizer")
        self._handles.append(optim.register_optimizer_step_post_hook(self._on_step))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def namespace(self) -> dict[str, Any]:
        """The named objects still alive."""
        alive = {name: ref() for name, ref in self._refs.items()}
        return {name: obj for name, obj in alive.items() if obj is not None}

    # Each reads once; the hooks stay until remove(): ``Optimizer.step`` iterates the
    # global hooks live, so one cannot remove itself.
    def _on_forward(self, module: Any, args: Any) -> None:
        if not self._read_at_forward:  # the first call: the model and its inputs exist
            self._read_at_forward = True
            self._read(sys._getframe(1))

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._read_at_step:  # the first step: the optimizer's state exists
            self._read_at_step = True
            self._read(sys._getframe(1))

    def _read(self, frame: Any) -> None:
        while frame is not None:
            filename = frame.f_code.co_filename.replace("\\", "/")
            if "/torch/" not in filename and "/jupyter_gpumem/" not in filename:
                for name, value in list(frame.f_locals.items()):
                    if name not in self._refs and isinstance(value, self._kinds):
                        try:
                            self._refs[name] = weakref.ref(value)
                        except TypeError:
                            continue
            frame = frame.f_back
