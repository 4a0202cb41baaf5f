"""Per-block profile of one training step: what checkpointing each block saves, and costs.

One step of a trial's model runs with two instruments on the candidate blocks:

- ``saved_tensors_hooks``: every storage saved for backward is attributed to the block whose
  forward saved it (or to none, outside every block); parameters and buffers are left out;
- forward pre- and post-hooks on each block: its tensor arguments (what a checkpoint of the
  block keeps instead of its activations) and its forward time (CUDA events on a GPU, the
  clock on the CPU): the cost of recomputing it in backward.

The step runs as a run of its own (:func:`~jupyter_gpumem.tuner.runner.run_once`: one warm-up step,
then the profiled one), so the model, optimizer and random state come back as they were.
Under a parallel configuration it runs on the configuration's ranks, forked or spawned where
CUDA is usable (:mod:`~jupyter_gpumem.tuner.forked_ranks`): each rank profiles its own step, and
the profile of the rank with the highest peak is the one returned. A block's parameters while
it runs (FSDP2's gathered ones) count as parameters, not as what the block saved.

Known limitations:

- The profile's hooks sit above the trial recorder's while the forward runs, so the profiling
  trial's own report is not used; the peaks the planner uses come from plain trials.
- Activations saved by custom autograd Functions that bypass ``save_for_backward``, or saved
  inside the model's own checkpointed regions, are not seen; the planner scales the savings
  to what the measured runs show.
- Storages are told apart by address: an argument that nothing saves may be freed and its
  address reused by a later one within the same forward.
- A block called more than once in a step is profiled over all its calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from jupyter_gpumem.tuner.results import TrialResult
from jupyter_gpumem.tuner.runner import job_once, run_once
from jupyter_gpumem.tuner.workload import LossFn, Workload

if TYPE_CHECKING:
    from jupyter_gpumem.techniques import Config

_Key = tuple[str, int | None, int]  # (device type, index, storage address)


@dataclass(frozen=True)
class BlockProfile:
    """One candidate block in one step: bytes as ints, seconds as floats."""

    name: str
    saved_bytes: int  # saved for backward by this block alone: what backward brings back
    saving_bytes: int  # what checkpointing it frees: saved_bytes less what the checkpoint keeps
    forward_s: float  # the cost of recomputing it
    grad_bytes: int = 0  # its parameters' gradients: allocated by the time its backward runs
    output_bytes: int = 0  # its output: made again, beside the incoming gradient, when recomputed
    calls: int = 1


@dataclass(frozen=True)
class StepProfile:
    """The candidate blocks of one profiled step, in the order they first ran."""

    blocks: tuple[BlockProfile, ...]
    outside_bytes: int  # saved outside every block (embeddings, head, loss)
    shared_bytes: int  # saved by more than one block: stays unless all of them are checkpointed
    unused: tuple[str, ...] = ()  # candidates that did not run in the step
    result: TrialResult | None = field(default=None, compare=False, repr=False)

    @property
    def saving_bytes(self) -> int:
        """What checkpointing every block would free, by the profile."""
        return sum(b.saving_bytes for b in self.blocks)


@dataclass
class _Call:
    """What the hooks saw of one block."""

    args: set[_Key] = field(default_factory=set)
    sizes: dict[_Key, int] = field(default_factory=dict)  # argument storages and their bytes
    timings: list[Any] = field(default_factory=list)  # (start, end): events or perf_counter
    outputs: dict[_Key, int] = field(default_factory=dict)
    calls: int = 0


class _Probe:
    """Hooks for one step; ``loss_fn`` wraps the trial's and records each call afresh."""

    def __init__(self, names: Sequence[str], inner: LossFn) -> None:
        self.names = list(names)
        self.inner = inner
        self.saved: dict[_Key, list[str | None]] = {}  # storage -> savers, first first
        self.sizes: dict[_Key, int] = {}
        self.blocks: dict[str, _Call] = {}
        self.params: set[_Key] = set()
        self.grads: dict[str, int] = {}
        self.stack: list[str] = []
        self.gathered: dict[str, set[_Key]] = {}  # running blocks' parameters not in params
        self.cuda = False

    def loss_fn(self, model: nn.Module, batch: Any) -> Any:
        self.saved, self.sizes, self.blocks, self.stack, self.gathered = {}, {}, {}, [], {}
        self.params = {k for t in (*model.parameters(), *model.buffers()) if (k := _key(t))}
        self.cuda = any(t.is_cuda for t in model.parameters())
        # the blocks are named in the model as the user built it, which DDP wraps
        own = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        self.grads = {
            name: sum(
                p.numel() * p.element_size()
                for p in own.get_submodule(name).parameters()
                if p.requires_grad
            )
            for name in self.names
        }
        handles = []
        try:
            for name in self.names:
                module = own.get_submodule(name)
                handles.append(module.register_forward_pre_hook(self._pre(name), with_kwargs=True))
                handles.append(module.register_forward_hook(self._post(name), always_call=True))
            with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
                return self.inner(model, batch)
        finally:
            for handle in handles:
                handle.remove()

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            call = self.blocks.setdefault(name, _Call())
            call.calls += 1
            for t in _tensors((args, kwargs)):
                key = _key(t)
                if key is not None and key not in self.params:
                    call.args.add(key)
                    call.sizes[key] = t.untyped_storage().nbytes()
            own = {k for t in (*module.parameters(), *module.buffers()) if (k := _key(t))}
            self.gathered[name] = own - self.params  # FSDP2's, unsharded for this forward
            self.params |= self.gathered[name]
            call.timings.append([self._now(), None])
            self.stack.append(name)

        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
            self.params -= self.gathered.pop(name, set())  # freed now: their addresses reused
            call = self.blocks[name]
            for t in _tensors(output):
                key = _key(t)
                if key is not None and key not in self.params:
                    call.outputs[key] = t.untyped_storage().nbytes()
            timing = call.timings[-1]
            if timing[1] is None:
                timing[1] = self._now()

        return hook

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _key(t)
        if key is not None and key not in self.params:
            saver = self.stack[-1] if self.stack else None
            savers = self.saved.setdefault(key, [])
            if saver not in savers:
                savers.append(saver)
            self.sizes[key] = t.untyped_storage().nbytes()
        # Detached, as the recorder's tagger does: a saved output kept as itself would tie it
        # to its own grad_fn in a cycle; autograd restores the grad_fn on unpacking.
        return t.detach()

    def profile(self, result: TrialResult | None) -> StepProfile:
        """The recorded step as a profile (call after the trial, when its events are done)."""
        if self.cuda:
            torch.cuda.synchronize()
        alone: dict[str, int] = {}
        outside = shared = 0
        for key, savers in self.saved.items():
            size = self.sizes[key]
            only = savers[0] if len(savers) == 1 else None
            if only is not None:
                alone[only] = alone.get(only, 0) + size
            elif savers == [None]:
                outside += size
            else:
                shared += size
        found = []
        for name, call in self.blocks.items():  # insertion order: the order they first ran
            saved = alone.get(name, 0)
            # A checkpoint keeps the block's arguments: those it saved itself free nothing, and
            # those nobody saved are kept alive by it alone.
            kept = sum(
                call.sizes[k]
                for k in call.args
                if self.saved.get(k) == [name] or k not in self.saved
            )
            seconds = sum(_elapsed(start, end) for start, end in call.timings if end is not None)
            grads = self.grads.get(name, 0)
            output = max(call.outputs.values(), default=0)
            found.append(
                BlockProfile(name, saved, saved - kept, seconds, grads, output, call.calls)
            )
        unused = tuple(n for n in self.names if n not in self.blocks)
        return StepProfile(tuple(found), outside, shared, unused, result)

    def collected(self) -> dict[str, Any]:
        """The profile as plain data: what a rank sends back."""
        return {k: v for k, v in asdict(self.profile(None)).items() if k != "result"}


def profile_step(workload: Workload, names: Sequence[str], config: Config) -> StepProfile:
    """Profile the blocks ``names`` over one step of ``workload``'s model under ``config``.

    ``config`` must not checkpoint: a checkpointed block saves nothing the hooks could see.
    The profiled step is the second of two, so that allocator growth and one-time set-up
    costs of the first do not count as forward time.
    """
    if config.checkpoint is not None:
        raise ValueError("profile_step needs a configuration without checkpointing")
    probe = _Probe(names, workload.loss_fn)
    once = replace(workload, loss_fn=probe.loss_fn, warmup=1, steps=1)
    if config.parallel is None:
        return probe.profile(run_once(once, config))
    job = job_once(once, config, probe.collected)
    peaks = {r.rank: r.peak_allocated_bytes or 0 for r in job.result.ranks}
    sent = [(rank, data) for rank, data in enumerate(job.collected) if data]
    if not sent:  # the job failed: its result says how
        return StepProfile((), 0, 0, tuple(names), job.result)
    _, worst = max(sent, key=lambda s: (peaks.get(s[0], 0), -s[0]))
    return _profile_of(worst, job.result)


def _profile_of(data: dict[str, Any], result: TrialResult) -> StepProfile:
    """The StepProfile a rank sent as plain data."""
    return StepProfile(
        tuple(BlockProfile(**b) for b in data["blocks"]),
        data["outside_bytes"],
        data["shared_bytes"],
        tuple(data["unused"]),
        result,
    )


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _key(t: Any) -> _Key | None:
    if not isinstance(t, torch.Tensor):
        return None
    try:
        address = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse, nested, meta and other storages
        return None
    return (t.device.type, t.device.index, address) if address else None


def _tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors in a call's arguments, up to three levels into tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 3 and isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, depth + 1)


def _elapsed(start: Any, end: Any) -> float:
    if isinstance(start, float):
        return float(end) - start
    return float(start.elapsed_time(end)) / 1000.0
