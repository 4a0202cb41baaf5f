"""An NVML stand-in for tests and UI tests: fake GPUs, processes and injectable failures.

Not for production. Select it in a Jupyter Server config (with the repository root on
``sys.path``) with::

    c.GpuMem.backend_class = "tests.support.nvml_fake.FakeNvmlBackend"
    c.GpuMem.fake_spec = {...}   # optional; DEFAULT_SPEC otherwise

`FakeNvml` offers the subset of the ``pynvml`` API that `NvmlBackend` calls and raises
`FakeNvmlError` carrying real NVML return codes, so the real backend's error mapping,
``CUDA_VISIBLE_DEVICES`` handling and MIG enumeration run unchanged against it.

Spec (all keys optional)::

    {"driver_version": "550.54.15",
     "init_error": "driver_not_loaded",          # fails nvmlInit (see ERROR_CODES)
     "process_api": "v2",                         # only the pre-510 process function exists
     "devices": [{"name": ..., "uuid": "GPU-...", "memory_total_bytes": ...,
                  "memory_used_bytes": ..., "utilization_percent": ..., "temperature_c": ...,
                  "power_w": ...,
                  "errors": {"power_w": "not_supported"},   # per field, see FIELDS
                  "processes": [{"pid": 123, "command": "python x.py", "memory_bytes": ...,
                                 "uid": 1001},
                                {"pid": "kernels", "memory_bytes": ...}],
                  "mig": [{"uuid": "MIG-...", "name": ..., "memory_total_bytes": ...,
                           "memory_used_bytes": ..., "gpu_instance_id": 1,
                           "compute_instance_id": 0, "processes": [...], "errors": {...}}]}]}

A process whose ``pid`` is ``"kernels"`` stands for every running kernel of the server
(one process each, with the kernel's pid); ``memory_bytes: null`` means "not available".
A process's ``uid`` is its owner (each kernel's, for ``"kernels"``): this user's where it
is left out, and ``null`` for an owner that cannot be read.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpumem.nvml.library import NvmlBackend, process_command, process_owner

__all__ = ["DEFAULT_SPEC", "ERROR_CODES", "FIELDS", "FakeNvml", "FakeNvmlBackend", "FakeNvmlError"]

ERROR_CODES: dict[str, int] = {
    "not_supported": 3,
    "no_permission": 4,
    "not_found": 6,
    "driver_not_loaded": 9,
    "library_not_found": 12,
    "function_not_found": 13,
    "gpu_lost": 15,
    "version_mismatch": 18,
    "unknown": 999,
}
FIELDS = ("name", "memory", "utilization_percent", "temperature_c", "power_w", "processes")
KERNELS = "kernels"
_NOT_AVAILABLE = 2**64 - 1
GiB = 2**30

DEFAULT_SPEC: dict[str, Any] = {
    "driver_version": "550.54.15",
    "devices": [
        {
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-5c3b9f0e-6f2a-4d1e-9a7b-1f2e3d4c5b6a",
            "memory_total_bytes": 85520809984,
            "memory_used_bytes": 17716740096,
            "utilization_percent": 87,
            "temperature_c": 54,
            "power_w": 412.61,
            "processes": [
                {
                    "pid": 48211,
                    "command": "python -m ipykernel_launcher -f "
                    "/root/.local/share/jupyter/runtime/kernel-3f1c.json",
                    "memory_bytes": 16 * GiB,
                },
                {
                    "pid": 50377,
                    "command": "python train.py --config gpt2.yaml",
                    "memory_bytes": 1052770304,
                },
            ],
        },
        {
            "name": "NVIDIA A100-SXM4-40GB",
            "uuid": "GPU-a1b2c3d4-0000-4000-8000-0123456789ab",
            "memory_total_bytes": 42949672960,
            "memory_used_bytes": 6442450944,
            "utilization_percent": 12,
            "temperature_c": 41,
            "power_w": 96.0,
            "mig": [
                {
                    "uuid": "MIG-7e4f3a2b-1c0d-5e6f-8a9b-0c1d2e3f4a5b",
                    "name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                    "memory_total_bytes": 21223178240,
                    "memory_used_bytes": 4311744512,
                    "gpu_instance_id": 1,
                    "compute_instance_id": 0,
                    "processes": [
                        {"pid": 61002, "command": "python finetune.py", "memory_bytes": None},
                    ],
                },
            ],
        },
    ],
}


class FakeNvmlError(Exception):
    """Raised like ``pynvml.NVMLError``: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"fake NVML error {value}")
        self.value = value


@dataclass
class FakeProcess:
    pid: int | str
    command: str | None = None
    memory_bytes: int | None = None
    uid: int | None = field(default_factory=os.getuid)  # the owner; None: cannot be read


@dataclass
class FakeDevice:
    """A fake GPU or MIG instance; mutate it in tests to change what the next sample shows."""

    name: str = "Fake GPU"
    uuid: str = ""
    memory_total_bytes: int = 16 * GiB
    memory_used_bytes: int = 0
    utilization_percent: int | None = 0
    temperature_c: int | None = 40
    power_w: float | None = 100.0
    errors: dict[str, int] = field(default_factory=dict)
    processes: list[FakeProcess] = field(default_factory=list)
    gpu_instance_id: int = 0
    compute_instance_id: int = 0
    mig: list[FakeDevice] | None = None  # None: MIG mode off


@dataclass(frozen=True)
class _Result:
    """What pynvml returns for memory, utilisation and process queries (duck-typed)."""

    total: int = 0
    used: int = 0
    gpu: int = 0
    pid: int = 0
    usedGpuMemory: int = 0  # pynvml's field name


def _code(name: str) -> int:
    if name not in ERROR_CODES:
        raise ValueError(f"unknown fake NVML error {name!r}; allowed: {', '.join(ERROR_CODES)}")
    return ERROR_CODES[name]


def _device(spec: Mapping[str, Any], position: str, prefix: str = "GPU") -> FakeDevice:
    errors = dict(spec.get("errors") or {})
    for key in errors:
        if key not in FIELDS:
            raise ValueError(f"{position}: unknown field {key!r} in errors; allowed: {FIELDS}")
    processes = []
    for p in spec.get("processes") or []:
        if not (isinstance(p.get("pid"), int) or p.get("pid") == KERNELS):
            raise ValueError(f"{position}: a process pid must be an int or {KERNELS!r}")
        uid = p.get("uid", os.getuid())
        if not (uid is None or isinstance(uid, int)):
            raise ValueError(f"{position}: a process uid must be an int or null")
        processes.append(FakeProcess(p["pid"], p.get("command"), p.get("memory_bytes"), uid))
    mig = spec.get("mig")
    return FakeDevice(
        name=spec.get("name", "Fake GPU"),
        uuid=spec.get("uuid") or f"{prefix}-fake-" + re.sub(r"\W+", "-", position).strip("-"),
        memory_total_bytes=int(spec.get("memory_total_bytes", 16 * GiB)),
        memory_used_bytes=int(spec.get("memory_used_bytes", 0)),
        utilization_percent=spec.get("utilization_percent", 0),
        temperature_c=spec.get("temperature_c", 40),
        power_w=spec.get("power_w", 100.0),
        errors={key: _code(value) for key, value in errors.items()},
        processes=processes,
        gpu_instance_id=int(spec.get("gpu_instance_id", 0)),
        compute_instance_id=int(spec.get("compute_instance_id", 0)),
        mig=None
        if mig is None
        else [_device(m, f"{position}.mig[{k}]", "MIG") for k, m in enumerate(mig)],
    )


class FakeNvml:
    """The stand-in library: build it with `from_spec`, pass it to ``NvmlBackend(lib=...)``."""

    NVMLError = FakeNvmlError

    def __init__(
        self,
        devices: Sequence[FakeDevice],
        *,
        driver_version: str = "550.54.15",
        init_error: int | None = None,
        process_api: str = "v3",
    ) -> None:
        self.devices = list(devices)
        self.driver_version = driver_version
        self.init_error = init_error
        self.process_api = process_api
        self.kernel_pids: Callable[[], Sequence[int]] = list
        self.initialized = False
        self.calls = 0

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None = None) -> FakeNvml:
        """Build from a JSON-able spec (see the module docstring); ValueError on a bad one."""
        spec = copy.deepcopy(dict(DEFAULT_SPEC if spec is None else spec))
        api = spec.get("process_api", "v3")
        if api not in ("v2", "v3"):
            raise ValueError(f"process_api must be 'v2' or 'v3', not {api!r}")
        init_error = spec.get("init_error")
        return cls(
            [_device(d, f"devices[{i}]") for i, d in enumerate(spec.get("devices", []))],
            driver_version=spec.get("driver_version", "550.54.15"),
            init_error=_code(init_error) if init_error else None,
            process_api=api,
        )

    def backend(self, **kwargs: Any) -> NvmlBackend:
        """The real `NvmlBackend` reading this stand-in, with the spec's process commands."""
        return NvmlBackend(self, command_of=self.command_of, owner_of=self.owner_of, **kwargs)

    def command_of(self, pid: int) -> str | None:
        """The spec's command for ``pid`` if it names one, else the real one from /proc."""
        for device in self._all_devices():
            for p in device.processes:
                if p.pid == pid and p.command is not None:
                    return p.command
        return process_command(pid)

    def owner_of(self, pid: int) -> int | None:
        """The spec's owner of ``pid`` if the spec lists it, else the real one from /proc."""
        for device in self._all_devices():
            for p in device.processes:
                if p.pid == pid or (p.pid == KERNELS and pid in self.kernel_pids()):
                    return p.uid
        return process_owner(pid)

    def _all_devices(self) -> list[FakeDevice]:
        return [d for gpu in self.devices for d in [gpu, *(gpu.mig or [])]]

    def _check(self, device: FakeDevice | None = None, field_name: str | None = None) -> None:
        self.calls += 1
        if not self.initialized:
            raise FakeNvmlError(1)
        if device is not None and field_name in device.errors:
            raise FakeNvmlError(device.errors[field_name])

    # --- the pynvml API subset ----------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNvmlError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self._check()
        if not 0 <= index < len(self.devices):
            raise FakeNvmlError(2)
        return self.devices[index]

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        self._check()
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str:
        self._check(handle, "name")
        return handle.name

    def nvmlDeviceGetMigMode(self, handle: FakeDevice) -> list[int]:
        self._check()
        if handle.mig is None:
            raise FakeNvmlError(3)
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeDevice) -> int:
        self._check()
        return 7 if handle.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeDevice, index: int) -> FakeDevice:
        self._check()
        if handle.mig is None or index >= len(handle.mig):
            raise FakeNvmlError(6)
        return handle.mig[index]

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeDevice) -> int:
        self._check()
        return handle.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: FakeDevice) -> int:
        self._check()
        return handle.compute_instance_id

    def _is_mig(self, handle: FakeDevice) -> bool:
        return any(handle is m for gpu in self.devices for m in gpu.mig or [])

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> _Result:
        self._check(handle, "memory")
        return _Result(total=handle.memory_total_bytes, used=handle.memory_used_bytes)

    def _per_gpu_value(self, handle: FakeDevice, field_name: str) -> Any:
        self._check(handle, field_name)
        value = getattr(handle, field_name)
        if self._is_mig(handle) or value is None:
            raise FakeNvmlError(3)  # as real NVML: no per-instance sensors
        return value

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> _Result:
        return _Result(gpu=self._per_gpu_value(handle, "utilization_percent"))

    def nvmlDeviceGetTemperature(self, handle: FakeDevice, sensor: int) -> int:
        return int(self._per_gpu_value(handle, "temperature_c"))

    def nvmlDeviceGetPowerUsage(self, handle: FakeDevice) -> int:
        return round(self._per_gpu_value(handle, "power_w") * 1000)

    def _processes(self, handle: FakeDevice) -> list[_Result]:
        self._check(handle, "processes")
        out: list[_Result] = []
        for p in handle.processes:
            pids = list(self.kernel_pids()) if p.pid == KERNELS else [p.pid]
            memory = _NOT_AVAILABLE if p.memory_bytes is None else p.memory_bytes
            out.extend(_Result(pid=int(pid), usedGpuMemory=memory) for pid in pids)
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list[_Result]:
        if self.process_api != "v3":
            self._check()
            raise FakeNvmlError(13)
        return self._processes(handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: FakeDevice) -> list[_Result]:
        return self._processes(handle)


class FakeNvmlBackend(NvmlBackend):
    """The real backend over a stand-in built from ``spec``, for ``c.GpuMem.backend_class``.

    ``kernel_pids`` gives the pids that a ``"kernels"`` process stands for; ``fake`` is the
    stand-in, for tests to change what the next sample shows.
    """

    def __init__(
        self,
        *,
        spec: Mapping[str, Any] | None = None,
        kernel_pids: Callable[[], Sequence[int]] = list,
        **options: Any,
    ) -> None:
        self.fake = FakeNvml.from_spec(spec)
        self.fake.kernel_pids = kernel_pids
        super().__init__(
            self.fake, command_of=self.fake.command_of, owner_of=self.fake.owner_of, **options
        )
