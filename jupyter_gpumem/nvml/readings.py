"""The live GPU view's wire format: frozen records and their JSON shape.

`labextension/src/wire/live.ts` mirrors these field names, and `tests/fixtures/sample.json`
is read by both the Python and the TypeScript tests. Bytes are ints, seconds floats,
and an unknown value is ``None`` (never 0), with the reason in ``reasons``.

A sample's point of the sparklines (`Sample.memory_json`) is encoded once, when first asked
for: each page load of the sidebar asks for the last minutes of them. The whole sample
(tens of times larger on a busy machine) is encoded each time it is served, so that the
history does not keep a second, encoded copy of itself.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


class Reason(str, enum.Enum):
    """Why NVML, or one field of it, has no value. The value is the wire text."""

    BINDINGS_MISSING = "nvidia-ml-py not installed"
    LIBRARY_NOT_FOUND = "library not found"
    DRIVER_NOT_LOADED = "driver not loaded"
    VERSION_MISMATCH = "driver/library version mismatch"
    NO_PERMISSION = "no permission"
    NOT_SUPPORTED = "not supported"
    FUNCTION_NOT_FOUND = "not supported by this driver"
    GPU_LOST = "gpu lost"
    NOT_FOUND = "not found"
    TIMEOUT = "timeout"
    NOT_INITIALIZED = "not initialized"
    STARTING = "sampler starting"
    UNKNOWN = "unknown error"
    INTERNAL = "internal error"


@dataclass(frozen=True)
class ProcessRecord:
    """One process NVML reports on a device (``pid`` as NVML sees it)."""

    pid: int
    command: str | None
    memory_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "command": self.command, "memory_bytes": self.memory_bytes}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRecord:
        return cls(data["pid"], data["command"], data["memory_bytes"])


@dataclass(frozen=True)
class DeviceRecord:
    """One device as torch in a kernel would number it (``index``), MIG instances included.

    ``parent_index`` is the NVML (physical) index of a MIG instance's GPU, else ``None``.
    ``reasons`` maps a field name to why that field is ``None``.
    """

    index: int
    uuid: str | None
    name: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    utilization_percent: int | None
    temperature_c: int | None
    power_w: float | None
    is_mig: bool
    parent_index: int | None
    reasons: Mapping[str, str] = field(default_factory=dict)
    processes: tuple[ProcessRecord, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_used_bytes": self.memory_used_bytes,
            "utilization_percent": self.utilization_percent,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "is_mig": self.is_mig,
            "parent_index": self.parent_index,
            "reasons": dict(self.reasons),
            "processes": [p.to_json() for p in self.processes],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeviceRecord:
        return cls(
            index=data["index"],
            uuid=data["uuid"],
            name=data["name"],
            memory_total_bytes=data["memory_total_bytes"],
            memory_used_bytes=data["memory_used_bytes"],
            utilization_percent=data["utilization_percent"],
            temperature_c=data["temperature_c"],
            power_w=data["power_w"],
            is_mig=data["is_mig"],
            parent_index=data["parent_index"],
            reasons=dict(data["reasons"]),
            processes=tuple(ProcessRecord.from_json(p) for p in data["processes"]),
        )


@dataclass(frozen=True)
class Sample:
    """Everything read in one sampling pass. ``reason`` is set when ``available`` is False."""

    time: float
    interval_s: float
    available: bool
    reason: str | None
    driver_version: str | None
    devices: tuple[DeviceRecord, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "interval_s": self.interval_s,
            "available": self.available,
            "reason": self.reason,
            "driver_version": self.driver_version,
            "devices": [d.to_json() for d in self.devices],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sample:
        return cls(
            time=data["time"],
            interval_s=data["interval_s"],
            available=data["available"],
            reason=data["reason"],
            driver_version=data["driver_version"],
            devices=tuple(DeviceRecord.from_json(d) for d in data["devices"]),
        )

    def memory_json(self) -> dict[str, Any]:
        """The sample as a point of the sparklines: its time and each device's memory used."""
        return {
            "time": self.time,
            "devices": [
                {"index": d.index, "memory_used_bytes": d.memory_used_bytes} for d in self.devices
            ],
        }

    @cached_property
    def encoded_memory(self) -> str:
        """`memory_json` as JSON text, encoded once (a few hundred bytes, unlike `to_json`)."""
        return encode_json(self.memory_json())

    @classmethod
    def unavailable(cls, time: float, interval_s: float, reason: Reason | str) -> Sample:
        """A sample that says only why there is nothing to show."""
        text = reason.value if isinstance(reason, Reason) else reason
        return cls(time, interval_s, False, text, None, ())


def encode_json(value: Any) -> str:
    """Compact JSON text, with ``</`` escaped as tornado does for the JSON it writes."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/")
