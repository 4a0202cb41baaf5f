"""Repeated blocks of a fake step traced once and replayed: the same events, a fraction of the ops.

The blocks that checkpointing finds (:func:`~jupyter_gpumem.techniques.checkpointing.blocks`)
are grouped into kinds: same class, same parameters and buffers (names, shapes, dtypes,
strides, ``requires_grad``), same module tree and plain attributes (the layer's own number
aside), checkpointed or not. Of each kind, the first two and the last two calls of a pass run
for real; the calls between are replayed when their inputs are the second block's (shapes,
strides, dtypes, the same storages for what is not the hidden state). Where the first block's
events are its own (a LoRA model's first block is given the frozen embedding's output, which
needs no gradient), the second and third are the twins, and the calls after the third replay. A replayed call runs no
op: one autograd function writes the second block's forward events into the log, renamed
(new storages for those it made, the call's inputs for those it read), and returns outputs of
the same layout; its backward writes the second-to-last block's backward events (which run
before the replayed ones, backward running the blocks in reverse), the recompute of a
checkpointed block included, and sets the parameters' gradients as that block's were set;
where that block's input gradient was the one it was given (summed into in place, as CUDA's
engine does: :mod:`.grad_sums`), the replayed call returns the one it is given.
A checkpointed block keeps its input, and the tensors its recompute made, until the whole
backward ends (its checkpoint frame holds them): a replayed one's are freed as its twin's are.
The log therefore holds the events of the full trace, and the allocator model reads them as
it reads any run.

A block's backward window opens as the gradient of its output reaches its last op and closes
as the gradient of its input is made. Under FSDP2 what runs around a block (the gather of its
parameters before its forward and backward, the prefetch of the next block's, the
reduce-scatter of its gradients and the reshard after) runs outside both windows, through
FSDP2's own hooks, for a replayed block as for a traced one.

Every traced block's events are compared, up to renaming of storages, with those it stands
for; where they differ the run is made again with every block traced, and the estimate's
notes say which way it took.

Falls back to tracing every block where no kind has five blocks (silently: there is nothing
to replay), and says why where: too few of a kind are alike once checkpointed blocks and the
others are told apart, a block or one of its parameters has a hook (other than FSDP2's), a
global module hook is set, the step runs DDP ranks (the reducer learns that a gradient is
ready from the parameter's AccumulateGrad, which a replayed block does not run), a block's
call makes a storage that outlives it and is neither its output nor freed by its backward, a
block has more than one input or output that requires grad, or traced blocks' events differ.

Known limitations:
- What a block's forward does to Python objects it is handed (a key-value cache it
  appends to) is not done for a replayed block; a step whose later code reads that back
  (``generate``) is not replayed.
- A block that behaves differently by its layer number (``layer_idx`` and the like) is taken
  for its neighbours' twin where its first two and last two calls agree.
- One thread: the autograd engine runs the CPU's backward in the calling thread, in reverse
  order of the forward, which is what places each block's backward events.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpumem.tuner.estimation.storage_log import StorageLog

ENABLED = True  # False: every block traced (the tests' reference)
MIN_BLOCKS = 5  # two traced first, two traced last, at least one replayed between
LEADS = (0, 1)  # blocks before the first twin pair: none, or one that differs (LoRA's first)
SPLIT = "every block traced: too few blocks alike among the checkpointed ones and the others"
_NUMBERS = frozenset({"layer_idx", "layer_id", "layer_number", "block_idx", "idx"})


class ReplayFailed(Exception):
    """The replay could not stand for the full trace; the message says why."""


@dataclass
class _Call:
    """One call of one block: its windows of events, canonically named."""

    position: int  # among its kind's blocks
    forward: tuple[Any, ...] | None = None  # canonical events and tags, or None (not renameable)
    why: str = ""  # why forward is None
    inputs: tuple[Any, ...] = ()  # the flat inputs' signature
    outputs: tuple[Any, ...] = ()  # layouts of the flat outputs, canonically named
    spec: Any = None  # the outputs' tree
    names: dict[int, str] = field(default_factory=dict)  # storage -> canonical name
    born: tuple[int, ...] = ()  # sizes of the storages born in the forward window
    values: tuple[Any, ...] = ()  # the outputs' leaves that are no tensors
    grad_in: int | None = None  # the flat input that requires grad
    grad_out: int | None = None  # the flat output that requires grad
    params: tuple[Any, ...] = ()  # the block's parameters, in order
    grads_before: tuple[int | None, ...] = ()  # their gradients' storages before backward
    backward_start: int | None = None  # first event of its backward window
    backward_end: int | None = None
    backward_tags: int = 0  # first tag of its backward window
    gout: int | None = None  # storage of the gradient of its output
    backward: tuple[Any, ...] | None = None
    grad_layout: tuple[Any, ...] | None = None  # (name, layout) of the gradient of its input
    param_grads: tuple[Any, ...] = ()  # per parameter: None, "same" or (name, layout)
    replayed: bool = False
    mine: dict[str, int] = field(default_factory=dict)  # a replayed call's storages by name
    backward_names: dict[str, int] = field(default_factory=dict)  # its backward's, by name
    hold: Any = None  # a replayed call's input, kept until its backward frees it
    held: bool = False  # whether a replayed call kept its input so


@dataclass
class _Kind:
    label: str
    modules: list[Any]
    calls: dict[int, dict[int, _Call]] = field(default_factory=dict)  # call number -> position


def eligible(
    torch: Any, model: Any, config: Any, replay: bool = True
) -> tuple[list[list[Any]], str]:
    """The kinds of blocks to replay, each with at least :data:`MIN_BLOCKS` blocks; where
    there are none for a reason the user may change (hooks, ranks, the switch), why, as the
    estimate's note says it; a model with too few blocks alike says nothing."""
    found, why = _kinds(torch, model, config, replay)
    return found, "" if found or not why else f"every block traced: {why}"


def _kinds(torch: Any, model: Any, config: Any, replay: bool) -> tuple[list[list[Any]], str]:
    if not replay:
        return [], "replay switched off"
    if config.parallel not in (None, "fsdp2"):
        return [], f"parallel ranks ({config.parallel}) are traced whole"
    from torch.nn.modules import module as nn_module

    from jupyter_gpumem.techniques.checkpointing import blocks

    hooks = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
             "_global_backward_pre_hooks")  # fmt: skip
    if any(getattr(nn_module, h, None) for h in hooks):
        return [], "a global module hook is set"
    names = blocks(model)
    modules = [model.get_submodule(n) for n in names]
    for name, m in zip(names, modules, strict=True):
        why = _hooked(m)
        if why is not None:
            return [], f"{name} {why}"
    kinds: dict[Any, list[Any]] = {}
    for m in modules:
        kinds.setdefault(_structure(torch, m), []).append(m)
    found = [ms for ms in kinds.values() if len(ms) >= MIN_BLOCKS]
    return found, ""  # too few blocks alike to replay: traced, and nothing worth a note


def _hooked(module: Any) -> str | None:
    for sub_name, sub in module.named_modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                     "_backward_pre_hooks"):  # fmt: skip
            if any(not _fsdp2s(h) for h in getattr(sub, attr, {}).values()):
                return f"has a hook ({attr.strip('_')} on {sub_name or 'the block'})"
    for p_name, p in module.named_parameters():
        if getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None):
            return f"has a hook on its parameter {p_name}"
    return None


def _fsdp2s(hook: Any) -> bool:
    """Whether ``hook`` is one of FSDP2's on a block it shards. They run around the block's
    forward, outside the wrapper, so a replayed block gathers, reshards and reduces its own
    parameters as a traced one does; the windows the replay copies hold only the block's ops."""
    owner = getattr(hook, "__self__", None)  # a bound method of the block's own state
    return type(owner).__name__ == "FSDPState" and type(owner).__module__.startswith(
        "torch.distributed.fsdp"
    )


def _structure(torch: Any, module: Any) -> Any:
    """What makes two blocks the same block (checkpointing comes after: see Replayer)."""
    tree = []
    for name, sub in module.named_modules():
        plain = tuple(
            sorted(
                (k, v)
                for k, v in vars(sub).items()
                if k not in _NUMBERS and isinstance(v, (int, float, bool, str, type(None)))
            )
        )
        tree.append((name, type(sub), plain))
    params = tuple(
        (n, tuple(p.shape), p.stride(), p.dtype, p.requires_grad, str(p.device))
        for n, p in module.named_parameters()
    )
    buffers = tuple((n, tuple(b.shape), b.stride(), b.dtype) for n, b in module.named_buffers())
    return (tuple(tree), params, buffers)


class Replayer:
    """The wrappers on the blocks' forwards for one fake run; :meth:`check` and :meth:`note`
    say what it did."""

    def __init__(self, torch: Any, log: StorageLog, kinds: list[list[Any]], trains: bool) -> None:
        from jupyter_gpumem.techniques.checkpointing import is_checkpointed

        self.torch = torch
        self.log = log
        self.trains = trains  # with grad, only a step whose backward runs frees what it saved
        self.kinds: list[_Kind] = []
        for modules in kinds:
            by_state: dict[bool, list[Any]] = {}
            for m in modules:
                by_state.setdefault(is_checkpointed(m), []).append(m)
            for ckpt, ms in by_state.items():  # a checkpointed block's events are its own
                if len(ms) >= MIN_BLOCKS:
                    label = type(ms[0]).__name__ + (", checkpointed" if ckpt else "")
                    self.kinds.append(_Kind(label, ms))
        self.failed: str | None = None
        self._calls: dict[int, int] = {}  # id(module) -> calls so far
        self._starts: list[_Call] = []  # calls in the order their backward windows began
        self._fn = _replayed_function(torch)

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The wrappers on the blocks' forwards while inside (outermost: around checkpointing)."""
        patched = []
        for kind in self.kinds:
            for position, m in enumerate(kind.modules):
                previous = m.__dict__.get("forward")
                inner = previous if previous is not None else m.forward
                m.forward = functools.partial(self._call, kind, position, m, inner)
                patched.append((m, previous))
        try:
            yield
        finally:
            for m, previous in patched:
                if previous is None:
                    del m.forward
                else:
                    m.forward = previous

    # -- one call ------------------------------------------------------------------------
    def _call(
        self, kind: _Kind, position: int, module: Any, inner: Any, *args: Any, **kw: Any
    ) -> Any:
        torch = self.torch
        n = self._calls.get(id(module), 0)
        self._calls[id(module)] = n + 1
        calls = kind.calls.setdefault(n, {})
        call = _Call(position)
        calls[position] = call
        flat, _ = torch.utils._pytree.tree_flatten((args, kw))
        call.inputs = self._signature(flat)
        lead = _lead(calls)
        second = None if lead is None else calls[lead + 1]
        if (
            self.failed is None
            and second is not None
            and second.forward is not None
            and lead is not None
            and lead + 2 <= position < len(kind.modules) - 2
            and (self.trains or not torch.is_grad_enabled())
            and second.inputs == call.inputs
            and all(o is None or o[0].startswith("f") for o in second.outputs)
            and not any(
                a == "free" and not name.startswith("f") for a, name, _ in second.forward[0]
            )
        ):
            return self._replay(kind, call, second, flat)
        return self._trace(call, module, inner, flat, args, kw)

    def _signature(self, flat: Sequence[Any]) -> tuple[Any, ...]:
        torch, log = self.torch, self.log
        out: list[Any] = []
        for v in flat:
            if isinstance(v, torch.Tensor):
                # the hidden state is new each block; the rest must be the very same storages
                who = "grad" if v.requires_grad else log.index_of(v)
                out.append((tuple(v.shape), v.stride(), v.storage_offset(), v.dtype,
                            v.requires_grad, who))  # fmt: skip
            elif isinstance(v, (int, float, bool, str, type(None))):
                out.append((type(v), v))
            else:
                out.append((type(v), id(v)))
        return tuple(out)

    def _given(self, call: _Call, module: Any, flat: Sequence[Any]) -> dict[int, str]:
        """Names of the storages a call is given: its inputs, parameters and buffers."""
        torch, log = self.torch, self.log
        names: dict[int, str] = {}
        for i, v in enumerate(flat):
            if isinstance(v, torch.Tensor):
                index = log.index_of(v)
                if index is not None:
                    names.setdefault(index, f"in{i}")
        call.params = tuple(module.parameters())
        for k, t in enumerate((*call.params, *module.buffers())):
            index = log.index_of(t)
            if index is not None:
                names.setdefault(index, f"p{k}")
        return names

    def _trace(self, call: _Call, module: Any, inner: Any, flat: Any, args: Any, kw: Any) -> Any:
        torch, log = self.torch, self.log
        names = self._given(call, module, flat)
        grad_in = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor) and v.requires_grad]
        e0, t0, s0 = len(log.events), len(log.tags), len(log.sizes)
        out = inner(*args, **kw)
        e1, t1 = len(log.events), len(log.tags)
        call.born = tuple(log.sizes[s0:])
        names.update({i: f"f{j}" for j, i in enumerate(range(s0, len(log.sizes)))})
        leaves, call.spec = torch.utils._pytree.tree_flatten(out)
        outs: list[Any] = []
        values: list[Any] = []
        ok = True
        for v in leaves:
            if isinstance(v, torch.Tensor):
                index = log.index_of(v)
                outs.append((names.get(index, "?"), _layout(v), v.requires_grad))  # type: ignore[arg-type]
                values.append(None)
            else:
                outs.append(None)
                values.append(v)
                ok = ok and (
                    isinstance(v, (int, float, bool, str, type(None))) or any(v is w for w in flat)
                )
        call.outputs, call.values, call.names = tuple(outs), tuple(values), names
        call.forward, call.why = _canonical(log, e0, e1, t0, t1, names)
        wants = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor) and v.requires_grad]
        call.grad_in = grad_in[0] if len(grad_in) == 1 else None
        if len(grad_in) > 1 or len(wants) > 1:
            call.forward, call.why = None, "more than one input or output requires grad"
        elif not ok:
            call.forward, call.why = None, "it returns an object it was not given"
        if len(wants) == 1 and torch.is_grad_enabled():
            node = leaves[wants[0]].grad_fn
            if node is not None:
                node.register_prehook(functools.partial(self._backward_began, call))
            if call.grad_in is not None:
                flat[call.grad_in].register_hook(functools.partial(self._backward_ended, call))
        return out

    def _backward_began(self, call: _Call, grads: Any) -> None:
        self._begin(call, grads[0] if grads else None)

    def _backward_ended(self, call: _Call, grad: Any) -> None:
        """The gradient of ``call``'s input is made: its window ends before what runs on it
        next (FSDP2's reduce-scatter and reshard of the block, then the next block's gather)."""
        if self._starts and self._starts[-1] is call and call.backward_end is None:
            self._close(call, grad)

    def _begin(self, call: _Call, grad: Any) -> None:
        """``call``'s backward window begins, with ``grad`` the gradient of its output; the
        window before it ends."""
        log = self.log
        if self._starts and self._starts[-1].backward_end is None:
            self._close(self._starts[-1], grad)
        call.backward_start, call.backward_tags = len(log.events), len(log.tags)
        call.grads_before = tuple(
            None if p.grad is None else log.index_of(p.grad) for p in call.params
        )
        call.gout = None if grad is None else log.index_of(grad)
        self._starts.append(call)

    def _close(self, call: _Call, grad_in: Any) -> None:
        """``call``'s backward window is over (the next block's begins, given ``grad_in``)."""
        log = self.log
        call.backward_end = len(log.events)
        if call.replayed or call.forward is None or call.backward_start is None:
            return
        names = dict(call.names)
        if call.gout is not None:
            names[call.gout] = "gout"
        for k, g in enumerate(call.grads_before):
            if g is not None:
                names[g] = f"pg{k}"
        window = log.events[call.backward_start : call.backward_end]
        new = [i for a, i, _ in window if a == "alloc" and i not in names]
        names.update({i: f"b{j}" for j, i in enumerate(new)})
        call.backward_names = {name: i for i, name in names.items()}
        found, _ = _canonical(
            log, call.backward_start, call.backward_end, call.backward_tags, len(log.tags), names
        )
        if found is None:
            return
        call.backward = found
        if grad_in is not None:
            call.grad_layout = (names.get(log.index_of(grad_in), "?"), _layout(grad_in))  # type: ignore[arg-type]
        grads: list[Any] = []
        for p, before in zip(call.params, call.grads_before, strict=True):
            now = None if p.grad is None else log.index_of(p.grad)
            if now is None:
                grads.append(None)
            elif now == before:
                grads.append("same")
            else:
                grads.append((names.get(now, "?"), _layout(p.grad)))
        call.param_grads = tuple(grads)

    # -- a replayed call -----------------------------------------------------------------
    def _replay(self, kind: _Kind, call: _Call, template: _Call, flat: Any) -> Any:
        torch = self.torch
        call.replayed = True
        module = kind.modules[call.position]
        call.names = self._given(call, module, flat)
        call.forward, call.outputs = template.forward, template.outputs
        x = None if template.grad_in is None else flat[template.grad_in]
        if x is not None:
            # the second block's input outlived its call (saved for backward): this one's does
            given = next(i for i, name in template.names.items() if name == f"in{template.grad_in}")
            call.hold = x if given in self.log.live().values() else None
            call.held = call.hold is not None
        anchor = next((p for p in call.params if p.requires_grad), None)
        inputs = [t for t in (x, anchor) if t is not None]
        if torch.is_grad_enabled() and inputs:
            outs = self._fn.apply(self, kind, call, template, flat, *inputs)
        else:
            outs = self._forward(call, template, flat)
        it = iter(outs)
        leaves = [
            v if o is None else next(it)
            for o, v in zip(template.outputs, template.values, strict=True)
        ]
        return torch.utils._pytree.tree_unflatten(leaves, template.spec)

    def _forward(self, call: _Call, template: _Call, flat: Any) -> tuple[Any, ...]:
        """The template's forward events written for ``call``; its outputs, made anew."""
        torch, log = self.torch, self.log
        assert template.forward is not None
        events, tags = template.forward
        mine = {name: i for i, name in call.names.items()}
        kept = {o[0] for o in template.outputs if o is not None}
        whole = _whole([o[:2] for o in template.outputs if o is not None])
        made: dict[str, Any] = {}
        for j, size in enumerate(template.born):  # storages with no event (empty ones)
            if not size:
                mine[f"f{j}"] = log.virtual_alloc(0)
        for action, name, size in events:
            if action == "alloc":
                mine[name] = self._alloc(name, size, kept, made, whole)
            else:
                log.early_free(mine[name])
        log.tags.extend((mine[name], category) for name, category in tags)
        call.mine = mine
        # what outlives the call and is no output goes with the second block's (see check)
        theirs = {name: i for i, name in template.names.items()}
        for name in _carried(events) - kept:
            log.then_free.setdefault(theirs[name], []).append(mine[name])
        return tuple(_view(torch, made[o[0]], o[1]) for o in template.outputs if o is not None)

    def _alloc(
        self, name: str, size: int, kept: set[str], made: dict[str, Any], whole: dict[str, Any]
    ) -> int:
        """A storage of the template made for the call: a tensor's where it outlives the
        window as an output or gradient, else one no tensor holds. One tensor that is all of
        its storage is made as it is, not as a view of it (FSDP2 warns of a block that
        returns a view: an in-place op on it would lose FSDP2's pre-backward hook)."""
        torch, log = self.torch, self.log
        if name not in kept:
            return log.virtual_alloc(size)
        layout = whole.get(name)
        if layout is not None and _spans(layout) == size:
            shape, stride, _, dtype = layout
            made[name] = torch.empty_strided(shape, stride, dtype=dtype, device=log.device)
        else:
            made[name] = torch.empty(size, dtype=torch.uint8, device=log.device)
        index = log.index_of(made[name])
        if index is None:
            raise ReplayFailed("a replayed storage is not followed by the log")
        return index

    def _backward(self, call: _Call, template: _Call, grad: Any) -> Any:
        """The template's backward events written for ``call``; the gradient of its input."""
        torch, log = self.torch, self.log
        if template.backward is None:
            raise ReplayFailed(f"block {template.position + 1}'s backward cannot be renamed")
        mine = dict(call.mine)
        if grad is not None and call.gout is not None:
            mine["gout"] = call.gout
        for k, g in enumerate(call.grads_before):
            if g is not None:
                mine[f"pg{k}"] = g
        kept = _gradients(template)
        made: dict[str, Any] = {}
        events, tags = template.backward
        whole = _whole(
            [template.grad_layout] + [pg for pg in template.param_grads if pg not in (None, "same")]
        )
        for action, name, size in events:
            if action == "alloc":
                mine[name] = self._alloc(name, size, kept, made, whole)
            elif name.startswith(("f", "b", "gout", "pg")) or (
                name == f"in{template.grad_in}" and call.hold is not None
            ):
                log.early_free(mine[name])
            else:
                raise ReplayFailed(f"block {template.position + 1}'s backward frees {name}")
        log.tags.extend((mine[name], category) for name, category in tags)
        call.backward_names = mine
        # what outlives the backward window (a checkpointed block's recomputed tensors, which
        # its frame keeps until the whole backward ends) goes with the template's
        for name in _carried(events) - kept:
            log.then_free.setdefault(template.backward_names[name], []).append(mine[name])
        call.hold = None
        with torch.no_grad():
            for p, pg in zip(call.params, template.param_grads, strict=True):
                if pg is not None and pg != "same":
                    p.grad = _view(torch, made[pg[0]], pg[1])
        if template.grad_layout is None:
            return None
        name, layout = template.grad_layout
        if name in made:
            return _view(torch, made[name], layout)
        if name == "gout" and grad is not None and layout == _layout(grad):
            return grad  # the gradient of its input was summed in place into the one it was given
        raise ReplayFailed(f"block {template.position + 1}'s input gradient is {name}")

    def _free_with_twin(self, calls: dict[int, _Call], x: Any) -> None:
        """A replayed call's input, which outlives its backward, freed as the second traced
        block's input is (a checkpointed block's input lives until the whole backward ends)."""
        lead = _lead(calls)
        assert lead is not None  # a call was replayed from it
        second = calls[lead + 1]
        theirs = next(i for i, name in second.names.items() if name == f"in{second.grad_in}")
        mine = self.log.index_of(x)
        if mine is not None:
            self.log.then_free.setdefault(theirs, []).append(mine)

    # -- the result ----------------------------------------------------------------------
    def check(self) -> None:
        """Raises ReplayFailed where a traced block's events differ from those replayed."""
        if self.failed is not None:
            raise ReplayFailed(self.failed)
        for kind in self.kinds:
            last = len(kind.modules) - 2
            for calls in kind.calls.values():
                if not any(c.replayed for c in calls.values()):
                    continue
                lead = _lead(calls)
                assert lead is not None  # a call was replayed from it
                second = calls[lead + 1]
                for position in (lead, last, last + 1):
                    c = calls.get(position)
                    if c is None or (c.forward, c.outputs) != (second.forward, second.outputs):
                        why = f": {c.why}" if c is not None and c.why else ""
                        raise ReplayFailed(
                            f"the forward of block {position + 1} ({kind.label}) differs from "
                            f"block {lead + 2}'s{why}"
                        )
                self._check_outlived(kind, calls)
                ref = calls[last]
                if ref.backward_start is None:
                    continue
                for position in (lead + 1, last + 1):
                    c = calls[position]
                    if (c.backward, c.param_grads) != (ref.backward, ref.param_grads):
                        raise ReplayFailed(
                            f"the backward of block {position + 1} ({kind.label}) differs "
                            f"from block {last + 1}'s"
                        )

    def _check_outlived(self, kind: _Kind, calls: dict[int, _Call]) -> None:
        """What outlives a replayed call (past its backward) was freed with the traced blocks'
        twins, in one run of frees: there their order changes no figure."""
        log = self.log
        freed_at = {i: n for n, (a, i, _) in enumerate(log.events) if a == "free"}
        allocs = [n for n, (a, _, _) in enumerate(log.events) if a == "alloc"]
        lead = _lead(calls)
        assert lead is not None
        second, last = calls[lead + 1], calls[len(kind.modules) - 2]
        assert second.forward is not None
        freed_back = set()
        if last.backward is not None:
            freed_back = {name for a, name, _ in last.backward[0] if a == "free"}
        names = _carried(second.forward[0]) - {o[0] for o in second.outputs if o} - freed_back
        replayed = [c for c in calls.values() if c.replayed]
        given = f"in{second.grad_in}"
        if second.grad_in is not None and given not in freed_back:
            # Held for backward, unless the caller freed it as the call returned, before the
            # next call began (a LoRA block's input: its frozen layers keep none of it): then
            # no replayed call held its own, and each was freed as it returned, likewise.
            held = next(i for i, n in second.names.items() if n == given)
            began = min(
                (c.backward_start for c in calls.values() if c.backward_start is not None),
                default=len(log.events),
            )
            if any(c.held for c in replayed) or not 0 <= freed_at.get(held, -1) < began:
                names.add(given)
        ends_of: list[list[int]] = []
        for name in names:
            ends = []
            for c in (second, last, *replayed):
                if not c.replayed:
                    index = next((i for i, n in c.names.items() if n == name), None)
                else:
                    index = c.mine.get(name)
                ends.append(freed_at.get(index, -1) if index is not None else -1)
            ends_of.append(ends)
        if last.backward is not None:
            for name in _carried(last.backward[0]) - _gradients(last):
                got = [c.backward_names.get(name) for c in (second, last, *replayed)]
                ends_of.append([-1 if i is None else freed_at.get(i, -1) for i in got])
        for ends in ends_of:
            if min(ends) < 0 and max(ends) >= 0:
                raise ReplayFailed(f"{kind.label}: a storage that outlives a block is freed "
                                   "for some blocks and not others")  # fmt: skip
            lo, hi = min(ends), max(ends)
            if lo >= 0 and any(lo < n < hi for n in allocs[_first_after(allocs, lo) :][:1]):
                raise ReplayFailed(f"{kind.label}: storages that outlive their blocks are freed "
                                   "at different times")  # fmt: skip

    def note(self) -> str:
        """Which blocks were replayed from which."""
        parts = []
        for kind in self.kinds:
            replayed = sorted(
                {c.position for cs in kind.calls.values() for c in cs.values() if c.replayed}
            )
            n = len(kind.modules)
            if not replayed:
                parts.append(
                    f"every block traced: no {kind.label} block matched block 2 or block 3"
                )
                continue
            lead = min(_lead(cs) or 0 for cs in kind.calls.values())
            parts.append(
                f"blocks {_ranges(replayed)} of {n} ({kind.label}) replayed from block "
                f"{lead + 2} (backward from block {n - 1})"
            )
        return "; ".join(parts)


def _lead(calls: dict[int, _Call]) -> int | None:
    """Where a pass's twin blocks begin: 0 where its first two blocks are alike, 1 where only
    its second and third are (the first block of a LoRA model is given an input that needs no
    gradient); None where neither pair is traced yet or alike."""
    for lead in LEADS:
        a, b = calls.get(lead), calls.get(lead + 1)
        if (
            a is not None
            and b is not None
            and b.forward is not None
            and (a.forward, a.outputs) == (b.forward, b.outputs)
        ):
            return lead
    return None


def _gradients(call: _Call) -> set[str]:
    """Names of the gradients a call's backward makes (its input's, its parameters')."""
    kept = set()
    if call.grad_layout is not None:
        kept.add(call.grad_layout[0])
    for pg in call.param_grads:
        if pg is not None and pg != "same":
            kept.add(pg[0])
    return kept


def _whole(named: Sequence[Any]) -> dict[str, Any]:
    """Of (name, layout) pairs, the layout of each name given only one, at the start of its
    storage: the tensor to make as it is where it spans the whole storage (:func:`_spans`)."""
    layouts: dict[str, list[Any]] = {}
    for pair in named:
        if pair is not None:
            layouts.setdefault(pair[0], []).append(pair[1])
    return {n: ls[0] for n, ls in layouts.items() if len(ls) == 1 and ls[0][2] == 0}


def _spans(layout: tuple[Any, ...]) -> int:
    """The bytes of the storage ``torch.empty_strided`` makes for ``layout``."""
    shape, stride, _, dtype = layout
    if any(n == 0 for n in shape):
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(shape, stride, strict=True))) * dtype.itemsize


def _first_after(sorted_positions: list[int], at: int) -> int:
    import bisect

    return bisect.bisect_right(sorted_positions, at)


def _carried(events: Sequence[Any]) -> set[str]:
    """Names a window allocates and does not free."""
    alive: set[str] = set()
    for action, name, _ in events:
        (alive.add if action == "alloc" else alive.discard)(name)
    return {n for n in alive if n.startswith(("f", "b"))}


def _ranges(positions: list[int]) -> str:
    out = []
    for _, group in itertools.groupby(enumerate(positions), lambda e: e[1] - e[0]):
        g = [p + 1 for _, p in group]
        out.append(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]))
    return ", ".join(out)


def _layout(t: Any) -> tuple[Any, ...]:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)


def _view(torch: Any, base: Any, layout: tuple[Any, ...]) -> Any:
    if _layout(base) == layout:
        return base
    shape, stride, offset, dtype = layout
    return base.view(dtype).as_strided(shape, stride, offset)


def _input_of(flat: Any, name: str) -> Any:
    if not name.startswith("in"):
        raise ReplayFailed(f"an output of the block is {name}, neither new nor an input")
    return flat[int(name[2:])].untyped_storage()


def _canonical(
    log: StorageLog, e0: int, e1: int, t0: int, t1: int, names: dict[int, str]
) -> tuple[tuple[Any, ...] | None, str]:
    """A window's events and tags with storages named by role; None where one has none."""
    events = []
    for action, i, _ in log.events[e0:e1]:
        name = names.get(i)
        if name is None:
            return None, "it frees a storage it was not given"
        events.append((action, name, log.sizes[i]))
    events = _frees_sorted(events)
    tags = []
    for i, category in log.tags[t0:t1]:
        name = names.get(i)
        if name is None:
            return None, "it tags a storage it was not given"
        tags.append((name, category))
    return (tuple(events), tuple(tags)), ""


def _frees_sorted(events: list[Any]) -> list[Any]:
    """``events`` with each run of frees in order of name: between two allocations the order
    of frees changes no figure (the free blocks coalesce the same), and some runs' order is
    not the same from block to block (the tensors a checkpoint frame recomputed)."""
    out: list[Any] = []
    run: list[Any] = []
    for e in events:
        if e[0] == "free":
            run.append(e)
            continue
        out.extend(sorted(run))
        run = []
        out.append(e)
    out.extend(sorted(run))
    return out


@functools.cache
def _replayed_function(torch: Any) -> Any:
    class _Replayed(torch.autograd.Function):
        """A replayed block: its events written, its outputs and gradients made, no op run."""

        @staticmethod
        def forward(ctx: Any, replayer: Replayer, kind: _Kind, call: _Call, template: _Call,
                    flat: Any, *inputs: Any) -> Any:  # fmt: skip
            ctx.set_materialize_grads(False)
            outs = replayer._forward(call, template, flat)
            ctx.state = (replayer, kind, call, len(inputs), template.grad_in is not None)
            ctx.x = call.hold  # alive as long as the real block would keep it (see check)
            wants = [o for o in template.outputs if o is not None]
            for o, meta in zip(outs, wants, strict=True):
                if not meta[2]:
                    ctx.mark_non_differentiable(o)
            return outs

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            replayer, kind, call, count, has_x = ctx.state
            n = next(k for k, cs in kind.calls.items() if cs.get(call.position) is call)
            template = kind.calls[n][len(kind.modules) - 2]
            grad = next((g for g in grads if g is not None), None)
            replayer._begin(call, grad)
            try:
                got = replayer._backward(call, template, grad)
            except ReplayFailed as exc:
                replayer.failed = str(exc)
                raise
            if ctx.x is not None:
                if (f"in{template.grad_in}", "free") in {
                    (name, a) for a, name, _ in template.backward[0]
                }:
                    ctx.x = None
                else:  # it outlives backward (a checkpointed block's): it dies with its twin's
                    replayer._free_with_twin(kind.calls[n], ctx.x)
            out: list[Any] = [None] * (5 + count)
            if has_x:
                out[5] = got
            return tuple(out)

    return _Replayed
