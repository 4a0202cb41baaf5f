"""One rank of a fake process group in this process, as torchtitan's memory estimator uses.

torch's ``fake`` backend answers every collective at once and sends nothing, so one process can
play rank ``r`` of ``world_size``: DDP and FSDP2 build the buckets, shards and gather buffers
that rank would, on fake tensors, with no other process and no network. Ranks are played one
after the other; each gets its own group, destroyed when it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable


@contextmanager
def fake_rank(rank: int, world_size: int) -> Iterator[None]:
    """This process as rank ``rank`` of a fake group of ``world_size``, for the block."""
    import torch.distributed as dist

    if not dist.is_available():
        raise Unfakeable("this torch build has no torch.distributed")
    if dist.is_initialized():
        raise Unfakeable(
            "a process group is already up in this process, and a fake one cannot be started "
            "beside it: estimate parallel configurations in a kernel without one"
        )
    # importing it registers the fake backend; FakeStore is the store it expects
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
