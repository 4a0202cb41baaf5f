"""A real kernel's GPU processes, found by pid and, failing that, by what the kernel reports."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from jupyter_gpumem.nvml.readings import DeviceRecord, ProcessRecord, Sample
from jupyter_gpumem.server import kernels
from jupyter_gpumem.server.handlers import SETTINGS_KEY
from jupyter_gpumem.server.kernels import descendants, match_processes
from tests.support.nvml_fake import FakeProcess

API = ("jupyter-gpumem", "api")
KERNEL_ON_GPU = {
    "devices": [
        {"name": "G0", "processes": [{"pid": 999999, "command": "other", "memory_bytes": 1}]},
        {"name": "G1", "processes": [{"pid": "kernels", "memory_bytes": 3 * 2**30}]},
    ]
}


async def start_kernel(jp_fetch: Any, jp_serverapp: Any) -> tuple[str, int]:
    response = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    kernel_id = json.loads(response.body)["id"]
    kernel = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    return kernel_id, kernel.provisioner.process.pid


async def fresh_sample(jp_serverapp: Any) -> None:
    """Wait until the sampler has read NVML after this point."""
    sampler = jp_serverapp.web_app.settings[SETTINGS_KEY]["sampler"]
    passes = sampler.passes
    while sampler.passes < passes + 2:
        await asyncio.sleep(0.05)


async def processes(jp_fetch: Any, kernel_id: str) -> dict[str, Any]:
    response = await jp_fetch(*API, "kernels", kernel_id, "processes")
    return json.loads(response.body)


@pytest.mark.parametrize("fake_spec", [KERNEL_ON_GPU])
async def test_kernel_found_by_pid(jp_fetch: Any, jp_serverapp: Any) -> None:
    kernel_id, pid = await start_kernel(jp_fetch, jp_serverapp)
    await fresh_sample(jp_serverapp)
    body = await processes(jp_fetch, kernel_id)
    assert body["kernel_id"] == kernel_id and body["matched_by"] == "pid"
    assert pid in body["pids"]
    assert [(p["device_index"], p["pid"], p["memory_bytes"]) for p in body["processes"]] == [
        (1, pid, 3 * 2**30)
    ]
    assert "ipykernel" in body["processes"][0]["command"]  # the real command, from /proc


@pytest.mark.parametrize("fake_spec", [{"devices": [{"name": "G0"}]}])
async def test_kernel_not_on_gpu(jp_fetch: Any, jp_serverapp: Any) -> None:
    kernel_id, pid = await start_kernel(jp_fetch, jp_serverapp)
    fake = jp_serverapp.web_app.settings[SETTINGS_KEY]["backend"].fake
    fake.devices[0].processes.append(FakeProcess(pid + 1_000_000, "someone else", 5))
    await fresh_sample(jp_serverapp)
    body = await processes(jp_fetch, kernel_id)
    assert (body["matched_by"], body["processes"]) == (None, [])
    assert pid in body["pids"]


@pytest.mark.parametrize("fake_spec", [KERNEL_ON_GPU])
async def test_falls_back_to_the_pid_the_kernel_reports(
    jp_fetch: Any, jp_serverapp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel_id, pid = await start_kernel(jp_fetch, jp_serverapp)
    await fresh_sample(jp_serverapp)
    # As in a container or with a remote provisioner: the server cannot relate pids itself.
    monkeypatch.setattr(kernels, "descendants", lambda pid: set())
    asked = []
    real_request = kernels.request_kernel_pid

    async def counting_request(kernel: Any, timeout_s: float = 1.0) -> int | None:
        asked.append(kernel)
        return await real_request(kernel, timeout_s=10.0)  # a cold kernel on a slow CI box

    monkeypatch.setattr(kernels, "request_kernel_pid", counting_request)
    body = await processes(jp_fetch, kernel_id)
    assert body["matched_by"] == "kernel-reported"
    assert [p["pid"] for p in body["processes"]] == [pid] and body["pids"] == [pid]
    await processes(jp_fetch, kernel_id)
    assert len(asked) == 1  # the answer is cached per kernel process


def test_descendants_include_grandchildren() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; p = subprocess.Popen(['sleep', '30']); "
            "print(p.pid, flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    grandchild = None
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        found = descendants(os.getpid())
        assert {os.getpid(), child.pid, grandchild} <= found
        assert descendants(child.pid) == {child.pid, grandchild}
    finally:
        if grandchild is not None:
            os.kill(grandchild, signal.SIGKILL)
        child.kill()
        child.wait()


def test_match_processes_is_in_device_order() -> None:
    def device(index: int, pids: list[int]) -> DeviceRecord:
        procs = tuple(ProcessRecord(p, None, p * 10) for p in pids)
        return DeviceRecord(index, None, None, None, None, None, None, None, False, None, {}, procs)

    sample = Sample(0.0, 1.0, True, None, None, (device(0, [5, 6]), device(1, [6, 7])))
    found = match_processes(sample, {6, 7})
    assert [(p.device_index, p.pid, p.memory_bytes) for p in found] == [
        (0, 6, 60),
        (1, 6, 60),
        (1, 7, 70),
    ]
    assert match_processes(None, {6}) == ()
