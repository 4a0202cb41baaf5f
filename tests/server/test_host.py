"""A kernel's host memory (RSS of its process tree), read from /proc, with and without a GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpumem.server import host
from jupyter_gpumem.server.host import kernel_host, meminfo, rss_bytes
from tests.support.nvml_fake import DEFAULT_SPEC

API = ("jupyter-gpumem", "api")
NO_GPU = {**DEFAULT_SPEC, "init_error": "library_not_found"}
KEYS = {
    "kernel_id",
    "pid",
    "pids",
    "rss_bytes",
    "host_total_bytes",
    "host_available_bytes",
    "reason",
}

linux_only = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")


def kernel_with_pid(pid: int | None) -> Any:
    """The part of a kernel manager that `server_side_pid` reads."""
    return SimpleNamespace(provisioner=SimpleNamespace(process=SimpleNamespace(pid=pid)))


async def host_of(jp_fetch: Any, kernel_id: str) -> dict[str, Any]:
    response = await jp_fetch(*API, "kernels", kernel_id, "host")
    assert response.code == 200
    assert response.headers["Cache-Control"] == "no-store"
    return json.loads(response.body)


@linux_only
@pytest.mark.parametrize("fake_spec", [DEFAULT_SPEC, NO_GPU], ids=["gpu", "no-gpu"])
async def test_a_real_kernel_has_its_rss_with_or_without_a_gpu(
    jp_fetch: Any, jp_serverapp: Any
) -> None:
    response = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    kernel_id = json.loads(response.body)["id"]
    pid = jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner.process.pid
    body = await host_of(jp_fetch, kernel_id)
    assert set(body) == KEYS
    assert (body["kernel_id"], body["pid"], body["reason"]) == (kernel_id, pid, None)
    assert pid in body["pids"]
    # A Python process holds megabytes, and never more than the machine has.
    assert 4 * 2**20 < body["rss_bytes"] <= body["host_total_bytes"]
    assert 0 < body["host_available_bytes"] <= body["host_total_bytes"]
    assert all(isinstance(body[k], int) for k in ("rss_bytes", "host_total_bytes"))


async def test_unknown_kernel_is_404(jp_fetch: Any) -> None:
    with pytest.raises(HTTPClientError) as error:
        await jp_fetch(*API, "kernels", "no-such-kernel", "host")
    assert error.value.code == 404


@linux_only
def test_the_tree_is_summed_over_the_kernel_and_its_children() -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, time; p = subprocess.Popen(['sleep', '30']); "
            "print(p.pid, flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    child = None
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        # Until it has exec'd, the child is a copy of the parent Python and its RSS moves.
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}/comm").read_text().strip() != "sleep":
            assert time.monotonic() < deadline, "the child never became `sleep`"
            time.sleep(0.01)
        # Sleeping processes barely change, but the parent may still be settling: compare
        # the tree's sum with the processes read right after it, until two reads agree.
        for _ in range(50):
            answer = kernel_host("k", kernel_with_pid(parent.pid))
            each = [rss_bytes(p) for p in answer.pids]
            assert None not in each and answer.rss_bytes is not None
            drift = abs(answer.rss_bytes - sum(e for e in each if e is not None))
            if drift < 64 * 2**10:
                break
            time.sleep(0.05)
        assert answer.pids == tuple(sorted((parent.pid, child)))
        assert drift < 64 * 2**10
    finally:
        if child is not None:
            os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()


@linux_only
def test_an_exited_kernel_or_a_remote_one_is_null_with_a_reason() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    answer = kernel_host("k", kernel_with_pid(gone.pid))
    assert (answer.rss_bytes, answer.pids, answer.reason) == (None, (), host.EXITED)
    remote = kernel_host("k", SimpleNamespace(provisioner=None))
    assert (remote.pid, remote.rss_bytes, remote.reason) == (None, None, host.NO_LOCAL_PROCESS)
    assert remote.host_total_bytes is not None  # the machine is still known


def test_without_proc_everything_is_null_with_a_reason(tmp_path: Path) -> None:
    answer = kernel_host("k", kernel_with_pid(os.getpid()), proc=tmp_path)
    assert answer.to_json() == {
        "kernel_id": "k",
        "pid": os.getpid(),
        "pids": [],
        "rss_bytes": None,
        "host_total_bytes": None,
        "host_available_bytes": None,
        "reason": "no /proc on this platform",
    }


def test_statm_and_meminfo_are_read_in_bytes(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "statm").write_text("5000 300 100 1 0 200 0\n")
    (tmp_path / "meminfo").write_text(
        "MemTotal:       16318480 kB\nMemAvailable:    9000000 kB\nHugePages_Total:       0\n"
    )
    assert rss_bytes(42, proc=tmp_path) == 300 * os.sysconf("SC_PAGE_SIZE")
    assert rss_bytes(43, proc=tmp_path) is None
    assert meminfo(tmp_path) == {
        "MemTotal": 16318480 * 1024,
        "MemAvailable": 9000000 * 1024,
        "HugePages_Total": 0,
    }
    assert meminfo(tmp_path / "missing") == {}
