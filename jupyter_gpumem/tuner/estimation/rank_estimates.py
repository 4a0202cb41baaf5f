"""Per-rank estimates of a parallel configuration, made with no GPU work.

Each rank is played in a fake process group (:mod:`~jupyter_gpumem.tuner.estimation.fake_group`):
the trial's step runs on fake tensors of a copy of the model, which the rank's strategy wraps
or shards (:mod:`~jupyter_gpumem.tuner.estimation.fake_step`), and its storages go through the same
allocator model and breakdown as a one-process estimate
(:mod:`~jupyter_gpumem.tuner.estimation.fake_peaks`). Communication buffers (FSDP2's all-gather and
reduce-scatter buffers, DDP's buckets) are told by the code that allocated them, as in a
measured report. Ranks whose shards have the same sizes are played once: every DDP rank, and
every FSDP2 rank but those holding a shorter or empty last piece of some parameter. Each of
those layouts is played in a forked child, all at once where the host has the cores
(:mod:`~jupyter_gpumem.tuner.estimation.forked`; a 70B model over 1,024 ranks has three).

A rank is a fresh process: on a GPU it starts with its CUDA context and the library workspaces
its first matmuls make, and nothing else. Where CUDA is not initialised in the kernel yet, each
layout's child makes those workspaces as a rank would: the kernel stays free to fork the ranks
of ``Trial.run`` (a child forked after its parent initialised CUDA cannot use it). Where it is
initialised, the ranks are played here, one after the other, from an empty device, and a note
says the workspaces are not counted.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from jupyter_gpumem.techniques.config import Config
from jupyter_gpumem.tuner.estimation import fake_peaks
from jupyter_gpumem.tuner.estimation.cards import Card
from jupyter_gpumem.tuner.estimation.estimate import Estimate, from_peaks, unavailable
from jupyter_gpumem.tuner.estimation.fake_group import fake_rank
from jupyter_gpumem.tuner.estimation.fake_step import run_fake
from jupyter_gpumem.tuner.estimation.forked import can_fork, cores, run_forked
from jupyter_gpumem.tuner.estimation.nccl import nccl_share
from jupyter_gpumem.tuner.estimation.on_card import on_card
from jupyter_gpumem.tuner.estimation.shard_pieces import pieces_on_demand
from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable
from jupyter_gpumem.tuner.workload import Workload
from jupyter_gpumem.units import format_bytes

NO_WORKSPACES = (
    "CUDA was initialised in this kernel before, so the ranks were estimated here from an "
    "empty device: the library workspaces each rank makes (tens of MiB) are not counted"
)
PROBED_WORKSPACES = (
    "CUDA was initialised in this kernel before, so the ranks were estimated here from an "
    "empty device, with the library workspaces a fresh process made on it ({size})"
)
# a fresh process makes the workspaces a rank would, and prints their bytes
_PROBE = (
    "import sys, torch\n"
    "from jupyter_gpumem.tuner.estimation.fake_peaks import device_facts\n"
    "print(device_facts(torch, torch.device('cuda', int(sys.argv[1]))).workspace_bytes)\n"
)
_PROBED: dict[str, int | None] = {}


def estimate_ranks(
    workload: Workload,
    config: Config,
    *,
    batch: Any = None,
    make_batch: Callable[[], Any] | None = None,
    batch_size: int | None = None,
    gpu: Card | None = None,
) -> Estimate:
    """One estimate per rank of ``config``; the worst rank's figures, with ``.ranks``.

    On a GPU each rank carries its verdict on ``gpu`` (default: the card present). Ranks whose
    shards differ are played each in a forked child, at once where the host has the cores
    (:mod:`.forked`).
    """
    import torch

    t0 = time.perf_counter()
    device = workload.device
    play = functools.partial(
        _play, workload, config, batch=batch, make_batch=make_batch, batch_size=batch_size,
        gpu=gpu,
    )  # fmt: skip
    keys = layouts(workload.model, config)
    firsts = first_of_each_layout(keys)
    fresh = device.type == "cuda" and not torch.cuda.is_initialized()
    played: dict[tuple[int, ...], Estimate] = {}
    if fresh or (len(firsts) > 1 and can_fork(torch) and cores() > 1):
        done = run_forked([functools.partial(play, rank, fresh=fresh) for rank in firsts.values()])
        for message in dict.fromkeys(m for d in done for m in d.warnings):
            warnings.warn(message, stacklevel=3)
        for key, d in zip(firsts, done, strict=True):
            if d.error is not None:
                raise RuntimeError(f"estimating the ranks failed: {d.error}")
            played[key] = d.value
    else:
        for key, rank in firsts.items():
            played[key] = play(rank, fresh=False)
            if played[key].peak_bytes is None:
                break
    return _worst(config, every_rank(keys, played), time.perf_counter() - t0)


def first_of_each_layout(keys: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], int]:
    """The first rank of each distinct layout in ``keys`` (:func:`layouts`), in rank order."""
    firsts: dict[tuple[int, ...], int] = {}
    for rank, key in enumerate(keys):
        firsts.setdefault(key, rank)
    return firsts


def every_rank(
    keys: Sequence[tuple[int, ...]], played: dict[tuple[int, ...], Estimate]
) -> list[Estimate]:
    """Every rank's estimate, each its layout's, up to the first rank that could not be
    estimated."""
    out: list[Estimate] = []
    for rank, key in enumerate(keys):
        found = played.get(key)
        if found is None:  # its layout was not played: one played before it failed
            break
        out.append(replace(found, rank=rank))
        if found.peak_bytes is None:
            break
    return out


def _play(
    workload: Workload,
    config: Config,
    rank: int,
    *,
    fresh: bool,
    batch: Any,
    make_batch: Callable[[], Any] | None,
    batch_size: int | None,
    gpu: Card | None,
) -> Estimate:
    """Rank ``rank`` played in a fake process group; ``fresh``: this process is new to CUDA,
    as a rank's is."""
    import torch

    device = workload.device
    cuda = device.type == "cuda"
    facts = fake_peaks.device_facts(torch, device) if cuda and fresh else None
    # the card's size and context for the verdict: CUDA is up already where the ranks are
    # played in this process
    judge = facts or (fake_peaks.device_facts(torch, device) if cuda else None)
    # DDP makes its buckets anew in the second forward: the fake steps reach it where the
    # trial's warm-up does
    warmup = min(workload.warmup, 2)
    workspaces = fresh_workspaces(device) if cuda and not fresh else None
    t0 = time.perf_counter()
    try:
        with fake_rank(rank, config.world_size), pieces_on_demand():
            run = run_fake(
                workload.model,
                workload.optimizer,
                workload.loss_fn,
                device,
                config,
                batch=workload.batch if batch is None else batch,
                make_batch=make_batch,
                warmup=warmup,
                steps=1 if warmup else min(workload.steps, 2),
                measured_steps=workload.steps if warmup else 1,
            )
    except Unfakeable as exc:
        return replace(
            unavailable(config, device, f"rank {rank}: {exc}", batch_size, t0), rank=rank
        )
    notes: list[str] = [*run.checks, *filter(None, [run.blocks]), *run.kernels]
    if cuda:
        segments, foreign = (
            fake_peaks.start_layout(torch, device, drop=()) if fresh else ((), frozenset())
        )
        sizes = facts.workspace_sizes if facts is not None else ()
        peaks = fake_peaks.cuda_peaks(run, segments, foreign, workspaces=sizes)
        notes.extend(fake_peaks.allocator_notes())
        if workspaces is not None:
            notes.append(PROBED_WORKSPACES.format(size=format_bytes(workspaces)))
        elif not fresh:
            notes.append(NO_WORKSPACES)
    else:
        peaks = fake_peaks.cpu_peaks(run)
    found = from_peaks(
        peaks,
        facts,
        label=str(config),
        device=str(device),
        t0=t0,
        resident_bytes=0 if cuda else None,
        batch_size=batch_size,
        notes=tuple(notes),
        config=config,
        rank=rank,
    )
    if workspaces:
        found = with_workspaces(found, workspaces)
    if judge is not None:  # a rank of N GPUs talks over NCCL
        found = on_card(found, judge, gpu, nccl_share(config.world_size))
    return found


def with_workspaces(found: Estimate, size: int) -> Estimate:
    """``found`` with ``size`` bytes of library workspaces held from the start (each is a
    segment of its own, so reserved grows by as much)."""
    if found.peak_bytes is None or found.breakdown is None:
        return found
    breakdown = dict(found.breakdown)
    breakdown["library_workspace"] = breakdown.get("library_workspace", 0) + size
    reserved = found.peak_reserved_bytes
    return replace(
        found,
        peak_bytes=found.peak_bytes + size,
        peak_reserved_bytes=None if reserved is None else reserved + size,
        breakdown=breakdown,
        workspace_bytes=(found.workspace_bytes or 0) + size,
    )


def fresh_workspaces(device: Any) -> int | None:
    """The library workspaces a fresh process makes on ``device``, as each rank does: measured
    once, in a process of its own (this one made its own long ago); None where that fails."""
    key = str(device)
    if key not in _PROBED:
        index = 0 if device.index is None else device.index
        try:
            done = subprocess.run(
                [sys.executable, "-c", _PROBE, str(index)],
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
            _PROBED[key] = int(done.stdout.split()[-1]) if done.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            _PROBED[key] = None
    return _PROBED[key]


def shard_sizes(model: Any, config: Config, rank: int) -> tuple[int, ...]:
    """What sets one rank's memory apart: its rows of each parameter under FSDP2, else nothing.

    FSDP2 cuts each parameter into ``world_size`` pieces along its first dimension, as
    ``torch.chunk`` does: pieces of ceil(rows / world_size) rows, the last ones shorter or empty.
    """
    return _pieces(_rows(model, config), config.world_size, rank)


def layouts(model: Any, config: Config) -> list[tuple[int, ...]]:
    """Every rank's :func:`shard_sizes`, in rank order, the parameters read once (read again
    for each rank, a 70B Llama's 723 over 1,024 ranks took 9 s on a 2-core CPU)."""
    rows = _rows(model, config)
    return [_pieces(rows, config.world_size, rank) for rank in range(config.world_size)]


def _rows(model: Any, config: Config) -> tuple[int, ...] | None:
    """Each parameter's rows, or None where the strategy shards nothing (DDP)."""
    if config.parallel != "fsdp2":
        return None
    return tuple(p.shape[0] if p.dim() else 1 for p in model.parameters())


def _pieces(rows: tuple[int, ...] | None, n: int, rank: int) -> tuple[int, ...]:
    if rows is None:
        return ()
    out = []
    for r in rows:
        piece = -(-r // n)
        out.append(max(0, min(piece, r - rank * piece)))
    return tuple(out)


def _worst(config: Config, ranks: list[Estimate], wall_s: float) -> Estimate:
    """The estimate of the whole job: the worst rank's figures, every rank in ``ranks``."""
    failed = next((r for r in ranks if r.peak_bytes is None), None)
    worst = failed or max(ranks, key=lambda r: r.peak_bytes or 0)
    gaps = None if failed else _phase_gaps(worst, ranks)
    return replace(
        worst, rank=None, ranks=tuple(ranks), wall_s=wall_s, config=config, phase_gaps=gaps
    )


def _phase_gaps(worst: Estimate, ranks: list[Estimate]) -> dict[str, int] | None:
    """Each phase's peak over every rank, below the worst rank's peak."""
    most: dict[str, int] = {}
    for r in ranks:
        for phase, peak in (r.phase_peaks or {}).items():
            most[phase] = max(most.get(phase, 0), peak)
    assert worst.peak_bytes is not None
    return {phase: worst.peak_bytes - peak for phase, peak in most.items()} or None
