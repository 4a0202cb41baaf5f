"""Parallelism as a technique: one rank's model under DDP or FSDP2, and its optimizer.

Each rank applies the configuration's other techniques first, then its strategy:

- ``ddp``: ``DistributedDataParallel`` around the model (``device_ids`` on a GPU); the
  optimizer stays, since DDP keeps the module's parameters.
- ``fsdp2``: ``fully_shard`` on each of the model's repeated blocks (the ones ``"blocks"``
  checkpointing finds), then on the root. An autocast precision becomes FSDP2's
  ``MixedPrecisionPolicy`` (parameters gathered in bf16 or fp16, gradients reduced in fp32)
  next to the autocast itself. The optimizer is built again, of the same class with the same
  groups and settings, over the sharded parameters, found by name. With ``cpu_offload`` the
  shards, their gradients and so the optimizer state live in host memory (FSDP2's
  ``CPUOffloadPolicy``, pinned on a GPU) and the optimizer steps there: the device holds only
  the blocks gathered at the time, their gradients and the activations. It works on one rank.

A process group of ``world_size`` ranks must be up (``torch.distributed``); on fake tensors
it is a fake one (:mod:`~jupyter_gpumem.tuner.estimation.fake_group`). There, DDP's check of parameter
shapes across ranks and its one rebuild of the buckets read tensor values, so both are left
out, and a communication hook hands each bucket back as reduced in place, as NCCL does.

Known limitations:
- Nothing here is undone: a wrapped or sharded model stays so. Apply it to a model used for
  this alone (a fake copy, a forked rank's own model).
- The loss function gets the wrapper (``DistributedDataParallel``, or the sharded model):
  calling it works as calling the model; attributes of the model itself are under
  ``.module`` for DDP.
- Optimizers whose constructor needs more than its parameter groups cannot be rebuilt for
  FSDP2; the error says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from jupyter_gpumem.techniques.checkpointing import blocks
from jupyter_gpumem.techniques.config import Config

_GATHER_DTYPE = {"bf16-autocast": torch.bfloat16, "fp16-autocast": torch.float16}


@dataclass
class Parallel:
    """A rank's model under its strategy, the optimizer to step, and what was noticed."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    warnings: list[str] = field(default_factory=list)


def parallelize(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, config: Config
) -> Parallel:
    """``model`` wrapped or sharded for ``config.parallel`` in the running process group."""
    if config.parallel is None:
        return Parallel(model, optimizer)
    check_group(config)
    fake = _is_fake(model)
    if config.parallel == "ddp":
        return Parallel(_ddp(model, fake), optimizer)
    return _fsdp2(model, optimizer, config, fake)


def check_group(config: Config) -> None:
    """RuntimeError unless a process group of ``config.world_size`` ranks is up."""
    import torch.distributed as dist

    if config.parallel is None:
        return
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"parallel={config.parallel!r} runs inside a process group of {config.world_size} "
            "ranks, and none is up: Trial.estimate() and Trial.run() start one for you"
        )
    if dist.get_world_size() != config.world_size:
        raise RuntimeError(
            f"the process group has {dist.get_world_size()} ranks, the configuration asks "
            f"for world_size={config.world_size}"
        )


def _is_fake(model: nn.Module) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    first = next(model.parameters(), None)
    return isinstance(first, FakeTensor)


def _device(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


# -- DDP -------------------------------------------------------------------------------------
def _ddp(model: nn.Module, fake: bool) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel
    from torch.nn.parallel import distributed as ddp_module

    device = _device(model)
    ids = [device] if device.type == "cuda" else None
    if not fake:
        return DistributedDataParallel(model, device_ids=ids)
    check = ddp_module._verify_param_shape_across_processes
    ddp_module._verify_param_shape_across_processes = _no_check
    try:
        wrapped = DistributedDataParallel(model, device_ids=ids)
    finally:
        ddp_module._verify_param_shape_across_processes = check
    wrapped.register_comm_hook(None, _reduced_in_place)
    wrapped.reducer = FakeReducer(wrapped.reducer)
    return wrapped


def _no_check(*args: Any, **kwargs: Any) -> None:
    """DDP's check that every rank has the same shapes: all fake ranks have, by construction."""


def _reduced_in_place(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads annotations
    """A communication hook for fake ranks: the bucket, as if all-reduced in place."""
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


class FakeReducer:
    """DDP's reducer on a fake rank, but for the one rebuild of its buckets.

    DDP makes its buckets again, in the order gradients arrived, at the start of the second
    forward; it agrees on that order across ranks by reading a tensor's values, which a fake
    rank has not. Here the buckets keep their first layout and ``on_rebuild`` is called
    instead, for whoever counts the memory to see them made anew, of the same sizes.
    """

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer
        self._forwards = 0
        self.on_rebuild: Callable[[], None] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        self._forwards += 1
        if self._forwards == 2 and self.on_rebuild is not None:
            self.on_rebuild()
        return False


# -- FSDP2 -----------------------------------------------------------------------------------
def _fully_shard() -> tuple[Any, Any, Any]:
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import (  # type: ignore[no-redef]
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            fully_shard,
        )
    return fully_shard, MixedPrecisionPolicy, CPUOffloadPolicy


def _fsdp2(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, config: Config, fake: bool
) -> Parallel:
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, policy_class, offload_class = _fully_shard()
    device = _device(model)
    if fake:  # the mesh holds the ranks as a real tensor
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            mesh = init_device_mesh(device.type, (config.world_size,))
    else:
        mesh = init_device_mesh(device.type, (config.world_size,))
    gather = _GATHER_DTYPE.get(config.precision or "")
    policy = policy_class() if gather is None else policy_class(gather, torch.float32)
    placed: dict[str, Any] = {"mp_policy": policy}
    warnings: list[str] = []
    if config.cpu_offload:  # pinned pages are host memory: a fake run has none to pin
        placed["offload_policy"] = offload_class(pin_memory=device.type == "cuda" and not fake)
        if device.type != "cuda":
            warnings.append(
                "cpu_offload: the model is on the CPU already, so nothing moves to host memory"
            )
    names = {id(p): name for name, p in model.named_parameters()}
    found = blocks(model)
    if not found:
        warnings.append(
            "fsdp2: the model has no repeated blocks, so it is sharded as one unit: "
            "each rank gathers every parameter at once"
        )
    modules = dict(model.named_modules())
    for name in found:
        fully_shard(modules[name], mesh=mesh, **placed)
    fully_shard(model, mesh=mesh, **placed)
    return Parallel(model, _rebuilt(optimizer, names, model), warnings)


def _rebuilt(
    optimizer: torch.optim.Optimizer | None, names: dict[int, str], model: nn.Module
) -> torch.optim.Optimizer | None:
    """``optimizer``'s class and groups over the model's parameters now, matched by name."""
    if optimizer is None:
        return None
    now = dict(model.named_parameters())
    groups = []
    for group in optimizer.param_groups:
        settings = {k: v for k, v in group.items() if k != "params"}
        groups.append({**settings, "params": [now[names[id(p)]] for p in group["params"]]})
    try:
        return type(optimizer)(groups)  # type: ignore[call-arg]  # a subclass takes groups
    except TypeError as exc:
        raise TypeError(
            f"fsdp2 builds the optimizer again over the sharded parameters, and "
            f"{type(optimizer).__name__}(param_groups) failed: {exc}; use a torch.optim "
            "optimizer, or optimizer= one of OPTIMIZERS"
        ) from exc
