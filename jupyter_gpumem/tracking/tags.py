"""Tags that say what an allocation is, and phase marks, recorded while a cell runs.

Hooks are installed at the start of the cell and removed at its end, whatever
happens in between:
- global module forward hooks: inputs of the root module, parameters of modules
  that appear during the cell, and the forward phase;
- ``saved_tensors_hooks``: activations saved for backward, and the backward phase;
- post-accumulate-grad hooks on the parameters of modules the cell calls: gradients
  (what the namespace's models hold is tagged from their names when recording starts);
- global optimizer step hooks: optimizer state, and the optimizer phase;
- root calls without gradients: a KV cache given back or carried out (``kv_cache``), and
  the ``prefill`` and ``decode`` phases (see :mod:`jupyter_gpumem.tracking.decoding`), each
  lasting until the next call: generate's own work on a call's logits serves that step;
- the module call each tag and allocation belongs to (see :mod:`jupyter_gpumem.tracking.scopes`).

A module compiled with ``torch.compile`` (an ``OptimizedModule``) is a call like any other,
its entry and exit seen eagerly; while it runs, our global module hooks are out of torch's
dicts (see :mod:`jupyter_gpumem.tracking.hooks_aside`), so that its compiled code is the
plain cell's.

Between detailed windows (see :mod:`jupyter_gpumem.tracking.detail`) the tagger is
paused: ``pause()`` removes every hook and ``resume()`` installs them again.

Sharded training (FSDP2 ``fully_shard``, tensor parallel) keeps parameters, gradients and
optimizer state as DTensors, whose memory is their local shard: a traceable wrapper
subclass is tagged by the plain tensors inside it (``__tensor_flatten__``), so each rank
counts its own shards. FSDP2 assigns the sharded gradients after its reduce-scatter rather
than accumulating them, so gradients are also tagged from the optimizer's parameters just
before each step. A parameter that autograd saves for backward is not an activation: the
unsharded parameters FSDP2 all-gathers for a forward stay out of "activations" (they are
freed within the step, so they count as temporary).

Known limitations:
- The module calls inside a compiled module are not told apart: what it allocates is its own.
  A compiled function that calls a module is traced with our hooks in (they do nothing but
  at the root call's entry and exit): compiled in a tracked cell, it compiles again in a
  plain cell.
- Communication buffers get no tag: the analysis tells them by who allocated them
  (torch.distributed's code). NCCL's own buffers are outside PyTorch's allocator.
- Tags are keyed by storage address and time; a storage created outside these
  hooks (e.g. a cache kept by a library) stays untagged.
- Activations saved by custom autograd Functions that bypass ``save_for_backward``
  are not seen.
- The saved-tensors hooks are pushed when recording starts and popped when it stops
  or pauses; a cell that enters its own ``saved_tensors_hooks`` context around a loop
  and leaves it while ours are on top pops ours instead.
- Saved-tensor hooks entered inside the cell (``torch.autograd.graph.save_on_cpu``) hide
  ours, the innermost winning: what they save is not tagged (the device tensors read as
  temporary) and the backward phase begins at the first gradient. The technique
  ``Config(offload=...)`` calls ours beneath its own, so its activations are seen, and its
  device copies in backward are tagged when they come back.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from jupyter_gpumem.records import NamedStorage, PhaseMark, Tag
from jupyter_gpumem.tracking.decoding import DecodeWatch
from jupyter_gpumem.tracking.dynamo_skip import run_plainly
from jupyter_gpumem.tracking.hooks_aside import GLOBAL_HOOKS_UNSEEN, HOOKS_ASIDE, HooksOut
from jupyter_gpumem.tracking.namespace import named_storages
from jupyter_gpumem.tracking.scopes import ModuleScopes


def _now_us() -> int:
    return time.time_ns() // 1000


class Tagger:
    """Collects tags and phase marks for one cell; ``start()`` then ``stop()``."""

    def __init__(self, torch: Any, user_ns: Mapping[str, Any]) -> None:
        self.torch = torch
        self.user_ns = user_ns
        # Plain tuples while the cell runs, typed when it ends: the collector untracks a tuple
        # of numbers and strings, so thousands of tags never reach an older generation.
        self._tags: list[tuple[int, str, int, int, int]] = []
        self.marks: list[PhaseMark] = []
        self._handles: list[Any] = []
        self._global: list[Any] = []  # the global module hooks' handles, also in ``_handles``
        self._saved_hooks: Any = None
        self._depth = 0
        self._step = 0
        self._phase = "other"
        self._grad_hooked: set[int] = set()
        self._seen_modules: set[int] = set()
        self.decode = DecodeWatch(torch)
        self.scopes = ModuleScopes(user_ns)
        self._recomputing = False  # the open top-level call is a checkpoint's, in backward
        # True while torch.compile traces. Traced hooks do nothing but at a compiled root
        # call's entry and exit, where they call their eager selves (one graph break each),
        # so a compiled graph never guards, nor recompiles, on our bookkeeping.
        compiler = getattr(torch, "compiler", None)
        self._compiling: Callable[[], bool] = getattr(compiler, "is_compiling", lambda: False)
        self._compiled_root: Any = None  # the root module of the compiled call running now
        # Made once dynamo is imported (the import costs about a second; a kernel that never
        # compiles never pays it); until then a traced hook does nothing at all.
        self._enter_compiled: Callable[[Any, tuple[Any, ...]], None] | None = None
        self._exit_compiled: Callable[[Any, Any, Any], None] | None = None
        self._compiled: set[int] = set()  # compiled modules seen, with our hook on their exit
        self._running_compiled: Any = None  # the compiled module whose call has our hooks out
        self._out = HooksOut()
        self._root_mark = -1  # index in ``marks`` of the running root call's mark
        self._fed_back = False  # the running root call was given back its own cache
        # modules called at the top level, by id; weak, so the tagger never keeps a model alive
        self.roots: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        # Called before a root module's forward: ("forward", module, args).
        self.on_boundary: Callable[[str, Any, Any], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return bool(self._handles)

    def start(self, named: Mapping[int, NamedStorage] | None = None) -> None:
        """Install the hooks; ``named``: the namespace's storages now, if already read."""
        self._install(named)
        self._mark("other")

    def pause(self) -> None:
        """Remove every hook until ``resume()``; tags and marks so far are kept."""
        self._remove()
        self._grad_hooked.clear()
        self._seen_modules.clear()
        self._depth = 0
        self.scopes.outside()
        self._mark("other")

    def resume(self, step: int) -> None:
        """Install the hooks again at loop step ``step``, tagging what exists now."""
        self._step = step
        self._install()
        self._mark("other")

    def enter_forward(self, module: Any, args: tuple[Any, ...]) -> None:
        """The forward pre-hook's work, for a root forward that began before ``resume()``."""
        self._forward_pre(module, args, boundary=False)

    def _install(self, named: Mapping[int, NamedStorage] | None = None) -> None:
        # What the namespace's models and optimizers hold is tagged from their names; their
        # modules are adopted (gradient hooks) when they are called, so a kernel holding
        # several models pays nothing here for the ones a cell does not use.
        now = _now_us()
        for storage in (named if named is not None else named_storages(self.user_ns)).values():
            if storage.category is not None:
                self._tags.append((storage.address, storage.category, now, storage.nbytes, -1))
        torch = self.torch
        if self._enter_compiled is None and "torch._dynamo" in sys.modules:
            self._enter_compiled = torch.compiler.disable(self._enter_compiled_root)
            self._exit_compiled = torch.compiler.disable(self._exit_compiled_root)
        run_plainly(  # see dynamo_skip
            self._forward_pre,
            self._forward_post,
            self._compiled_exit,
            self._pack,
            self._unpack,
            self._grad_done,
        )
        hooks = torch.nn.modules.module
        self._global = [
            hooks.register_module_forward_pre_hook(self._forward_pre),
            hooks.register_module_forward_hook(self._forward_post, always_call=True),
        ]
        self._handles.extend(self._global)
        GLOBAL_HOOKS_UNSEEN.add(self._handles)
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saved_hooks.__enter__()
        HOOKS_ASIDE.add(self._pack)

    def stop(self) -> tuple[tuple[Tag, ...], tuple[PhaseMark, ...]]:
        self._remove()
        self.on_boundary = None
        self._enter_compiled = self._exit_compiled = None  # they hold this tagger
        self.roots.clear()
        return tuple(map(Tag._make, self._tags)), tuple(self.marks)

    def _remove(self) -> None:
        HOOKS_ASIDE.discard(self._pack)
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
        for handle in self._handles:
            handle.remove()
        GLOBAL_HOOKS_UNSEEN.discard(self._handles)
        self._handles.clear()
        self._global.clear()
        self._out.forget()  # removed above, wherever they were
        self._running_compiled = None
        self._compiled.clear()  # their exit hooks too

    # -- hooks -------------------------------------------------------------------------
    def can_pause(self) -> bool:
        """True where pausing pops our own saved-tensors hooks (not a checkpoint's) and no
        backward is running."""
        autograd = self.torch._C._autograd
        top = getattr(autograd, "_top_saved_tensors_default_hooks", None)
        ours = top is None or top(False) == (self._pack, self._unpack)
        return ours and not in_backward(self.torch)

    def _enter_compiled_root(self, module: Any, args: tuple[Any, ...]) -> None:
        self._compiled_root = module
        self._forward_pre(module, args)

    def _exit_compiled_root(self, module: Any, args: Any, output: Any) -> None:
        self._compiled_root = None
        self._forward_post(module, args, output)

    def _forward_pre(self, module: Any, args: tuple[Any, ...], boundary: bool = True) -> None:
        if self._compiling():
            if self._depth == 0 and self._compiled_root is None and self._enter_compiled:
                self._enter_compiled(module, args)
            return
        if self._depth == 0:
            self._recomputing = in_backward(self.torch)
        if self._depth == 0 and not self._recomputing:  # not a checkpoint's recompute
            self.roots.setdefault(id(module), module)
            if boundary and self.on_boundary is not None:
                self.on_boundary("forward", module, args)
                if not self._handles:  # the boundary ended the detailed window
                    return
            self.scopes.begin_forward(module)
        if id(module) not in self._seen_modules:
            self._adopt(module)
        if self._depth == 0:
            now = _now_us()
            self._fed_back = False
            if not self.torch.is_grad_enabled():
                self._fed_back, cache = self.decode.before(module, args)
                for t in cache:
                    self._tag(t, "kv_cache", now)
            self._root_mark = len(self.marks)
            self._mark("forward")
            for value in args:
                self._tag(value, "inputs", now)
        self.scopes.enter(module, self._recomputing)
        self._depth += 1
        if id(module) in self._compiled and self._running_compiled is None:
            # Dynamo guards on the global hook dicts: while it runs, they are the plain cell's
            self._running_compiled = module
            self._out.take_out(self._global)

    def _compiled_exit(self, module: Any, args: Any, output: Any) -> None:
        """A compiled module's own forward hook: our hooks back in, then its exit as any call's."""
        if self._compiling() or module is not self._running_compiled:
            return
        self._running_compiled = None
        self._out.put_back()
        self._forward_post(module, args, output)

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if self._compiling():
            if module is self._compiled_root and self._exit_compiled:
                self._exit_compiled(module, args, output)
            return
        self._depth = max(0, self._depth - 1)
        self.scopes.leave()
        if self._depth == 0:
            if not self.torch.is_grad_enabled() and 0 <= self._root_mark < len(self.marks):
                phase, cache = self.decode.after(module, output, self._fed_back)
                now = _now_us()
                for t in cache:
                    self._tag(t, "kv_cache", now)
                if phase is not None:  # the call's mark says what it was, from its start
                    began = self.marks[self._root_mark]
                    step = self.decode.decode_steps if phase == "decode" else 0
                    self.marks[self._root_mark] = PhaseMark(began.time_us, phase, step)
                    # what follows, up to the next call (the logits' processing, the next
                    # token's sampling), belongs to the step it serves
                    self._phase = phase
                    self.marks.append(PhaseMark(_now_us(), phase, step))
                    return
            self._mark("other")

    def _pack(self, t: Any) -> Any:
        if self._compiling():
            return t
        scope = self.scopes.current
        if not isinstance(t, self.torch.nn.Parameter):
            self._tag(t, "activations", _now_us(), scope)
        # Detached: keeping a saved output itself would tie it to its own grad_fn in a cycle
        # that no collector can break when backward never runs. Autograd restores grad_fn.
        # The call that saved it goes with it: unpacking it in backward says whose backward runs.
        # The weak reference tells, on unpacking, a copy that hooks above ours brought back.
        saved = t.detach()
        return saved, scope, weakref.ref(saved)

    def _unpack(self, packed: Any) -> Any:
        if packed.__class__ is not tuple:  # packed while torch.compile traced
            return packed
        t, scope, saved = packed
        if self._compiling():
            return t
        if saved() is not t:  # offloaded and brought back: the device copy is an activation
            self._tag(t, "activations", _now_us(), scope)
        if self._phase != "backward" and self._depth == 0:
            self._mark("backward")
        self.scopes.backward_of(scope)
        return t

    def _grad_done(self, p: Any) -> None:
        if self._compiling():
            return
        if self._phase != "backward" and self._depth == 0:
            self._mark("backward")
        if p.grad is not None:
            self._tag(p.grad, "gradients", _now_us(), self.scopes.owner_of(p))

    # Optimizer hooks are global and iterated live by ``Optimizer.step``, so they cannot be
    # added or removed at a step boundary: the owner keeps one pair for the whole cell and
    # calls these while the tagger is active.
    def optimizer_step_pre(self, optimizer: Any) -> None:
        now = _now_us()
        owner_of = self.scopes.owner_of
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._tag(p.grad, "gradients", now, owner_of(p))
        self.scopes.outside()
        self._mark("optimizer")

    def optimizer_step_post(self, optimizer: Any) -> None:
        now = _now_us()
        owner_of = self.scopes.owner_of
        for p, state in optimizer.state.items():
            scope = owner_of(p)
            for value in state.values():
                self._tag(value, "optimizer_state", now, scope)
        self._step += 1
        self._mark("other")

    # -- helpers -----------------------------------------------------------------------
    def _adopt(self, module: Any) -> None:
        """Tag a module's parameters and buffers, and watch its gradients."""
        self._seen_modules.add(id(module))
        now = _now_us()
        params = list(module.parameters(recurse=False))
        owner = self.scopes.own(module, params)
        for p in params:
            self._tag(p, "parameters", now, self.scopes.owner_of(p))
            if p.requires_grad and id(p) not in self._grad_hooked:
                self._grad_hooked.add(id(p))
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_done))
        for b in module.buffers(recurse=False):
            self._tag(b, "parameters", now, owner)
        compiled = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
        if compiled is not None and isinstance(module, compiled):
            self._compiled.add(id(module))
            hook = module.register_forward_hook(self._compiled_exit, always_call=True)
            self._handles.append(hook)
        for child in module.children():
            if id(child) not in self._seen_modules:
                self._adopt(child)

    def _tag(self, value: Any, category: str, now: int, scope: int = -1) -> None:
        if not isinstance(value, self.torch.Tensor):
            return
        flatten = getattr(type(value), "__tensor_flatten__", None)
        if flatten is not None:  # DTensor and other wrappers: their memory is what they wrap
            for name in flatten(value)[0]:
                self._tag(getattr(value, name, None), category, now, scope)
            return
        try:
            storage = value.untyped_storage()
            address = storage.data_ptr()
        except (RuntimeError, NotImplementedError):
            return
        if address:
            self._tags.append((address, category, now, storage.nbytes(), scope))

    def _mark(self, phase: str) -> None:
        self._phase = phase
        self.marks.append(PhaseMark(_now_us(), phase, self._step))


def in_backward(torch: Any) -> bool:
    """True inside the autograd engine (backward hooks, checkpoint recomputation)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1
