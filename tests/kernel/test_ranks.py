"""Worker processes a `%%gpumem` cell starts report one row each, on the CPU with ``gloo``.

Each rank also measures itself with a nested ``measure`` of its whole body, recorded in
detail throughout, and passes its figure back through a file: the cell's row for the rank
must say the same.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

SETUP = """
import json, os, signal, time
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
from jupyter_gpumem.session import MeasureOptions, RecordOptions, measure

OWN = MeasureOptions(recording=RecordOptions(detail_steps=None), log=False, ranks=False)

# A worker forked after the parent ran OpenMP-parallel ops hangs in its own (libgomp is not
# fork-safe; a plain cell hangs as well): workers use one thread, as DataLoader workers do.

def own_figure(rank, m, **more):
    with open(os.path.join(TMP, f"own-{rank}.json"), "w") as f:
        json.dump({"peak": m.report.peak_allocated_bytes, "pid": os.getpid(), **more}, f)

def train(rank, world):
    torch.set_num_threads(1)
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    modes = len(_get_current_dispatch_mode_stack())  # the kernel's recording is stopped here
    with measure(OWN) as m:
        store = "file://" + os.path.join(TMP, "store")
        dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8))
        model = nn.parallel.DistributedDataParallel(net)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(3):  # rank 1 has the larger batch, so the larger peak
            model(torch.randn(32 * (rank + 1), 64)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        settles = dist.destroy_process_group is not dist.distributed_c10d.destroy_process_group
        dist.destroy_process_group()
    own_figure(rank, m, modes=modes, settles=settles)

def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True

def fails(rank):
    torch.set_num_threads(1)
    with measure(OWN) as m:
        x = torch.ones(1000 * (rank + 1))
    own_figure(rank, m)
    if rank == 1:  # after rank 0 has ended, so that start_processes has nothing to stop
        deadline = time.time() + 20
        while time.time() < deadline and not os.path.exists(os.path.join(TMP, "own-0.json")):
            time.sleep(0.02)
        pid = json.load(open(os.path.join(TMP, "own-0.json")))["pid"]
        while time.time() < deadline and not gone(pid):
            time.sleep(0.02)
        raise ValueError("rank 1 fails")

def killed(rank):
    torch.set_num_threads(1)
    x = torch.ones(1000)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)

def sleeps(rank):
    time.sleep(60)
"""


@pytest.fixture
def ranks_shell(shell: InteractiveShell, tmp_path: Path) -> InteractiveShell:
    shell.user_ns["TMP"] = str(tmp_path)
    result = shell.run_cell(SETUP)
    assert result.success, result.error_in_exec
    return shell


def _own(tmp_path: Path, rank: int) -> dict[str, int]:
    """What rank ``rank`` measured for itself."""
    return json.loads((tmp_path / f"own-{rank}.json").read_text())  # type: ignore[no-any-return]


def _untouched() -> None:
    """Everything the collection changed for the cell is as it was."""
    spawn = sys.modules["torch.multiprocessing.spawn"]
    assert spawn._wrap.__module__ == "torch.multiprocessing.spawn"
    assert spawn.ProcessContext.__init__.__module__ == "torch.multiprocessing.spawn"
    assert "JUPYTER_GPUMEM_RANKS_DIR" not in os.environ
    assert dist.destroy_process_group is dist.distributed_c10d.destroy_process_group


@pytest.mark.timeout(60)
def test_forked_ddp_ranks_report_the_peaks_they_measure_themselves(
    ranks_shell: InteractiveShell, tmp_path: Path
) -> None:
    result = ranks_shell.run_cell(
        "%%gpumem -o r\nmp.start_processes(train, args=(2,), nprocs=2, start_method='fork')"
    )
    assert result.success, result.error_in_exec
    r = ranks_shell.user_ns["r"]
    assert [k.rank for k in r.ranks] == [0, 1]
    for k in r.ranks:
        own = _own(tmp_path, k.rank)
        assert k.status == "ok" and k.pid == own["pid"] != os.getpid()
        assert own["modes"] == 1  # the rank's own recording only, not the kernel's copy
        assert own["settles"]  # destroy_process_group lets gloo's threads finish first
        assert k.device == "cpu"
        assert k.peak_allocated_bytes == own["peak"]
        assert sum(k.breakdown.values()) == k.peak_allocated_bytes
        assert k.breakdown["parameters"] > 0 and k.breakdown["optimizer_state"] > 0
        # DDP's gradient buckets, made by the rank's own DDP(): one flat copy of every gradient.
        # A peak inside DDP's own bookkeeping may also hold the few bytes of its small
        # collectives (seen once: 4 bytes, at step 1 where DDP rebuilds its buckets).
        extra = k.breakdown["communication"] - k.breakdown["parameters"]
        assert 0 <= extra < 1024, k.breakdown
    assert r.worst_rank is r.ranks[1]
    wire = r.to_dict()
    assert [k["rank"] for k in wire["ranks"]] == [0, 1] and wire["worst_rank"] == 1
    assert wire["ranks"][1]["devices"][0]["peak_allocated_bytes"] == _own(tmp_path, 1)["peak"]
    text = str(r)
    assert "ranks: 2 worker processes; the worst (*) is rank 1" in text
    assert re.search(rf"^\*\s+1\s+{r.ranks[1].pid}\s+cpu\s", text, re.M), text
    assert "jp-gpumem-worst-rank" in r._repr_mimebundle_()["text/html"]
    _untouched()


def _error(shell: InteractiveShell, source: str) -> BaseException:
    result = shell.run_cell(source)
    assert not result.success
    assert result.error_in_exec is not None
    return result.error_in_exec


@pytest.mark.timeout(60)
def test_a_rank_that_raises_keeps_its_row_and_the_cell_fails_as_the_plain_cell(
    ranks_shell: InteractiveShell, tmp_path: Path
) -> None:
    launch = "mp.start_processes(fails, nprocs=2, start_method='fork')"
    plain = _error(ranks_shell, launch)
    for own in tmp_path.glob("own-*.json"):  # rank 1 waits for this run's rank 0, not the last's
        own.unlink()
    measured = _error(ranks_shell, f"%%gpumem -o r\n{launch}")
    assert type(measured) is type(plain)
    assert str(measured).strip().splitlines()[-1] == str(plain).strip().splitlines()[-1]
    assert measured.error_index == plain.error_index == 1  # type: ignore[attr-defined]
    r = ranks_shell.user_ns["r"]
    assert r.status == "error"
    assert [k.rank for k in r.ranks] == [0, 1]
    ok, failed = r.ranks
    assert ok.status == "ok" and ok.peak_allocated_bytes == _own(tmp_path, 0)["peak"]
    assert failed.status == "error" and failed.error == "ValueError: rank 1 fails"
    assert failed.peak_allocated_bytes == _own(tmp_path, 1)["peak"]
    assert f"rank 1 (pid {failed.pid}) failed: ValueError: rank 1 fails" in str(r)
    _untouched()


@pytest.mark.timeout(60)
def test_a_killed_rank_gets_a_row_that_says_so(ranks_shell: InteractiveShell) -> None:
    error = _error(
        ranks_shell, "%%gpumem -o r\nmp.start_processes(killed, nprocs=2, start_method='fork')"
    )
    assert "SIGKILL" in str(error)
    r = ranks_shell.user_ns["r"]
    dead = next(k for k in r.ranks if k.rank == 1)
    assert dead.status == "error" and dead.devices == () and dead.pid is not None
    assert dead.error is not None and dead.error.startswith("no report: killed by SIGKILL")
    assert re.search(r"^\s+1\s+\d+\s+-\s+-\s+-\s+-\s+no report: killed by SIGKILL", str(r), re.M)


@pytest.mark.timeout(60)
def test_a_job_left_running_does_not_hold_the_report(ranks_shell: InteractiveShell) -> None:
    t0 = time.perf_counter()
    result = ranks_shell.run_cell(
        "%%gpumem -o r\nctx = mp.start_processes(sleeps, nprocs=2, join=False, start_method='fork')"
    )
    took = time.perf_counter() - t0
    ctx = ranks_shell.user_ns["ctx"]
    try:
        assert result.success, result.error_in_exec
        assert took < 20
        r = ranks_shell.user_ns["r"]
        assert [(k.rank, k.status) for k in r.ranks] == [(0, "running"), (1, "running")]
        assert sorted(k.pid for k in r.ranks) == sorted(ctx.pids())
        note = next(n for n in r.notes if "still ran when the cell ended" in n)
    finally:
        for process in ctx.processes:
            process.terminate()
            process.join(10)
    folder = re.search(r"(\S*gpumem-ranks-[0-9a-f]+)", note)
    assert folder is not None
    shutil.rmtree(folder.group(1), ignore_errors=True)
    _untouched()


SPAWNED = """
import json, os, torch
from jupyter_gpumem.session import MeasureOptions, RecordOptions, measure

def allocate(rank, tmp):
    with measure(MeasureOptions(recording=RecordOptions(detail_steps=None), log=False, ranks=False)) as m:
        x = torch.ones(250_000 * (rank + 1))
        y = x * 2
    with open(os.path.join(tmp, f"own-{rank}.json"), "w") as f:
        json.dump({"peak": m.report.peak_allocated_bytes, "pid": os.getpid()}, f)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "launch",
    [
        "mp.spawn(spawned_job.allocate, args=(TMP,), nprocs=2)",
        "mp.start_processes(spawned_job.allocate, args=(TMP,), nprocs=2, start_method='forkserver')",
    ],
    ids=["spawn", "forkserver"],
)
def test_spawned_ranks_report_too(
    shell: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launch: str
) -> None:
    # The test shell's __main__ lacks the __spec__ that spawn reads (a kernel's has one).
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    (tmp_path / "spawned_job.py").write_text(textwrap.dedent(SPAWNED))
    sys.path.insert(0, str(tmp_path))
    try:
        shell.user_ns["TMP"] = str(tmp_path)
        result = shell.run_cell(
            "%%gpumem -o r\nimport torch.multiprocessing as mp, spawned_job\n" + launch
        )
    finally:
        sys.path.remove(str(tmp_path))
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    assert [k.rank for k in r.ranks] == [0, 1]
    for k in r.ranks:
        assert k.peak_allocated_bytes == _own(tmp_path, k.rank)["peak"] >= 2_000_000 * (k.rank + 1)
    _untouched()


SCRIPT = """
import torch, jupyter_gpumem
with jupyter_gpumem.record():
    x = torch.ones(100_000)
"""


@pytest.mark.timeout(60)
def test_record_in_a_script_run_from_the_cell_reports_into_it(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    shell.user_ns["SCRIPT"] = str(script)
    result = shell.run_cell(
        "%%gpumem -o r\nimport os, subprocess, sys\n"
        "subprocess.run([sys.executable, SCRIPT], check=True, env={**os.environ, 'RANK': '3'})"
    )
    assert result.success, result.error_in_exec
    (rank,) = shell.user_ns["r"].ranks
    assert rank.rank == 3 and rank.status == "ok" and rank.peak_allocated_bytes == 400_000


def test_record_and_load_reports_outside_a_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jupyter_gpumem

    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        with jupyter_gpumem.record(tmp_path / "run.json") as m:
            x = torch.ones(1000 * (rank + 1))
        assert m.report is not None and m.report.rank == rank
        del x
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.rank0.json", "run.rank1.json"]
    r = jupyter_gpumem.load_reports(tmp_path / "run.json")
    assert r.name == "run" and [k.rank for k in r.ranks] == [0, 1]
    assert [k.peak_allocated_bytes for k in r.ranks] == [4000, 8000]
    assert r.worst_rank is r.ranks[1]
    globbed = jupyter_gpumem.load_reports(str(tmp_path / "run.rank*.json"))
    assert [k.pid for k in globbed.ranks] == [k.pid for k in r.ranks]
    assert jupyter_gpumem.load_reports(tmp_path).ranks == r.ranks
    with pytest.raises(FileNotFoundError, match="no report files"):
        jupyter_gpumem.load_reports(tmp_path / "nothing.json")
    with pytest.raises(ValueError, match="folder does not exist"):
        jupyter_gpumem.record(tmp_path / "missing" / "run.json").__enter__()


def test_a_plain_fork_after_a_measured_one_still_works(ranks_shell: InteractiveShell) -> None:
    assert ranks_shell.run_cell(
        "%%gpumem\nmp.start_processes(killed, nprocs=1, start_method='fork')"
    ).success
    assert ranks_shell.run_cell("mp.start_processes(killed, nprocs=1, start_method='fork')").success
    _untouched()


FSDP = """
from torch.distributed.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh

def sharded(rank, world):
    torch.set_num_threads(1)
    store = "file://" + os.path.join(TMP, "store")
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 255), nn.GELU(), nn.Linear(255, 512), nn.Linear(512, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        model(torch.randn(16, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    local = lambda t: t._local_tensor.untyped_storage()
    shards = {local(p).data_ptr(): local(p).nbytes() for p in model.parameters()}
    state = sum(local(v).nbytes() for s in opt.state.values() for v in s.values() if v.dim())
    with open(os.path.join(TMP, f"shard-{rank}.json"), "w") as f:
        json.dump({"shard": sum(shards.values()), "state": state}, f)
    dist.destroy_process_group()
"""


@pytest.mark.timeout(60)
def test_fsdp2_ranks_count_their_own_shards(ranks_shell: InteractiveShell, tmp_path: Path) -> None:
    if not hasattr(pytest.importorskip("torch.distributed.fsdp"), "fully_shard"):
        pytest.skip("needs FSDP2 (fully_shard)")
    assert ranks_shell.run_cell(FSDP).success
    result = ranks_shell.run_cell(
        "%%gpumem -o r\nmp.start_processes(sharded, args=(2,), nprocs=2, start_method='fork')"
    )
    assert result.success, result.error_in_exec
    r = ranks_shell.user_ns["r"]
    assert [k.rank for k in r.ranks] == [0, 1]
    for k in r.ranks:
        own = json.loads((tmp_path / f"shard-{k.rank}.json").read_text())
        assert k.breakdown["parameters"] == own["shard"]  # the padded local shards, no more
        assert k.breakdown["optimizer_state"] >= own["state"]  # exp_avg, exp_avg_sq (and steps)
        # FSDP2 frees each unsharded parameter after use (storage.resize_(0), seen as a free):
        # the breakdown sums to the peak with no unsharded copy left over
        assert sum(k.breakdown.values()) == k.peak_allocated_bytes


@pytest.mark.timeout(60)
def test_a_ranks_tensors_are_named_from_its_function_and_its_lines_are_cell_lines(
    ranks_shell: InteractiveShell,
) -> None:
    assert ranks_shell.run_cell(KEEPS).success
    result = ranks_shell.run_cell(
        "%%gpumem -o r\nmp.start_processes(keeps, args=(2,), nprocs=2, start_method='fork')"
    )
    assert result.success, result.error_in_exec
    for k in ranks_shell.user_ns["r"].ranks:
        alive = [t for t in k.tensors if t.alive]
        names = {t.name for t in alive}
        # the DDP model and Adam outlive the function in KEPT; the function named them
        assert {"net.0.weight", "net.2.weight"} <= names, names  # the innermost frame's name
        assert any(n and n.startswith("opt.state[") for n in names), names
        lines = {t.line for t in k.tensors}
        assert not any("<ipython-input" in (line or "") for line in lines), lines
        # the function's own lines, in the cell that defined it
        assert any(re.fullmatch(r"cell \[\d+\] line (7|8|11|12)", line or "") for line in lines), (
            lines
        )


KEEPS = """
KEPT = []

def keeps(rank, world):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(TMP, "store2"),
                            rank=rank, world_size=world)
    net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8))
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(32, 64)).pow(2).mean().backward()
        opt.step()
    KEPT.append((model, opt))  # held past the function: the rank's report lists them
    dist.barrier()
"""
