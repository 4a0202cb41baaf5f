"""NVML, wrapped so that a missing or broken GPU stack is an answer, never an exception.

This is the only module that imports ``pynvml`` (the ``nvidia-ml-py`` package), and only when
the first sample is read. Every NVML error becomes a typed `Reason`, logged once per function
and error; an unknown value is ``None`` with the reason in ``DeviceRecord.reasons``.

`NvmlBackend` takes the library as a parameter: the real ``pynvml`` by default, or the
stand-in in `tests.support.nvml_fake` for tests.

Other users' command lines are not shown: a process's command is kept only when the process
belongs to this user (its real uid in ``/proc/<pid>/status`` is ``os.getuid()``) or is one of
``own_pids`` (the server's kernels and their children); another's is cut to the base name of
its executable, since arguments can hold secrets (``--api-key=...``).

Known limitations:
    - Process ids are NVML's, i.e. the host's. Inside a container they do not match the
      container's ``/proc``, so the command may be missing (or, rarely, another process's).
      A process whose owner cannot be read there counts as another user's.
    - Off Linux the owner is read with psutil where it is installed; without it, or without
      ``os.getuid`` (Windows), every command is cut to its executable's name.
    - Only compute processes are listed (not graphics-only ones).
    - Device names, UUIDs and the MIG layout are read once at initialisation; a MIG
      reconfiguration needs a server restart.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from jupyter_gpumem.nvml.readings import DeviceRecord, ProcessRecord, Reason, Sample
from jupyter_gpumem.nvml.visibility import MigSlot, PhysicalGpu, visible_devices

__all__ = [
    "NvmlBackend",
    "executable_name",
    "process_command",
    "process_owner",
    "reason_for_code",
]

T = TypeVar("T")

# NVML return codes (nvml.h); spelled here so the mapping works with any compatible library.
_CODE_REASONS: dict[int, Reason] = {
    1: Reason.NOT_INITIALIZED,
    3: Reason.NOT_SUPPORTED,
    4: Reason.NO_PERMISSION,
    6: Reason.NOT_FOUND,
    9: Reason.DRIVER_NOT_LOADED,
    10: Reason.TIMEOUT,
    12: Reason.LIBRARY_NOT_FOUND,
    13: Reason.FUNCTION_NOT_FOUND,
    15: Reason.GPU_LOST,
    18: Reason.VERSION_MISMATCH,
}
_NOT_AVAILABLE = {2**64 - 1, 2**32 - 1}  # NVML_VALUE_NOT_AVAILABLE as ulonglong and uint
_PERMANENT = {Reason.BINDINGS_MISSING, Reason.LIBRARY_NOT_FOUND}
_MIG_ENABLED = 1
_TEMPERATURE_GPU = 0
_PROCESS_FUNCTIONS = (
    "nvmlDeviceGetComputeRunningProcesses",  # v3 struct in nvidia-ml-py >= 11.5
    "nvmlDeviceGetComputeRunningProcesses_v2",  # drivers older than 510
)


def reason_for_code(code: int) -> Reason:
    """The typed reason for an NVML return code."""
    return _CODE_REASONS.get(code, Reason.UNKNOWN)


def _known(value: Any) -> int | None:
    if value is None or int(value) in _NOT_AVAILABLE:
        return None
    return int(value)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def process_command(pid: int) -> str | None:
    """The command line of ``pid`` from ``/proc`` (or psutil off Linux); None if unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
        if raw.strip(b"\0"):
            return b" ".join(part for part in raw.split(b"\0") if part).decode(errors="replace")
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip().decode(errors="replace") or None
    except FileNotFoundError:
        if os.path.isdir("/proc"):
            return None
    except OSError:
        return None
    try:
        import psutil  # optional; only consulted where /proc does not exist
    except ImportError:
        return None
    try:
        return " ".join(psutil.Process(pid).cmdline()) or None
    except (psutil.Error, OSError):
        return None


def process_owner(pid: int) -> int | None:
    """The real uid of ``pid`` (``/proc``, or psutil off Linux); None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
        return None
    except FileNotFoundError:
        if os.path.isdir("/proc"):
            return None
    except (OSError, ValueError, IndexError):
        return None
    try:
        import psutil  # optional; only consulted where /proc does not exist
    except ImportError:
        return None
    try:
        return int(psutil.Process(pid).uids().real)
    except (psutil.Error, OSError, AttributeError):
        return None


def executable_name(command: str) -> str:
    """The base name of a command line's first word: all of another user's command shown."""
    words = command.split()
    return words[0].replace("\\", "/").rsplit("/", 1)[-1] if words else ""


def _this_user() -> int | None:
    getuid = getattr(os, "getuid", None)  # not on Windows
    return getuid() if getuid is not None else None


@dataclass
class _Device:
    """A visible device with its handle and the fields read once."""

    index: int
    handle: Any
    is_mig: bool
    parent_index: int | None
    uuid: str | None
    name: str | None
    static_reasons: dict[str, str]


class NvmlBackend:
    """Reads one `Sample` per call to `read`; call it from one thread only.

    ``lib`` is the ``pynvml`` module by default (imported on first use). ``visible`` is a
    ``CUDA_VISIBLE_DEVICES`` value; by default the environment's. ``own_pids`` gives the
    pids whose command lines are shown whoever owns them (the server passes its kernels'
    process trees); ``command_of`` and ``owner_of`` read a process's command and real uid.
    """

    def __init__(
        self,
        lib: Any = None,
        *,
        visible: str | None = None,
        use_environment: bool = True,
        log: logging.Logger | None = None,
        retry_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        command_of: Callable[[int], str | None] = process_command,
        owner_of: Callable[[int], int | None] = process_owner,
        own_pids: Callable[[], Iterable[int]] = tuple,
    ) -> None:
        self._lib = lib
        self._command_of = command_of
        self._owner_of = owner_of
        self._own_pids = own_pids
        self._uid = _this_user()
        self._own: set[int] | None = None  # own_pids(), read at most once per read()
        self._visible = os.environ.get("CUDA_VISIBLE_DEVICES") if use_environment else visible
        self._log = log or logging.getLogger(__name__)
        self._retry_s = retry_s
        self._clock = clock
        self._logged: set[tuple[str, Reason]] = set()
        self._devices: list[_Device] | None = None
        self._driver_version: str | None = None
        self._failure: Reason | None = None
        self._next_retry = 0.0
        self._process_function: str | None = None
        self._commands: dict[int, str | None] = {}

    # --- errors -------------------------------------------------------------------------

    def _reason(self, what: str, error: BaseException) -> Reason:
        """Map an exception from the library to a reason, logging each (what, reason) once."""
        mismatch = getattr(self._lib, "NVMLLibraryMismatchError", None)
        if mismatch is not None and isinstance(error, mismatch):
            reason = Reason.FUNCTION_NOT_FOUND
        else:
            reason = reason_for_code(int(getattr(error, "value", -1)))
        if (what, reason) not in self._logged:
            self._logged.add((what, reason))
            quiet = reason in (Reason.NOT_SUPPORTED, Reason.NOT_FOUND)
            level = logging.DEBUG if quiet else logging.WARNING
            self._log.log(level, "NVML %s unavailable: %s (%s)", what, reason.value, error)
        return reason

    def _errors(self) -> tuple[type[BaseException], ...]:
        classes = [getattr(self._lib, "NVMLError", None)]
        classes.append(getattr(self._lib, "NVMLLibraryMismatchError", None))
        return tuple(c for c in classes if isinstance(c, type))

    def _try(self, what: str, fn: Callable[..., T], *args: Any) -> tuple[T | None, Reason | None]:
        try:
            return fn(*args), None
        except self._errors() as error:
            return None, self._reason(what, error)

    # --- initialisation -----------------------------------------------------------------

    def _ensure_ready(self) -> Reason | None:
        """Initialise NVML on first use (and retry transient failures); the failure, if any."""
        if self._devices is not None:
            return None
        if self._failure is not None and (
            self._failure in _PERMANENT or self._clock() < self._next_retry
        ):
            return self._failure
        if self._lib is None:
            try:
                import pynvml  # the nvidia-ml-py package
            except ImportError as error:
                self._log.warning("NVML unavailable: nvidia-ml-py is not installed (%s)", error)
                self._failure = Reason.BINDINGS_MISSING
                return self._failure
            self._lib = pynvml
        try:
            self._lib.nvmlInit()
            self._devices = self._discover()
        except self._errors() as error:
            self._failure = self._reason("nvmlInit", error)
            self._next_retry = self._clock() + self._retry_s
            self._devices = None
            return self._failure
        self._failure = None
        version, _ = self._try("nvmlSystemGetDriverVersion", self._lib.nvmlSystemGetDriverVersion)
        self._driver_version = _text(version) if version is not None else None
        return None

    def _mig_slots(self, handle: Any) -> tuple[bool, list[tuple[MigSlot, Any]]]:
        lib = self._lib
        mode, _ = self._try("nvmlDeviceGetMigMode", lib.nvmlDeviceGetMigMode, handle)
        if not mode or mode[0] != _MIG_ENABLED:
            return False, []
        count, _ = self._try(
            "nvmlDeviceGetMaxMigDeviceCount", lib.nvmlDeviceGetMaxMigDeviceCount, handle
        )
        slots: list[tuple[MigSlot, Any]] = []
        for k in range(count or 0):
            mig, _ = self._try(
                "nvmlDeviceGetMigDeviceHandleByIndex",
                lib.nvmlDeviceGetMigDeviceHandleByIndex,
                handle,
                k,
            )
            if mig is None:
                continue  # an empty slot answers NOT_FOUND
            uuid, _ = self._try("nvmlDeviceGetUUID", lib.nvmlDeviceGetUUID, mig)
            gi, _ = self._try("nvmlDeviceGetGpuInstanceId", lib.nvmlDeviceGetGpuInstanceId, mig)
            ci, _ = self._try(
                "nvmlDeviceGetComputeInstanceId", lib.nvmlDeviceGetComputeInstanceId, mig
            )
            slots.append((MigSlot(_text(uuid) if uuid else None, gi, ci), mig))
        return True, slots

    def _discover(self) -> list[_Device]:
        """Enumerate GPUs and MIG instances, then keep those CUDA would see."""
        lib = self._lib
        gpus: list[PhysicalGpu] = []
        handles: dict[tuple[int, int | None], Any] = {}
        for i in range(lib.nvmlDeviceGetCount()):
            handle, _ = self._try("nvmlDeviceGetHandleByIndex", lib.nvmlDeviceGetHandleByIndex, i)
            if handle is None:
                continue  # e.g. a GPU this container may not use; CUDA will not see it either
            uuid, _ = self._try("nvmlDeviceGetUUID", lib.nvmlDeviceGetUUID, handle)
            mig_enabled, slots = self._mig_slots(handle)
            handles[(i, None)] = handle
            for k, (_, mig_handle) in enumerate(slots):
                handles[(i, k)] = mig_handle
            gpus.append(
                PhysicalGpu(
                    i, _text(uuid) if uuid else None, mig_enabled, tuple(slot for slot, _ in slots)
                )
            )
        devices = []
        for visible in visible_devices(self._visible, gpus):
            handle = handles[(visible.nvml_index, visible.mig_position)]
            reasons: dict[str, str] = {}
            name, reason = self._try("nvmlDeviceGetName", lib.nvmlDeviceGetName, handle)
            if reason:
                reasons["name"] = reason.value
            uuid, reason = self._try("nvmlDeviceGetUUID", lib.nvmlDeviceGetUUID, handle)
            if reason:
                reasons["uuid"] = reason.value
            is_mig = visible.mig_position is not None
            devices.append(
                _Device(
                    index=visible.index,
                    handle=handle,
                    is_mig=is_mig,
                    parent_index=visible.nvml_index if is_mig else None,
                    uuid=_text(uuid) if uuid is not None else None,
                    name=_text(name) if name is not None else None,
                    static_reasons=reasons,
                )
            )
        return devices

    # --- reading ------------------------------------------------------------------------

    def _processes(self, handle: Any) -> tuple[tuple[ProcessRecord, ...] | None, Reason | None]:
        functions = [self._process_function] if self._process_function else _PROCESS_FUNCTIONS
        reason: Reason | None = Reason.FUNCTION_NOT_FOUND
        for name in functions:
            fn = getattr(self._lib, name, None)
            if fn is None:
                continue
            raw, reason = self._try(name, fn, handle)
            if reason is Reason.FUNCTION_NOT_FOUND:
                continue
            if reason is not None:
                return None, reason
            self._process_function = name
            return self._merge(raw or []), None
        return None, reason

    def _merge(self, raw: Iterable[Any]) -> tuple[ProcessRecord, ...]:
        """One record per pid (NVML may list a pid once per context), memory summed."""
        memory: dict[int, int | None] = {}
        for info in raw:
            pid = int(info.pid)
            used = _known(getattr(info, "usedGpuMemory", None))
            if pid in memory:
                previous = memory[pid]
                used = None if previous is None or used is None else previous + used
            memory[pid] = used
        return tuple(ProcessRecord(pid, self._command(pid), used) for pid, used in memory.items())

    def _command(self, pid: int) -> str | None:
        """The command shown for ``pid``, decided once while NVML keeps listing the pid."""
        if pid not in self._commands:
            command = self._command_of(pid)
            if command is None and hasattr(self._lib, "nvmlSystemGetProcessName"):
                name, _ = self._try(
                    "nvmlSystemGetProcessName", self._lib.nvmlSystemGetProcessName, pid
                )
                command = _text(name) if name else None
            if command is not None and not self._is_own(pid):
                command = executable_name(command) or None
            self._commands[pid] = command
        return self._commands[pid]

    def _is_own(self, pid: int) -> bool:
        """Whether ``pid`` is this user's, or one of ``own_pids``; unknown owners are not."""
        if self._uid is not None and self._owner_of(pid) == self._uid:
            return True
        if self._own is None:
            self._own = set(self._own_pids())
        return pid in self._own

    def _read_device(self, device: _Device) -> DeviceRecord:
        lib, handle = self._lib, device.handle
        reasons = dict(device.static_reasons)

        def field(names: tuple[str, ...], what: str, fn: Callable[..., T], *args: Any) -> T | None:
            value, reason = self._try(what, fn, handle, *args)
            if reason is not None:
                reasons.update(dict.fromkeys(names, reason.value))
            return value

        memory = field(
            ("memory_total_bytes", "memory_used_bytes"),
            "nvmlDeviceGetMemoryInfo",
            lib.nvmlDeviceGetMemoryInfo,
        )
        rates = field(
            ("utilization_percent",),
            "nvmlDeviceGetUtilizationRates",
            lib.nvmlDeviceGetUtilizationRates,
        )
        temperature = field(
            ("temperature_c",),
            "nvmlDeviceGetTemperature",
            lib.nvmlDeviceGetTemperature,
            _TEMPERATURE_GPU,
        )
        power_mw = field(("power_w",), "nvmlDeviceGetPowerUsage", lib.nvmlDeviceGetPowerUsage)
        processes, reason = self._processes(handle)
        if reason is not None:
            reasons["processes"] = reason.value
        power = _known(power_mw)
        return DeviceRecord(
            index=device.index,
            uuid=device.uuid,
            name=device.name,
            memory_total_bytes=_known(memory.total) if memory is not None else None,
            memory_used_bytes=_known(memory.used) if memory is not None else None,
            utilization_percent=_known(rates.gpu) if rates is not None else None,
            temperature_c=_known(temperature),
            power_w=power / 1000.0 if power is not None else None,
            is_mig=device.is_mig,
            parent_index=device.parent_index,
            reasons=reasons,
            processes=processes or (),
        )

    def read(self, interval_s: float = 0.0) -> Sample:
        """Read every visible device now; never raises for NVML errors."""
        now = self._clock()
        failure = self._ensure_ready()
        if failure is not None or self._devices is None:
            return Sample.unavailable(now, interval_s, failure or Reason.UNKNOWN)
        self._own = None
        devices = tuple(self._read_device(device) for device in self._devices)
        seen = {p.pid for d in devices for p in d.processes}
        self._commands = {pid: c for pid, c in self._commands.items() if pid in seen}
        return Sample(now, interval_s, True, None, self._driver_version, devices)

    def close(self) -> None:
        """Shut NVML down if it was initialised; safe to call more than once."""
        if self._devices is not None:
            self._try("nvmlShutdown", self._lib.nvmlShutdown)
            self._devices = None
