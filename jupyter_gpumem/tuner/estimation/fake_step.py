"""A trial's training steps run on fake tensors: what they allocate and free, and what each storage is.

Fake tensors (``torch._subclasses.FakeTensorMode``) carry shapes, dtypes, strides and devices but
no data, so a step of any size runs in host memory in a fraction of a second. The user's model
runs as it is: for the duration of the run its parameters and buffers are replaced, in the module
objects themselves, by fake tensors of the same layout, and a shallow copy of the optimizer
steps them (:mod:`~jupyter_gpumem.tuner.estimation.fake_objects`). The configuration
is applied with the same :func:`~jupyter_gpumem.techniques.apply_config` as a trial, and the step
is the trial's: forward under ``autocast()``, ``backward()``, ``step()`` with the loss alive
until the step ends.

A dispatch mode above the fake mode sees every ATen op the step calls, as the CUDA allocator or
our CPU source would: an output storage that no input shares is an allocation, and a weakref on
the storage says when it is freed. Tags come from the same places as a measured cell's: the
model's parameters and buffers, the batch (``inputs``), ``saved_tensors_hooks``
(``activations``, and their device copies brought back in backward where they were offloaded:
the host copies are another device's, which the log leaves out), the gradients after backward and the optimizer state after the step.

Afterwards the model, its modules' attributes, the optimizer and the random generators (torch,
CUDA, Python, NumPy) are as they were.

Known limitations:
- Memory a kernel allocates for itself without an op is not seen, except where a module
  models it (:mod:`.reduce_buffers`: reductions' staging buffers; :mod:`.kernel_temporaries`:
  ATen ops inside kernels; :mod:`.stand_ins`: grouped GEMMs'; :mod:`.workspace_probes`:
  cuDNN's and the attention kernels', probed on the GPU); cuBLAS's the estimate measures once
  per device.
- Steps that read values (``.item()``, ``bool(t)``, fp16 loss scaling's overflow check), ops
  whose output shape depends on values (``nonzero``), custom ops without a fake kernel and
  ``torch.compile``d modules cannot run; :class:`Unfakeable` says which, and the line that
  reads. Reads known without data (a mask of ones, :mod:`.known_values`) are answered.
- See :mod:`~jupyter_gpumem.tuner.estimation.fake_objects` for what is put back and how.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.records import PhaseMark
from jupyter_gpumem.tracking import storage_resizes
from jupyter_gpumem.tracking.composites import is_composite, run_as_parts
from jupyter_gpumem.tracking.dispatch import plain_tensors
from jupyter_gpumem.tracking.namespace import walk
from jupyter_gpumem.tuner.estimation import (
    block_replay,
    kernel_temporaries,
    reduce_buffers,
    workspace_probes,
)
from jupyter_gpumem.tuner.estimation.cuda_attention import whole_op_kernel
from jupyter_gpumem.tuner.estimation.cuda_like import multiprocessors
from jupyter_gpumem.tuner.estimation.fake_objects import (
    Faker,
    fake_batch,
    fake_copy,
    fake_optimizer,
    foreach_as_real,
    foreach_on,
    swapped,
)
from jupyter_gpumem.tuner.estimation.foreach_groups import grouped
from jupyter_gpumem.tuner.estimation.grad_sums import GradSums
from jupyter_gpumem.tuner.estimation.kernel_checks import RealStepError, check_operands
from jupyter_gpumem.tuner.estimation.known_values import known_values
from jupyter_gpumem.tuner.estimation.output_order import in_cuda_order
from jupyter_gpumem.tuner.estimation.quantized import (
    hidden_buffers,
    maps_made_for_real,
    paged_state,
    ready_to_step,
)
from jupyter_gpumem.tuner.estimation.stand_ins import kernel_buffers, stand_in
from jupyter_gpumem.tuner.estimation.storage_log import StorageLog, tensors_in
from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable, raised_at
from jupyter_gpumem.tuner.estimation.untraced import untraced
from jupyter_gpumem.tuner.rng import rng_kept


@dataclass(frozen=True)
class FakeRun:
    """What the fake steps did to one device's memory; storages are numbered in order of birth."""

    device: str
    sizes: tuple[int, ...]  # bytes of storage i
    real: Mapping[int, int]  # storage i stands for the real storage at this address (same device)
    existing: tuple[int, ...]  # storages alive before the run: the model's, the trial's batch
    events: tuple[tuple[str, int, int], ...]  # ("alloc" or "free", storage, clock)
    window: int  # index of the first event of the measured steps
    window_clock: int
    live_at_window: tuple[int, ...]  # storages alive when the measured steps began
    reachable: frozenset[int]  # of those, the ones the model, optimizer and batch hold
    tags: tuple[tuple[int, str], ...]  # (storage, category), possibly several per storage
    marks: tuple[PhaseMark, ...]  # phase marks on the clock of the events
    # storage -> the frame of torch.distributed's code that allocated it (parallel runs)
    communication: Mapping[int, tuple[dict[str, Any], ...]] = dataclasses.field(
        default_factory=dict
    )
    # existing storage -> how loading made it and its siblings (StorageLog.loaded)
    loading: Mapping[int, tuple[tuple[str, int], ...]] = dataclasses.field(default_factory=dict)
    left_out_bytes: int = 0  # storages outside PyTorch's allocator, not in the events
    checks: tuple[str, ...] = ()  # the step's checks taken to pass (known_values), as notes
    blocks: str = ""  # how the repeated blocks were run (block_replay), as a note
    kernels: tuple[str, ...] = ()  # where the kernels' own memory came from, as notes
    measured_steps: int = 1  # the steps the measured one stands for (repeated_steps)
    pooled: frozenset[int] = frozenset()  # storages made in a CUDA graph's private pool
    emptied: tuple[int, ...] = ()  # clocks at which the default pool's cache was emptied
    cleared: tuple[int, ...] = ()  # clocks at which torch freed every cuBLAS workspace


@functools.cache
def recording_mode() -> type:
    """The dispatch mode class, defined on first use so that importing needs no torch."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type

    # asked of a tensor, never allocating: its device (from C++), a value read to the host
    answers = (torch.ops.prim.device.default, torch.ops.aten._local_scalar_dense.default)

    class _Recording(TorchDispatchMode):
        def __init__(self, log: StorageLog, sums: GradSums | None = None) -> None:
            super().__init__()
            self.log = log
            self.probed = workspace_probes.Tally()
            self.sums = sums  # the backward's gradient sums, to make in place as on the GPU

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Mapping[str, Any] | None = None
        ) -> Any:
            if func in answers:
                return func(*args, **(kwargs or {}))
            if any(is_traceable_wrapper_subclass_type(t) for t in types):
                # a DTensor runs first and comes back here with the plain ops it desugars into
                return NotImplemented
            whole = whole_op_kernel(torch, func, args)
            if whole is not None:  # the stand-in device's own kernel, its parts through here
                with self:
                    out = whole(*args, **(kwargs or {}))
                return out
            if is_composite(torch, func):  # under inference_mode: its parts allocate
                out = run_as_parts(self, func, args, kwargs)
                if out is not NotImplemented:
                    return out
            check_operands(torch, func, args)
            hidden = hidden_buffers(torch, func, args, kwargs or {})
            hidden += kernel_buffers(torch, func, args, kwargs)
            for buffer in hidden:  # what the op allocates for itself, alive until it returns
                self.log.record(buffer, (), {})
            out = (stand_in(torch, func) or grouped(torch, func) or func)(*args, **(kwargs or {}))
            # a convolution's or attention's outputs and workspaces as the GPU allocated them
            log = self.log
            if not workspace_probes.recorded(
                torch, func, args, kwargs, out, log.record, self.probed
            ):
                log.record(in_cuda_order(torch, func, args, out), args, kwargs)
            if self.sums is not None and self.sums.is_sum(func, args, kwargs):
                log.summed(out, args[0])
            staging = [  # after the output
                *reduce_buffers.buffers(torch, func, args, kwargs),
                *kernel_temporaries.temporaries(torch, func, args, kwargs),
            ]
            for buffer in staging:  # freed as the kernel returns
                self.log.record(buffer, (), {})
            return out

    return _Recording


# -- the run -------------------------------------------------------------------------------
def run_fake(
    model: Any,
    optimizer: Any,
    loss_fn: Callable[[Any, Any], Any],
    device: Any,
    config: Any,
    *,
    batch: Any = None,
    make_batch: Callable[[], Any] | None = None,
    warmup: int = 1,
    steps: int = 1,
    inference: bool = False,
    primed: bool = False,
    measured_steps: int = 1,
) -> FakeRun:
    """Apply ``config`` and run ``warmup`` then ``steps`` training steps on fake tensors
    (forward passes alone for an ``inference`` workload). The last step stands for
    ``measured_steps`` in a row (:mod:`.repeated_steps`): the steps the trial measures.

    ``primed`` warm-up steps make only what outlives a step, the optimizer's state, by a step
    over zero gradients: the measured steps' allocated bytes are the same, at about half the
    cost, and the allocator starts them from a colder cache (reserved bytes are less exact).
    A search's anchors take it; a configuration's own estimate never does.

    The batch is ``batch`` (real tensors, taken to be alive already) or what ``make_batch()``
    returns when called under the fake mode (allocated at the start of the run).
    Raises :class:`Unfakeable` when the step cannot run on fake tensors.

    Repeated blocks are replayed (:mod:`.block_replay`) where that stands for tracing them;
    where it cannot, or anything goes wrong while replaying, the run is made again with every
    block traced. ``FakeRun.blocks`` says which way it went.
    """
    run = functools.partial(
        _run_fake, model, optimizer, loss_fn, device, config, batch=batch,
        make_batch=make_batch, warmup=warmup, steps=steps, inference=inference, primed=primed,
    )  # fmt: skip
    if not block_replay.ENABLED:
        found = run(replay=False)
    else:
        try:
            found = run(replay=True)
        except (block_replay.ReplayFailed, _ReplayBroke) as exc:
            found = run(replay=False)
            found = dataclasses.replace(found, blocks=f"every block traced: {exc}")
    return dataclasses.replace(found, measured_steps=measured_steps)


class _ReplayBroke(Exception):
    """The step failed while blocks were replayed: the full trace says whether it fails."""


def _run_fake(
    model: Any,
    optimizer: Any,
    loss_fn: Callable[[Any, Any], Any],
    device: Any,
    config: Any,
    *,
    batch: Any,
    make_batch: Callable[[], Any] | None,
    warmup: int,
    steps: int,
    inference: bool,
    primed: bool,
    replay: bool,
) -> FakeRun:
    """:func:`run_fake`, with repeated blocks replayed or every block traced."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jupyter_gpumem.techniques import apply_config
    from jupyter_gpumem.techniques.parallel import FakeReducer

    compiled = _compiled(torch, model)
    if compiled:
        raise Unfakeable(
            f"module {compiled!r} is compiled with torch.compile, whose generated kernels fake "
            "tensors cannot run; estimate the uncompiled model (the memory is close) or measure"
        )
    workspace_probes.warm(torch, device)  # its process starts while the step is traced
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    log = StorageLog(torch, device, mode)
    parallel = config.parallel is not None
    # A rank is a process of its own: it holds copies of the model on its device, which
    # its strategy changes for good, so it runs a copy, never the model itself.
    faker = Faker(torch, log, device if parallel else None, meta_to=device)
    if parallel:
        log.communication = {}
    real_params = {id(p): p for p in model.parameters()}
    weights_on = _weights_device(model)
    with rng_kept(torch), mode, (fake_copy if parallel else swapped)(torch, model, faker) as run:
        model = model if run is None else run
        fake_opt = None if optimizer is None else fake_optimizer(torch, optimizer, faker)
        real_of = {
            id(faker.by_id[i]): p
            for i, p in real_params.items()
            if i in faker.by_id and not p.is_meta  # meta ones: the run's device decides
        }
        run_batch = (
            None
            if make_batch is not None
            else fake_batch(torch, batch, faker, weights_on=weights_on)
        )
        faker.done()
        # sums in place where the step is measured against CUDA's allocator; on the CPU the
        # tracker's own dispatch mode makes the engine sum out of place, as fakes do
        sums = GradSums(torch) if multiprocessors(torch, device) is not None else None
        recording = recording_mode()(log, sums)
        applied = None
        replayer = None
        why = ""
        storage_resizes.listen(torch, log.resized)
        try:
            with (
                recording,
                known_values(strict=True) as known,
                untraced(lambda: _storages(torch, run_batch), ones=known.all_ones),
            ):
                log.recording = True
                if make_batch is not None:
                    run_batch = fake_batch(torch, make_batch(), faker, weights_on=weights_on)
                    faker.done()
                with maps_made_for_real(config.optimizer):
                    applied = apply_config(model, config, fake_opt)
                if applied.optimizer is not fake_opt:  # one the configuration built
                    ready_to_step(applied.optimizer)
                reducer = getattr(applied.model, "reducer", None)
                if isinstance(reducer, FakeReducer):
                    reducer.on_rebuild = log.remake_communication
                if applied.optimizer is not None and (parallel or not real_of):
                    foreach_on(torch, applied.optimizer, device)
                elif applied.optimizer is not None:
                    foreach_as_real(torch, applied.optimizer, real_of)
                step = _forward if inference else functools.partial(_step, sums=sums)
                warm = _primed if primed and not inference else step
                kinds, why = block_replay.eligible(torch, applied.model, config, replay)
                replayer = None
                if kinds:
                    replayer = block_replay.Replayer(torch, log, kinds, trains=not inference)
                    if not replayer.kinds:
                        replayer, why = None, block_replay.SPLIT
                with replayer.installed() if replayer is not None else contextlib.nullcontext():
                    window = _steps(
                        torch, applied, (warm, step), loss_fn, run_batch, log, warmup, steps
                    )
                if replayer is not None:
                    replayer.check()
                    why = replayer.note()
                for buffer in paged_state(applied.optimizer):
                    log.leave_out(buffer)
                log.recording = False
        except block_replay.ReplayFailed:
            raise
        except Exception as exc:
            if replayer is not None:
                raise _ReplayBroke(
                    f"the step failed with blocks replayed ({type(exc).__name__}: {exc})"
                ) from exc
            if isinstance(exc, Unfakeable):
                raise
            raise Unfakeable(reason(exc)) from exc
        finally:
            log.recording = False
            storage_resizes.unlisten(torch, log.resized)
            if applied is not None:
                applied.revert()
    found = run_of(log, device, window)
    kernels = tuple(filter(None, [recording.probed.note()]))
    return dataclasses.replace(found, checks=tuple(known.checks), blocks=why, kernels=kernels)


def run_of(
    log: StorageLog, device: Any, window: tuple[int, int, tuple[int, ...], frozenset[int]]
) -> FakeRun:
    """What ``log`` recorded, measured from ``window``: (first event, its clock, the storages
    alive then, those of them the model, optimizer and batch hold). Storages the log left out
    (outside PyTorch's allocator) are in none of them."""
    out = log.left_out
    first, clock, live, reachable = window
    events = log.events
    if out:  # a paged optimizer's state: drop it everywhere, and count the window anew
        first -= sum(1 for e in events[:first] if e[1] in out)
        events = [e for e in events if e[1] not in out]
    return FakeRun(
        device=str(device),
        sizes=tuple(log.sizes),
        real=dict(log.real),
        existing=tuple(i for i in log.existing if i not in out),
        events=tuple(events),
        window=first,
        window_clock=clock,
        live_at_window=tuple(i for i in live if i not in out),
        reachable=frozenset(reachable - out),
        tags=tuple(log.tags),
        marks=tuple(log.marks),
        communication=dict(log.communication or {}),
        loading=dict(log.loading),
        left_out_bytes=sum(log.sizes[i] for i in out),
        pooled=frozenset(log.pooled - out),
        emptied=tuple(log.emptied),
        cleared=tuple(log.cleared),
    )


def _steps(
    torch: Any,
    applied: Any,
    warm_and_step: tuple[Callable[..., None], Callable[..., None]],
    loss_fn: Any,
    batch: Any,
    log: StorageLog,
    warmup: int,
    steps: int,
) -> tuple[int, int, tuple[int, ...], frozenset[int]]:
    """``warmup`` warm-up steps then ``steps`` steps; what the log held when the measured ones
    began."""
    warm, step = warm_and_step
    window: tuple[int, int, tuple[int, ...], frozenset[int]] = (0, 0, (), frozenset())
    for i in range(warmup + steps):
        if i == warmup:
            # what the model holds now (a cast made new storages), as the tagger tags it
            for t in (*applied.model.parameters(), *applied.model.buffers()):
                log.tag(t, "parameters")
            for t in tensors_in([batch], torch.Tensor, []):
                log.tag(t, "inputs")
            live = log.live()
            held = {"model": applied.model, "optimizer": applied.optimizer, "batch": batch}
            keys = set()
            for t in (plain for held_t, _, _ in walk(held) for plain in plain_tensors(held_t)):
                try:
                    keys.add(t.untyped_storage()._cdata)
                except (RuntimeError, NotImplementedError):
                    continue
            reachable = frozenset(live[k] for k in keys if k in live)
            window = (len(log.events), log.clock, tuple(sorted(live.values())), reachable)
        log.step = i
        (warm if i < warmup else step)(torch, applied, loss_fn, batch, log)
    return window


def _primed(torch: Any, applied: Any, loss_fn: Any, batch: Any, log: StorageLog) -> None:
    """What a warm-up step leaves behind, alone: the optimizer's state, made by its step over
    zero gradients (freed again, as the step's ``zero_grad`` frees real ones)."""
    optimizer = applied.optimizer
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    applied.step()


STEADY_MICRO_BATCHES = 2  # micro-batches a fake step runs: the later ones repeat the second


def _saved_tagged(torch: Any, log: StorageLog) -> Any:
    """Hooks that tag what autograd saves for backward as activations."""

    def pack(t: Any) -> Any:
        log.tag(t, "activations")
        # detached, as the recorder's tagger keeps it: a saved output kept itself would tie
        # it to its own grad_fn in a cycle that outlives a forward with no backward
        saved = t.detach()
        return saved, weakref.ref(saved)

    def unpack(packed: Any) -> Any:
        t, saved = packed
        if saved() is not t:  # offloaded and brought back, as the recorder's tagger tags it
            log.tag(t, "activations")
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def _forward(torch: Any, applied: Any, loss_fn: Any, batch: Any, log: StorageLog) -> None:
    """An inference trial's step (:func:`steps._timed_step`): the outputs live through it."""
    log.mark("forward")
    with _saved_tagged(torch, log), applied.grad_mode(), applied.autocast():
        outputs = loss_fn(applied.model, batch)
    log.mark("other")
    del outputs


def _step(
    torch: Any,
    applied: Any,
    loss_fn: Any,
    batch: Any,
    log: StorageLog,
    sums: GradSums | None = None,
) -> None:
    """:func:`steps._timed_step` with tags and phase marks: the loss lives through the step;
    ``sums`` watches each backward for the engine's sums of gradients."""
    # From the second micro-batch on, each one holds what the one before held (the gradients
    # exist, the last loss lives until the next is made): two stand for any number of them.
    for micro in applied.micro_batches(batch)[:STEADY_MICRO_BATCHES]:
        log.mark("forward")
        with _saved_tagged(torch, log), applied.autocast():
            loss = loss_fn(applied.model, micro)
        log.mark("backward")
        with sums.watching(loss) if sums is not None else contextlib.nullcontext():
            applied.backward(loss)
        for p in applied.model.parameters():
            log.tag(p.grad, "gradients")
    log.mark("optimizer")
    optimizer = applied.optimizer
    applied.step()
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                log.tag(value, "optimizer_state")
    log.mark("other")
    del loss


def _storages(torch: Any, batch: Any) -> set[int]:
    """The storages of the batch's tensors."""
    return {t.untyped_storage()._cdata for t in tensors_in([batch], torch.Tensor, [])}


def _weights_device(model: Any) -> Any:
    """Where the model's weights are; None for a model on the meta device (or with none)."""
    tensors = (*model.parameters(), *model.buffers())
    return next((t.device for t in tensors if not t.is_meta), None)


def _compiled(torch: Any, model: Any) -> str | None:
    """The name of a module compiled with torch.compile, if any."""
    optimized = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    wrapper = getattr(optimized, "OptimizedModule", None)
    for name, m in model.named_modules():
        if (wrapper is not None and isinstance(m, wrapper)) or getattr(
            m, "_compiled_call_impl", None
        ) is not None:
            return name or type(m).__name__
    return None


def reason(exc: BaseException) -> str:
    """Why a step failed on fake tensors, in the user's terms."""
    from torch._subclasses import fake_tensor as ft

    func = getattr(exc, "func", None)
    at = raised_at(exc)
    if isinstance(exc, ft.DynamicOutputShapeException):
        return (
            f"the step calls {func}, whose output shape depends on tensor values, which fake "
            "tensors do not have" + (f"; called at {at}" if at else "")
        )
    if isinstance(exc, ft.DataDependentOutputException):
        return (
            f"the step reads tensor values ({func}: .item(), bool(t), .tolist() or fp16 loss "
            "scaling's overflow check), which fake tensors do not have"
            + (f"; read at {at}" if at else "")
        )
    if isinstance(exc, ft.UnsupportedOperatorException):
        return (
            f"operator {func} has no fake implementation (register one with "
            "torch.library.register_fake)"
        )
    if isinstance(exc, RealStepError):
        return f"the real step fails too: {exc}" + (f"; at {at}" if at else "")
    if "fake impl" in str(exc) or "fake kernel" in str(exc):
        return f"a custom operator has no fake implementation: {exc}"
    return f"the step failed on fake tensors: {type(exc).__name__}: {exc}"
