"""NvmlBackend against the stand-in library: typed reasons, None for unknowns, MIG, fallbacks."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpumem.nvml.library import (
    NvmlBackend,
    executable_name,
    process_command,
    process_owner,
)
from jupyter_gpumem.nvml.readings import Reason, Sample
from tests.support.nvml_fake import DEFAULT_SPEC, FakeNvml

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sample.json"


def read(spec: dict[str, Any] | None = None, **kwargs: Any) -> Sample:
    kwargs.setdefault("use_environment", False)
    return FakeNvml.from_spec(spec).backend(**kwargs).read(1.0)


def one_gpu(**fields: Any) -> dict[str, Any]:
    return {"devices": [{"name": "G", "uuid": "GPU-1", **fields}]}


def test_fixture_is_what_the_stand_in_produces_and_round_trips() -> None:
    fixture = json.loads(FIXTURE.read_text())
    produced = FakeNvml.from_spec().backend(use_environment=False, clock=lambda: fixture["time"])
    assert produced.read(1.0).to_json() == fixture
    assert Sample.from_json(fixture).to_json() == fixture


def test_default_spec_two_devices_one_mig() -> None:
    sample = read()
    assert sample.available and sample.driver_version == "550.54.15"
    gpu, mig = sample.devices
    assert (gpu.index, gpu.is_mig, gpu.parent_index) == (0, False, None)
    assert (mig.index, mig.is_mig, mig.parent_index) == (1, True, 1)
    assert mig.uuid is not None and mig.uuid.startswith("MIG-")
    # MIG instances have no per-instance sensors: None with a reason, never 0.
    assert mig.utilization_percent is None and mig.power_w is None
    assert mig.reasons["power_w"] == Reason.NOT_SUPPORTED.value
    assert mig.processes[0].memory_bytes is None  # NVML_VALUE_NOT_AVAILABLE
    assert gpu.power_w == pytest.approx(412.61, abs=1e-3)
    assert gpu.processes[1].command == "python train.py --config gpt2.yaml"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("library_not_found", Reason.LIBRARY_NOT_FOUND),
        ("driver_not_loaded", Reason.DRIVER_NOT_LOADED),
        ("no_permission", Reason.NO_PERMISSION),
        ("version_mismatch", Reason.VERSION_MISMATCH),
        ("unknown", Reason.UNKNOWN),
    ],
)
def test_init_failure_is_a_typed_reason(error: str, reason: Reason) -> None:
    sample = read({"init_error": error, **DEFAULT_SPEC})
    assert (sample.available, sample.reason, sample.devices) == (False, reason.value, ())


def test_field_failures_are_none_with_reasons() -> None:
    errors = {
        "power_w": "not_supported",
        "temperature_c": "no_permission",
        "memory": "gpu_lost",
        "processes": "no_permission",
    }
    (device,) = read(one_gpu(errors=errors, processes=[{"pid": 1, "memory_bytes": 5}])).devices
    assert device.power_w is None and device.temperature_c is None
    assert device.memory_used_bytes is None and device.memory_total_bytes is None
    assert device.processes == ()
    assert device.reasons == {
        "power_w": "not supported",
        "temperature_c": "no permission",
        "memory_total_bytes": "gpu lost",
        "memory_used_bytes": "gpu lost",
        "processes": "no permission",
    }
    assert device.utilization_percent == 0  # a real 0 stays 0


def test_old_driver_falls_back_to_v2_process_struct() -> None:
    spec = {**one_gpu(processes=[{"pid": 7, "memory_bytes": 1024}]), "process_api": "v2"}
    fake = FakeNvml.from_spec(spec)
    backend = fake.backend(use_environment=False)
    for _ in range(2):
        (device,) = backend.read().devices
        assert [(p.pid, p.memory_bytes) for p in device.processes] == [(7, 1024)]
        assert "processes" not in device.reasons


def test_same_pid_twice_is_merged() -> None:
    procs = [{"pid": 7, "memory_bytes": 1000}, {"pid": 7, "memory_bytes": 24}]
    (device,) = read(one_gpu(processes=procs)).devices
    assert [(p.pid, p.memory_bytes) for p in device.processes] == [(7, 1024)]


def test_each_failure_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    backend = FakeNvml.from_spec(one_gpu(errors={"temperature_c": "no_permission"})).backend(
        use_environment=False
    )
    with caplog.at_level(logging.DEBUG):
        for _ in range(5):
            backend.read()
    assert sum("nvmlDeviceGetTemperature" in r.getMessage() for r in caplog.records) == 1


def test_transient_init_failure_is_retried_later() -> None:
    now = [100.0]
    fake = FakeNvml.from_spec({"init_error": "driver_not_loaded", **one_gpu()})
    backend = fake.backend(use_environment=False, retry_s=30.0, clock=lambda: now[0])
    assert backend.read().reason == "driver not loaded"
    fake.init_error = None  # the driver got loaded
    now[0] += 10
    assert not backend.read().available  # not retried before retry_s
    now[0] += 25
    assert backend.read().available


def test_visible_devices_renumber_what_is_shown() -> None:
    spec = {"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}, {"uuid": "GPU-c"}]}
    sample = read(spec, visible="2,GPU-a")
    assert [(d.index, d.uuid) for d in sample.devices] == [(0, "GPU-c"), (1, "GPU-a")]
    mig = read(DEFAULT_SPEC, visible="MIG-7e4f3a2b-1c0d-5e6f-8a9b-0c1d2e3f4a5b")
    assert [(d.index, d.is_mig, d.parent_index) for d in mig.devices] == [(0, True, 1)]


def test_environment_variable_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    spec = {"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}]}
    assert [d.uuid for d in read(spec, use_environment=True).devices] == ["GPU-b"]


def test_missing_bindings_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    sample = NvmlBackend(use_environment=False).read()
    assert (sample.available, sample.reason) == (False, Reason.BINDINGS_MISSING.value)


def _has_driver() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_has_driver(), reason="an NVIDIA driver is installed here")
def test_real_pynvml_without_driver_says_library_not_found() -> None:
    pytest.importorskip("pynvml")
    backend = NvmlBackend(use_environment=False)
    sample = backend.read()
    assert (sample.available, sample.reason) == (False, Reason.LIBRARY_NOT_FOUND.value)
    backend.close()


def test_close_shuts_nvml_down_once() -> None:
    fake = FakeNvml.from_spec(one_gpu())
    backend = fake.backend(use_environment=False)
    backend.read()
    assert fake.initialized
    backend.close()
    backend.close()
    assert not fake.initialized


def test_process_command_reads_proc() -> None:
    command = process_command(os.getpid())
    assert command is not None and "python" in command.lower()
    assert process_command(2**22 + 12345) is None  # above pid_max: never exists


def test_process_owner_reads_the_real_uid() -> None:
    assert process_owner(os.getpid()) == os.getuid()
    assert process_owner(2**22 + 12345) is None


SECRET = "/usr/bin/python3 serve.py --api-key=s3cret"


@pytest.mark.parametrize(
    ("uid", "shown"),
    [
        (os.getuid(), SECRET),  # this user's process keeps its command line
        (os.getuid() + 1, "python3"),  # another user's: the executable's name only
        (None, "python3"),  # an owner that cannot be read counts as another user's
    ],
)
def test_other_users_command_lines_are_cut_to_the_executable(uid: int | None, shown: str) -> None:
    (device,) = read(one_gpu(processes=[{"pid": 7, "command": SECRET, "uid": uid}])).devices
    assert [p.command for p in device.processes] == [shown]


def test_own_pids_keep_their_command_lines_whoever_owns_them() -> None:
    processes = [
        {"pid": 7, "command": SECRET, "uid": os.getuid() + 1},
        {"pid": 8, "command": SECRET, "uid": None},
        {"pid": 9, "command": SECRET, "uid": os.getuid() + 1},
    ]
    asked = []

    def kernels() -> list[int]:
        asked.append(1)
        return [7, 8]

    backend = FakeNvml.from_spec(one_gpu(processes=processes)).backend(
        use_environment=False, own_pids=kernels
    )
    for _ in range(3):
        (device,) = backend.read().devices
        assert [p.command for p in device.processes] == [SECRET, SECRET, "python3"]
    assert len(asked) == 1  # decided once per pid, not on every read


def test_executable_name() -> None:
    assert executable_name("/opt/conda/bin/python -m x --token=t") == "python"
    assert executable_name(r"C:\Python\python.exe x.py") == "python.exe"
    assert executable_name("  ") == ""
