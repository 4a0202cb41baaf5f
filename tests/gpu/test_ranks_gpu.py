"""Multi-GPU jobs forked from a `%%gpumem` cell: every rank reports, exact to the byte.

The jobs run with two ranks on two GPUs, and with one rank where there is one GPU: NCCL,
DDP's buckets and FSDP's collectives are all there with one rank too.

One fresh interpreter runs the cells (CUDA must be untouched in the parent for
``start_method="fork"``; the pytest process has initialised it): a DDP job on NCCL whose
ranks pass back their own ``torch.cuda.max_memory_allocated()``, an FSDP2 (``fully_shard``)
job whose ranks pass back their shards' bytes, and a plain fork after both. The two-rank report JSON is written to ``$GPUMEM_OUT`` when set, the
source of tests/fixtures/report_two_ranks.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, tempfile
    from IPython.core.interactiveshell import InteractiveShell
    world = int(sys.argv[1])
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    ip.user_ns["TMP"] = tempfile.mkdtemp()
    setup = ip.run_cell('''
    import json, os, torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp

    def start(name, rank, world):
        torch.cuda.set_device(rank)
        store = "file://" + os.path.join(TMP, f"store-{name}")
        dist.init_process_group("nccl", init_method=store, rank=rank, world_size=world)

    def own(name, rank, **figures):
        with open(os.path.join(TMP, f"{name}-{rank}.json"), "w") as f:
            json.dump(figures, f)

    def ddp(rank, world):
        start("ddp", rank, world)
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
        model = nn.parallel.DistributedDataParallel(net, device_ids=[rank])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(3):  # rank 1 has twice the batch, so the larger peak
            x = torch.randn(512 * (rank + 1), 1024, device="cuda")
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        dist.barrier()
        dist.destroy_process_group()
        own("ddp", rank, max_allocated=torch.cuda.max_memory_allocated(),
            max_reserved=torch.cuda.max_memory_reserved(), pid=os.getpid())

    def blocks_holding(storages):
        sizes = {}
        for seg in torch.cuda.memory._snapshot()["segments"]:
            for b in seg["blocks"]:
                if b["state"] == "active_allocated":
                    sizes[b["address"]] = b["size"]
        return sum(sizes[ptr] for ptr in storages)

    def fsdp(rank, world):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        start("fsdp", rank, world)
        mesh = init_device_mesh("cuda", (world,))
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)], nn.Linear(1024, 8)).cuda()
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(3):
            model(torch.randn(256, 1024, device="cuda")).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        local = lambda t: t._local_tensor.untyped_storage()
        shards = {local(p).data_ptr(): local(p).nbytes() for p in model.parameters()}
        states = {local(v).data_ptr(): local(v).nbytes()
                  for s in opt.state.values() for v in s.values() if hasattr(v, "_local_tensor")}
        own("fsdp", rank, shard_bytes=sum(shards.values()), shard_blocks=blocks_holding(shards),
            state_bytes=sum(states.values()), state_blocks=blocks_holding(states),
            full_bytes=sum(4 * p.numel() for p in model.parameters()),
            max_allocated=torch.cuda.max_memory_allocated())
        dist.barrier()
        dist.destroy_process_group()

    def oom(rank, world):
        torch.cuda.set_device(rank)
        if rank == world - 1:  # the last rank asks for four times what is free
            keep = torch.empty(256 * 2**20, device="cuda")
            free, _ = torch.cuda.mem_get_info()
            own("oom", rank, free=free)
            huge = torch.empty(free * 4, dtype=torch.uint8, device="cuda")

    def stray(rank, world):
        start("stray", rank, world)
        keep = torch.empty(64 * 2**20 * (rank + 1), device="cuda")  # 256 MiB more per rank
        if rank:  # and 128 MiB on rank 0's GPU, as code that names "cuda:0" leaves there
            left = torch.empty(32 * 2**20, device="cuda:0")
        own("stray", rank, pid=os.getpid())
        dist.barrier()
        dist.destroy_process_group()

    def touch(rank):
        x = torch.randn(1024, 1024, device=f"cuda:{rank}")
        assert (x @ x).isfinite().all()
    ''')
    assert setup.success, setup.error_in_exec
    out = {}
    for name in ("ddp", "fsdp", "stray"):
        result = ip.run_cell(
            f"%%gpumem -o r_{name} --name {name}\\n"
            f"mp.start_processes({name}, args=({world},), nprocs={world}, start_method='fork')"
        )
        assert result.success, result.error_in_exec
        r = ip.user_ns["r_" + name]
        print(r)
        own = [json.load(open(os.path.join(ip.user_ns["TMP"], f"{name}-{k}.json")))
               for k in range(world)]
        out[name] = {"report": r.to_dict(), "own": own}
    failed = ip.run_cell(
        f"%%gpumem -o r_oom --name oom\\n"
        f"mp.start_processes(oom, args=({world},), nprocs={world}, start_method='fork')"
    )
    r = ip.user_ns["r_oom"]
    print(r)
    out["oom"] = {
        "report": r.to_dict(),
        "text": str(r),
        "error": type(failed.error_in_exec).__name__,
        "own": json.load(open(os.path.join(ip.user_ns["TMP"], f"oom-{world - 1}.json"))),
    }
    import torch
    out["kernel_cuda_initialized"] = torch.cuda.is_initialized()
    plain = ip.run_cell(f"mp.start_processes(touch, nprocs={world}, start_method='fork')")
    out["plain_fork_after"] = plain.success
    out["plain_error"] = repr(plain.error_in_exec)
    print("RESULT " + json.dumps(out))
    """
)


def _run(world: int) -> dict[str, Any]:
    import torch

    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA devices")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(world)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    print(done.stdout)
    line = next(li for li in done.stdout.splitlines() if li.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def one_rank() -> dict[str, Any]:
    """The same jobs with one rank: NCCL, DDP's buckets and FSDP's collectives on one GPU."""
    return _run(1)


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    out = _run(2)
    target = os.environ.get("GPUMEM_OUT")
    if target:
        Path(target, "report_two_ranks.json").write_text(json.dumps(out["ddp"]["report"], indent=1))
        Path(target, "report_two_ranks_fsdp.json").write_text(
            json.dumps(out["fsdp"]["report"], indent=1)
        )
        Path(target, "ranks_gpu_figures.json").write_text(
            json.dumps({k: out[k]["own"] for k in ("ddp", "fsdp")}, indent=1)
        )
    return out


def _main(rank: dict[str, Any]) -> dict[str, Any]:
    (device,) = [d for d in rank["devices"] if d["device"] == rank["main_device"]]
    return device


def test_forked_ddp_ranks_are_exact_to_the_byte(job: dict[str, Any]) -> None:
    report, own = job["ddp"]["report"], job["ddp"]["own"]
    assert [k["rank"] for k in report["ranks"]] == [0, 1]
    for k, mine in zip(report["ranks"], own, strict=True):
        device = _main(k)
        assert k["status"] == "ok" and k["pid"] == mine["pid"]
        assert device["device"] == f"cuda:{k['rank']}"
        assert device["peak_allocated_bytes"] == mine["max_allocated"]
        assert device["peak_reserved_bytes"] == mine["max_reserved"]
        assert sum(device["breakdown"].values()) == device["peak_allocated_bytes"]
    assert report["worst_rank"] == 1
    assert job["kernel_cuda_initialized"] is False


def test_the_ranks_are_compared(job: dict[str, Any]) -> None:
    """In the stray job rank 1 holds 256 MiB more on its GPU than rank 0, and 128 MiB on rank
    0's; every rank's process holds a CUDA context and NCCL's buffers beside the allocator."""
    notes = job["ddp"]["report"]["notes"]
    outside = [n for n in notes if n.startswith("outside PyTorch's allocator")]
    assert outside and "rank 0 " in outside[0] and "rank 1 " in outside[0], notes
    # DDP's rank 1 runs twice the batch: 20 MiB more, within what a rank's own work varies by
    assert not [n for n in notes if "above the other ranks'" in n], notes
    notes = job["stray"]["report"]["notes"]
    above = [n for n in notes if n.startswith("rank 1's peak is 256 MiB above the other ranks'")]
    assert above, notes
    strays = [n for n in notes if "also allocated" in n]
    assert strays == [n for n in strays if n.startswith("rank 1 also allocated 128 MiB")], strays
    assert len(strays) == 1 and "not its own cuda:1" in strays[0]
    assert "torch.cuda.set_device(1)" in strays[0]


def test_fsdp2_ranks_count_their_shards_as_parameters(job: dict[str, Any]) -> None:
    report, own = job["fsdp"]["report"], job["fsdp"]["own"]
    for k, mine in zip(report["ranks"], own, strict=True):
        device = _main(k)
        assert device["peak_allocated_bytes"] == mine["max_allocated"]
        assert mine["shard_bytes"] < mine["full_bytes"]
        # the shards' own bytes; what their blocks hold beyond them is the allocator's slack
        assert device["breakdown"]["parameters"] == mine["shard_bytes"]
        assert device["breakdown"]["optimizer_state"] >= mine["state_bytes"]


def test_one_rank_counts_ddp_buckets_as_communication(one_rank: dict[str, Any]) -> None:
    (ddp,) = one_rank["ddp"]["report"]["ranks"]
    (mine,) = one_rank["ddp"]["own"]
    device = _main(ddp)
    assert device["peak_allocated_bytes"] == mine["max_allocated"]
    assert sum(device["breakdown"].values()) == device["peak_allocated_bytes"]
    breakdown = device["breakdown"]
    # DDP's gradient buckets: whole flat copies of every gradient. DDP rebuilds them after the
    # first step, so a later step's peak may hold the first set as well as the new one.
    sets, rest = divmod(breakdown["communication"], breakdown["parameters"])
    assert sets in (1, 2) and rest == 0, breakdown
    # At an optimizer peak every parameter has its gradient, and nothing else counts as one
    # (not the optimizer's temporaries, whose blocks the next step's gradients reuse). Where
    # NCCL's stream makes its cuBLAS workspace during backward, the peak is there instead,
    # with the second layer's gradients made and the first's not yet.
    assert device["peak_phase"] in ("optimizer", "backward"), device["peak_phase"]
    if device["peak_phase"] == "optimizer":
        assert breakdown["gradients"] == breakdown["parameters"]
    else:
        assert 0 < breakdown["gradients"] < breakdown["parameters"]
    (fsdp,) = one_rank["fsdp"]["report"]["ranks"]
    (mine,) = one_rank["fsdp"]["own"]
    device = _main(fsdp)
    assert device["peak_allocated_bytes"] == mine["max_allocated"]
    assert device["breakdown"]["parameters"] == mine["shard_bytes"] == mine["full_bytes"]
    assert device["peak_phase"] == "optimizer"
    assert device["breakdown"]["gradients"] == mine["shard_bytes"]
    assert device["breakdown"]["optimizer_state"] == mine["state_bytes"]
    assert one_rank["plain_fork_after"], one_rank["plain_error"]


def test_a_rank_that_runs_out_of_memory_keeps_its_row_and_says_so(one_rank: dict[str, Any]) -> None:
    oom = one_rank["oom"]
    assert oom["error"] == "ProcessRaisedException"  # what the plain cell raises
    assert oom["report"]["status"] == "oom"
    (row,) = oom["report"]["ranks"]
    assert row["status"] == "oom" and "OutOfMemoryError" in row["error"]
    device = _main(row)
    assert device["oom"]["requested_bytes"] >= 4 * oom["own"]["free"]
    assert sum(device["oom"]["breakdown"].values()) >= 256 * 2**20
    assert "out of memory asking for" in oom["text"]
    assert one_rank["plain_fork_after"], one_rank["plain_error"]


def test_a_plain_fork_after_the_measured_jobs_still_works(job: dict[str, Any]) -> None:
    assert job["plain_fork_after"], job["plain_error"]
