"""A parallel configuration measured for real: N ranks forked from the kernel, each measured.

``Trial.run(Config(parallel=..., world_size=N))`` forks N processes from the kernel. Each is
one rank: it joins a process group (NCCL with one GPU per rank where there are N GPUs, gloo
with the ranks sharing the devices where there are fewer, gloo on the CPU), moves its copy of
the model, optimizer and batch to its device, applies the configuration (its strategy last,
see :mod:`~jupyter_gpumem.techniques.parallel`) and runs the trial's warm-up and measured steps
under the same measurement as a one-process trial. On a GPU it also reads its own
``torch.cuda.max_memory_allocated()`` over the measured steps. Each rank writes its result
into a folder of its own, which the kernel reads when every rank has ended.

The ranks are forked, so nothing is pickled (a loss function defined in the notebook works),
and the kernel must not have initialised CUDA: a child forked after that cannot use it.
If one rank fails, the others are stopped, as ``torch.multiprocessing`` does, and the result
says which rank failed and how.

Known limitations:
- Each rank's batch is the trial's batch: the same shapes on every rank, as a sharded data
  loader gives.
- A rank killed by a signal (the system's out-of-memory killer) writes nothing; its row says
  how it ended.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import resource
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from jupyter_gpumem.report.record import report_from_dict, status_of
from jupyter_gpumem.techniques import Config, apply_config
from jupyter_gpumem.techniques.config import MAX_WORLD_SIZE
from jupyter_gpumem.tracking.devices import cuda_count
from jupyter_gpumem.tracking.ranks import SETTLE_S, stop_inherited, write_json
from jupyter_gpumem.tuner.results import TrialResult, result_of
from jupyter_gpumem.tuner.steps import measure_steps
from jupyter_gpumem.tuner.workload import Workload

POLL_S = 0.05
MAX_FORKED = 64  # ranks run() forks at most
CUDA_IN_KERNEL = (
    "the ranks are forked from this kernel, and CUDA is already initialised in it: a forked "
    "child cannot use CUDA then. Restart the kernel, build the model, optimizer and batch on "
    "the CPU and pass device='cuda' to Trial; the ranks move their copies to their GPUs"
)


def run_ranks(workload: Workload, config: Config) -> TrialResult:
    """Fork ``config.world_size`` ranks that each measure ``workload`` under ``config``."""
    import torch

    device = workload.device
    if device.type == "cuda" and torch.cuda.is_initialized():
        raise RuntimeError(CUDA_IN_KERNEL)
    check_forkable(config.world_size)
    gpus = cuda_count(torch) if device.type == "cuda" else 0
    backend = "nccl" if device.type == "cuda" and gpus >= config.world_size else "gloo"
    folder = tempfile.mkdtemp(prefix="gpumem-trial-ranks-")
    try:
        ended = _fork_and_wait(workload, config, folder, backend, gpus)
        results = [
            _read(folder, rank, config, ended.get(rank)) for rank in range(config.world_size)
        ]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return _job(config, results, backend)


def check_forkable(world_size: int) -> None:
    """ValueError for more ranks than this machine lets the kernel fork, before any starts."""
    if world_size > MAX_FORKED:
        raise ValueError(
            f"run() forks one process per rank, each with its own copy of the model: at most "
            f"{MAX_FORKED} ranks, got {world_size}; estimate() plays up to {MAX_WORLD_SIZE}"
        )
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and world_size >= soft:
        raise ValueError(
            f"run() forks one process per rank, and this machine's process limit (ulimit -u) "
            f"is {soft}: {world_size} ranks cannot start"
        )


def rank_device(device: Any, rank: int, gpus: int) -> Any:
    """Rank ``rank``'s device: its own GPU where there are enough, else shared in turn."""
    import torch

    if device.type != "cuda":
        return device
    return torch.device("cuda", rank % max(1, gpus))


# -- the kernel's side -------------------------------------------------------------------------
def _fork_and_wait(
    workload: Workload, config: Config, folder: str, backend: str, gpus: int
) -> dict[int, int | None]:
    """Start the ranks and wait for all; stop the rest when one fails. Exit codes by rank."""
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(
            target=_rank_main,
            args=(rank, workload, config, folder, backend, gpus),
            name=f"gpumem-rank-{rank}",
            daemon=True,
        )
        for rank in range(config.world_size)
    ]
    started: list[Any] = []
    try:
        for rank, p in enumerate(processes):
            try:
                p.start()
            except OSError as exc:  # the process limit, or memory to copy the kernel
                raise RuntimeError(
                    f"could not start rank {rank} of {config.world_size}: {exc}; the ranks "
                    "already started were stopped"
                ) from exc
            started.append(p)
        while any(p.is_alive() for p in started):
            if any(p.exitcode not in (None, 0) for p in started):
                break  # the others may wait for it in a collective forever
            time.sleep(POLL_S)
    finally:  # all or nothing: a rank that could not start, or a Ctrl-C, stops every rank
        for p in started:
            if p.is_alive():
                p.terminate()
        for p in started:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return {rank: p.exitcode for rank, p in enumerate(processes)}


def _read(folder: str, rank: int, config: Config, exitcode: int | None) -> dict[str, Any]:
    path = Path(folder) / f"rank-{rank}.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {"rank": rank, "status": "error", "error": _how_it_ended(exitcode)}


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "no result: the rank did not end"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if name == "SIGTERM":
            return "no result: stopped because another rank failed"
        if name == "SIGKILL":
            return "no result: killed by SIGKILL (the system's out-of-memory killer sends it)"
        return f"no result: killed by {name}"
    return f"no result: exited with code {exitcode}"


def _job(config: Config, results: list[dict[str, Any]], backend: str) -> TrialResult:
    """One TrialResult for the job: the worst rank's figures, every rank in ``ranks``."""
    ranks = tuple(
        replace(
            result_of(
                config,
                report_from_dict(r["report"]) if r.get("report") else None,
                r.get("device"),
                times=r.get("step_s_all", ()),
                notes=tuple(r.get("warnings", ())),
                status=r.get("status", "error"),
                error=r.get("error"),
            ),
            rank=r["rank"],
            own_peak_bytes=r.get("own_peak_bytes"),
        )
        for r in results
    )
    when = {r["rank"]: r.get("failed_at", float("inf")) for r in results}
    failed = sorted((r for r in ranks if r.status != "ok"), key=lambda r: when[r.rank])
    if failed:
        first = next((r for r in failed if r.status == "oom"), failed[0])
        worst: TrialResult = replace(first, error=f"rank {first.rank}: {first.error}")
    else:
        worst = max(ranks, key=lambda r: r.peak_allocated_bytes or 0)
    note = f"{config.world_size} ranks over {backend}"
    return replace(worst, rank=None, ranks=ranks, warnings=(note, *worst.warnings))


# -- a rank's side -----------------------------------------------------------------------------
def _release_replaced(originals: list[Any], model: Any) -> None:
    """Give back the memory of the parameters the strategy replaced (FSDP2's unsharded ones).

    In this forked rank the kernel's optimizer and the trial's saved state still hold them;
    a job that shards its model before it builds its optimizer holds only the shards.
    """
    import torch

    kept = {id(p) for p in model.parameters()}
    for p in originals:
        if id(p) not in kept:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)


def _rank_main(
    rank: int, workload: Workload, config: Config, folder: str, backend: str, gpus: int
) -> None:
    """One rank, in its forked process: measure, then write the result, whatever happened."""
    import torch

    # The kernel's OpenMP threads are not in a forked child, and a parallel region that looks
    # for them waits forever: a rank computes on the host with one thread.
    torch.set_num_threads(1)
    stop_inherited()  # a `%%gpumem` cell's recording, copied from the kernel
    device = rank_device(workload.device, rank, gpus)
    out: dict[str, Any] = {"rank": rank, "device": str(device)}
    try:
        out.update(_measure_rank(rank, workload, config, folder, backend, device))
    except BaseException as exc:
        out.update(status=status_of(exc), error=f"{type(exc).__name__}: {exc}")
    if out.get("status", "error") != "ok":
        out["failed_at"] = time.time()  # the first to fail is the cause; the rest, its echo
    write_json(Path(folder) / f"rank-{rank}.json", out)


def _measure_rank(
    rank: int, workload: Workload, config: Config, folder: str, backend: str, device: Any
) -> Mapping[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.utils._pytree import tree_map

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    store = "file://" + os.path.join(folder, "store")
    dist.init_process_group(backend, init_method=store, rank=rank, world_size=config.world_size)
    try:
        model, optimizer = workload.model, workload.optimizer
        for p in model.parameters():
            p.grad = None
        if optimizer is not None:
            optimizer.state.clear()
        model.to(device)
        batch = tree_map(
            lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, workload.batch
        )
        own = replace(workload, batch=batch, device=device)
        originals = list(model.parameters())
        applied = apply_config(model, config, optimizer)
        if applied.optimizer is not optimizer:
            _release_replaced(originals, applied.model)

        def reset_peak() -> None:
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)

        result = measure_steps(own, config, applied, before_measured=reset_peak)
        own_peak = torch.cuda.max_memory_allocated(device) if cuda else None
        return {
            "report": result.report.to_dict() if result.report is not None else None,
            "status": result.status,
            "error": result.error,
            "step_s_all": list(result.step_s_all),
            "warnings": list(result.warnings),
            "own_peak_bytes": own_peak,
        }
    finally:
        with contextlib.suppress(Exception):
            time.sleep(SETTLE_S)  # gloo's threads release a finished collective's state
            dist.destroy_process_group()
