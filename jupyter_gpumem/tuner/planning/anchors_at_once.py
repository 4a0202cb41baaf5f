"""A search's anchors estimated at once, each in a forked child, where the host has the cores.

The anchors a search composes its candidates from (the baseline, each precision and optimizer
alone, every block checkpointed, the most micro-batches, LoRA, each rank count) are estimates
that share nothing, and made one after the other they are most of a search's time.
:func:`estimated_at_once` makes those asked for in forked children
(:mod:`~jupyter_gpumem.tuner.estimation.forked`), as many at once as the host has cores, and
the search takes them from what it returns as it would have made them. Where a child fails,
or forking cannot be done (CUDA initialised in this process, one core, an estimate that goes
through a process of its own), nothing is returned for it and the search makes it itself. The
offloading anchors are made in this process in turn: the blocks' host copies reuse what the
whole model's pinned.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.estimation import without_cuda
from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.estimation.forked import can_fork, cores, run_forked
from jupyter_gpumem.tuner.estimation.predict import estimate_workload
from jupyter_gpumem.tuner.workload import Workload

# A child that estimates on a GPU makes a CUDA context of its own there (about 500 MiB):
# at most this many at once, whatever the cores.
GPU_CHILDREN = 8


def estimated_at_once(
    workload: Workload,
    configs: Sequence[Config],
    *,
    count_held: bool,
    say: Callable[[str], None],
) -> dict[Config, Estimate]:
    """The primed estimates of ``configs`` (as a search's anchors are made) that forked
    children made at once, their warnings given here; empty where they cannot be made so."""
    import torch

    configs = list(dict.fromkeys(configs))
    device = workload.device
    width = min(cores(), len(configs), GPU_CHILDREN if device.type == "cuda" else len(configs))
    if width < 2 or not can_fork(torch) or without_cuda.needed(torch, device, None):
        return {}
    say(f"estimating {len(configs)} configurations at once, in {width} processes")

    def work(config: Config) -> Callable[[], Estimate]:
        return lambda: estimate_workload(workload, config, primed=True, count_held=count_held)

    done = run_forked([work(c) for c in configs], processes=width)
    for message in dict.fromkeys(m for d in done for m in d.warnings):  # as made here, once
        warnings.warn(message, stacklevel=3)
    return {c: d.value for c, d in zip(configs, done, strict=True) if d.error is None}
