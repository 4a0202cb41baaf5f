"""A parallel configuration measured for real: N rank processes started from the kernel, each measured.

``Trial.run(Config(parallel=..., world_size=N))`` starts N processes from the kernel. Each is
one rank: it joins a process group (NCCL with one GPU per rank where there are N GPUs, gloo
with the ranks sharing the devices where there are fewer, gloo on the CPU), moves its copy of
the model, optimizer and batch to its device, applies the configuration (its strategy last,
see :mod:`~jupyter_gpumem.techniques.parallel`) and runs the trial's warm-up and measured steps
under the same measurement as a one-process trial. On a GPU it also reads its own
``torch.cuda.max_memory_allocated()`` over the measured steps. Each rank writes its result
into a folder of its own, which the kernel reads when every rank has ended.

How the ranks start depends on the kernel (:func:`start_method`):

- forked, where the kernel has not initialised CUDA: nothing is pickled, and a child's pages
  are the kernel's until it writes them, so this is the cheaper way;
- spawned, where the kernel has initialised CUDA (a kernel that has run anything on the GPU):
  a forked child could not use CUDA then. Each rank is a fresh interpreter that gets the
  workload, the configuration and the kernel's random state pickled by value with cloudpickle
  (a loss function or model class defined in the notebook works), and the tensors' bytes
  through one block of shared host memory (:mod:`~jupyter_gpumem.tuner.rank_payload`).

Either way the kernel's tensors are only read. If one rank fails, the others are stopped, as
``torch.multiprocessing`` does, and the result says which rank failed and how.

Known limitations:
- Each rank's batch is the trial's batch: the same shapes on every rank, as a sharded data
  loader gives.
- A rank killed by a signal (the system's out-of-memory killer) writes nothing; its row says
  how it ended.
- A spawned rank starts a new interpreter and imports torch (seconds), and the kernel holds a
  host copy of the state while the ranks run; an object that cannot be pickled stops the run
  before any rank starts, with the way to fork instead.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jupyter_gpumem.report.record import report_from_dict, status_of
from jupyter_gpumem.techniques import Config, apply_config
from jupyter_gpumem.techniques.config import MAX_WORLD_SIZE
from jupyter_gpumem.tracking.devices import cuda_count
from jupyter_gpumem.tracking.ranks import SETTLE_S, stop_inherited, write_json
from jupyter_gpumem.tuner.rank_payload import Payload, pack, unpack
from jupyter_gpumem.tuner.results import TrialResult, result_of
from jupyter_gpumem.tuner.rng import rng_state, set_rng_state
from jupyter_gpumem.tuner.steps import measure_steps
from jupyter_gpumem.tuner.workload import Workload

POLL_S = 0.05
MAX_FORKED = 64  # ranks run() starts at most
NOT_PICKLED = (
    "CUDA is initialised in this kernel, so the ranks start in fresh processes and get the "
    "model, optimizer, batch and loss function pickled (cloudpickle), and {error}. Make them "
    "picklable, or restart the kernel, build them on the CPU and pass device='cuda' to Trial: "
    "the ranks are then forked from the kernel and nothing is pickled"
)
Collect = Callable[[], Any]  # runs in each rank after its steps; returns something JSON-able


@dataclass(frozen=True)
class RankRun:
    """A parallel configuration's job: its result, and what ``collect`` gave in each rank."""

    result: TrialResult
    collected: tuple[Any, ...]  # by rank; None where the rank gave nothing


@dataclass(frozen=True)
class _Job:
    """What every rank runs; a spawned rank also gets the kernel's random state."""

    workload: Workload
    config: Config
    collect: Collect | None = None
    rng: dict[str, Any] | None = None


def run_ranks(workload: Workload, config: Config) -> TrialResult:
    """Start ``config.world_size`` ranks that each measure ``workload`` under ``config``."""
    return run_job(workload, config).result


def run_job(workload: Workload, config: Config, collect: Collect | None = None) -> RankRun:
    """:func:`run_ranks`, with ``collect()`` called in each rank after steps that went well."""
    import torch

    device = workload.device
    check_forkable(config.world_size)
    gpus = cuda_count(torch) if device.type == "cuda" else 0
    backend = "nccl" if device.type == "cuda" and gpus >= config.world_size else "gloo"
    method = start_method(device)
    job = _Job(workload, config, collect)
    carried: _Job | Payload = job
    if method == "spawn":
        try:
            carried = pack(replace(job, rng=rng_state(torch)))
        except Exception as exc:  # whatever pickling an object of the user's raises
            raise RuntimeError(NOT_PICKLED.format(error=f"{type(exc).__name__}: {exc}")) from exc
    folder = tempfile.mkdtemp(prefix="gpumem-trial-ranks-")
    try:
        ended = _start_and_wait(method, carried, device, config, folder, backend, gpus)
        results = [
            _read(folder, rank, config, ended.get(rank)) for rank in range(config.world_size)
        ]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return RankRun(_job(config, results, backend), tuple(r.get("collected") for r in results))


def start_method(device: Any) -> str:
    """How the ranks start: ``"fork"`` where it is safe, the cheaper way; ``"spawn"`` where the
    kernel has initialised CUDA and the ranks run on it, which a forked child could not use."""
    import torch

    return "spawn" if device.type == "cuda" and torch.cuda.is_initialized() else "fork"


def check_forkable(world_size: int) -> None:
    """ValueError for more ranks than this machine lets the kernel start, before any starts."""
    if world_size > MAX_FORKED:
        raise ValueError(
            f"run() starts one process per rank, each with its own copy of the model: at most "
            f"{MAX_FORKED} ranks, got {world_size}; estimate() plays up to {MAX_WORLD_SIZE}"
        )
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and world_size >= soft:
        raise ValueError(
            f"run() starts one process per rank, and this machine's process limit (ulimit -u) "
            f"is {soft}: {world_size} ranks cannot start"
        )


def rank_device(device: Any, rank: int, gpus: int) -> Any:
    """Rank ``rank``'s device: its own GPU where there are enough, else shared in turn."""
    import torch

    if device.type != "cuda":
        return device
    return torch.device("cuda", rank % max(1, gpus))


# -- the kernel's side -------------------------------------------------------------------------
def _start_and_wait(
    method: str,
    carried: _Job | Payload,
    device: Any,
    config: Config,
    folder: str,
    backend: str,
    gpus: int,
) -> dict[int, int | None]:
    """Start the ranks and wait for all; stop the rest when one fails. Exit codes by rank."""
    context: Any = multiprocessing.get_context(method)  # "fork" or "spawn": both have Process
    processes = [
        context.Process(
            target=_rank_main,
            args=(rank, carried, device, folder, backend, gpus),
            name=f"gpumem-rank-{rank}",
            daemon=True,
        )
        for rank in range(config.world_size)
    ]
    started: list[Any] = []
    try:
        with _main_left_behind() if method == "spawn" else contextlib.nullcontext():
            for rank, p in enumerate(processes):
                try:
                    p.start()
                except OSError as exc:  # the process limit, or memory to copy the kernel
                    raise RuntimeError(
                        f"could not start rank {rank} of {config.world_size}: {exc}; the "
                        "ranks already started were stopped"
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


@contextlib.contextmanager
def _main_left_behind() -> Iterator[None]:
    """Spawned ranks do not run the kernel's ``__main__`` again: what they need comes pickled
    by value, and a notebook's namespace has no spec or file that multiprocessing could run
    (it fails on IPython's, which has no ``__spec__``)."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is None:
            del sys.modules["__main__"]
        else:
            sys.modules["__main__"] = main


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
    note = f"{config.world_size} rank{'' if config.world_size == 1 else 's'} over {backend}"
    return replace(worst, rank=None, ranks=ranks, warnings=(note, *worst.warnings))


# -- a rank's side -----------------------------------------------------------------------------
def _release_replaced(originals: list[Any], model: Any) -> None:
    """Give back the memory of the parameters the strategy replaced (FSDP2's unsharded ones).

    In a rank the optimizer as the kernel built it still holds them (and in a forked one, the
    trial's saved state); a job that shards its model before it builds its optimizer holds
    only the shards.
    """
    import torch

    kept = {id(p) for p in model.parameters()}
    for p in originals:
        if id(p) not in kept:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)


def _rank_main(
    rank: int, carried: _Job | Payload, device: Any, folder: str, backend: str, gpus: int
) -> None:
    """One rank, in its own process: measure, then write the result, whatever happened."""
    import torch

    # The kernel's OpenMP threads are not in a forked child, and a parallel region that looks
    # for them waits forever: a rank computes on the host with one thread (spawned ones too,
    # so that both ways time alike).
    torch.set_num_threads(1)
    stop_inherited()  # a `%%gpumem` cell's recording, copied from the kernel
    device = rank_device(device, rank, gpus)
    out: dict[str, Any] = {"rank": rank, "device": str(device)}
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)  # before anything lands on it: no context elsewhere
        job = carried if isinstance(carried, _Job) else _unpacked(carried, device)
        out.update(_measure_rank(rank, job, folder, backend, device))
    except BaseException as exc:
        out.update(status=status_of(exc), error=f"{type(exc).__name__}: {exc}")
    if out.get("status", "error") != "ok":
        out["failed_at"] = time.time()  # the first to fail is the cause; the rest, its echo
    write_json(Path(folder) / f"rank-{rank}.json", out)


def _unpacked(payload: Payload, device: Any) -> _Job:
    """A spawned rank's job, its random generators set as the kernel's were."""
    import torch

    try:
        job: _Job = unpack(payload, device)
    except Exception as exc:  # whatever unpickling the user's objects raises
        raise RuntimeError(
            f"this spawned rank could not load what the kernel sent: {type(exc).__name__}: {exc}"
        ) from exc
    if job.rng is not None:
        state = dict(job.rng)
        cuda = state.pop("cuda", None)
        set_rng_state(torch, state)
        if cuda is not None and device.type == "cuda" and device.index < len(cuda):
            torch.cuda.set_rng_state(cuda[device.index], device)  # its own GPU's alone
    return job


def _measure_rank(
    rank: int, job: _Job, folder: str, backend: str, device: Any
) -> Mapping[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.utils._pytree import tree_map

    workload, config = job.workload, job.config
    cuda = device.type == "cuda"
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

        peaks: list[int] = []  # read when the measured steps end, before the timed ones

        def read_peak() -> None:
            if cuda:
                peaks.append(torch.cuda.max_memory_allocated(device))

        result = measure_steps(
            own, config, applied, before_measured=reset_peak, after_measured=read_peak
        )
        if cuda and not peaks:  # a failed step: the peak up to it
            read_peak()
        own_peak = peaks[0] if peaks else None
        return {
            "report": result.report.to_dict() if result.report is not None else None,
            "status": result.status,
            "error": result.error,
            "step_s_all": list(result.step_s_all),
            "warnings": list(result.warnings),
            "own_peak_bytes": own_peak,
            "collected": job.collect() if job.collect and result.status == "ok" else None,
        }
    finally:
        with contextlib.suppress(Exception):
            time.sleep(SETTLE_S)  # gloo's threads release a finished collective's state
            dist.destroy_process_group()
