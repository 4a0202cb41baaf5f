"""The `%%gpumem` report: a frozen record of plain numbers.

Numbers are bytes (int) and seconds (float); units appear only in the renderings
(:mod:`~jupyter_gpumem.report.text`, :mod:`~jupyter_gpumem.report.html`, and the
JupyterLab renderer, which formats the wire format in the user's units). ``to_dict()`` is
that wire format, the ``application/vnd.jupyter-gpumem.report+json`` output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from jupyter_gpumem.analysis.attribution import OomInfo
from jupyter_gpumem.analysis.breakdown import TensorRecord
from jupyter_gpumem.analysis.by_module import ModuleBytes, module_bytes_from_dict
from jupyter_gpumem.analysis.leak_hints import LeakHint
from jupyter_gpumem.analysis.timeline import PhaseBand, Timeline
from jupyter_gpumem.report.html import render_html
from jupyter_gpumem.report.text import render_text
from jupyter_gpumem.units import format_bytes

MIME_TYPE = "application/vnd.jupyter-gpumem.report+json"
# 2: the breakdown's kv_cache, library_workspace and cuda_graph_pool, the prefill and decode
# phases. 3: each device's ``module_tree`` (the peak by module) and ``largest_module``.
# Front ends read schemas 1 and 2 as well (the same shape, without those fields).
SCHEMA = 3
# Recorded in `Report.notes` when torch sees no CUDA device; `shown_notes` words it for what the
# report holds (CPU tensor memory stands in for the GPU where it was recorded).
NO_CUDA = "No CUDA device is present: the cell ran unchanged and no GPU memory was measured."


@dataclass(frozen=True)
class DeviceReport:
    """One device's numbers for one cell."""

    device: str  # "cuda:0"
    index: int
    name: str
    total_bytes: int | None
    allocated_before_bytes: int
    allocated_after_bytes: int
    allocated_delta_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    reserved_after_bytes: int
    cache_bytes: int  # reserved - allocated after the cell
    nvml_process_bytes: int | None  # what the driver charges this process on the device
    non_torch_bytes: (
        int | None
    )  # nvml_process_bytes - reserved: CUDA context, cuBLAS, other libraries
    source: str  # "allocator-trace" or "counters"
    breakdown: dict[str, int] | None = None  # sums to peak_allocated_bytes
    peak_phase: str | None = None  # forward, backward, optimizer, prefill, decode or other
    peak_step: int | None = None  # loop iteration of the peak, 0-based
    timeline: Timeline | None = None
    tensors: tuple[TensorRecord, ...] = ()
    oom: OomInfo | None = None
    module_tree: ModuleBytes | None = None  # the peak by module; None: no module call seen

    def to_dict(self) -> dict[str, Any]:
        # By hand rather than asdict(): no deep copy of the timeline on every display.
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["module_tree"] = None if self.module_tree is None else self.module_tree.to_dict()
        largest = None if self.module_tree is None else self.module_tree.largest()
        out["largest_module"] = (
            None
            if largest is None
            else {"path": largest.path, "bytes": sum(largest.own().values())}
        )
        out["breakdown"] = None if self.breakdown is None else dict(self.breakdown)
        out["timeline"] = None if self.timeline is None else self.timeline.to_dict()
        out["tensors"] = [t.to_dict() for t in self.tensors]
        out["oom"] = None if self.oom is None else asdict(self.oom)
        return out


@dataclass(frozen=True)
class Report:
    """What one `%%gpumem` cell did to GPU memory."""

    id: str
    name: str | None
    execution_count: int | None
    started_at: float
    wall_s: float
    status: str  # "ok", "error" or "oom"; "running": a worker still running when the cell ended
    error: str | None
    cuda_available: bool
    source: str  # "allocator-trace", "counters" or "none"
    budget_bytes: int | None
    devices: tuple[DeviceReport, ...] = ()
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    leak_hints: tuple[LeakHint, ...] = ()
    cell_key: str | None = None  # the same cell re-run has the same key (its name, or its source)
    main_device: str | None = None  # see `main_device`; None: decided from `devices` on reading
    rank: int | None = None  # a worker process's report: its rank (start_processes' index)
    pid: int | None = None
    ranks: tuple[Report, ...] = ()  # the reports of the worker processes the cell started
    schema: int = SCHEMA
    extras: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # -- the main device's numbers, for `-o r` users -------------------------------
    @property
    def main(self) -> DeviceReport | None:
        """The device the cell used most (see `main_device`)."""
        chosen = self.main_device or main_device(self.devices)
        return next((d for d in self.devices if d.device == chosen), None)

    @property
    def device(self) -> str | None:
        return self.main.device if self.main else None

    @property
    def peak_allocated_bytes(self) -> int | None:
        return self.main.peak_allocated_bytes if self.main else None

    @property
    def peak_reserved_bytes(self) -> int | None:
        return self.main.peak_reserved_bytes if self.main else None

    @property
    def allocated_before_bytes(self) -> int | None:
        return self.main.allocated_before_bytes if self.main else None

    @property
    def allocated_after_bytes(self) -> int | None:
        return self.main.allocated_after_bytes if self.main else None

    @property
    def cache_bytes(self) -> int | None:
        return self.main.cache_bytes if self.main else None

    @property
    def breakdown(self) -> dict[str, int] | None:
        return self.main.breakdown if self.main else None

    @property
    def peak_phase(self) -> str | None:
        return self.main.peak_phase if self.main else None

    @property
    def peak_step(self) -> int | None:
        return self.main.peak_step if self.main else None

    @property
    def module_tree(self) -> ModuleBytes | None:
        return self.main.module_tree if self.main else None

    @property
    def by_module(self) -> dict[str, dict[str, int]] | None:
        """``{module path: {category: bytes}}`` at the peak, children included; ``""`` the root."""
        tree = self.module_tree
        return None if tree is None else tree.flat()

    @property
    def tensors(self) -> tuple[TensorRecord, ...]:
        return self.main.tensors if self.main else ()

    @property
    def timeline(self) -> Timeline | None:
        return self.main.timeline if self.main else None

    @property
    def oom(self) -> OomInfo | None:
        return self.main.oom if self.main else None

    @property
    def worst_rank(self) -> Report | None:
        """The rank with the highest peak allocated; ranks that reported no figure do not count."""
        measured = [r for r in self.ranks if r.peak_allocated_bytes is not None]
        return max(measured, key=lambda r: r.peak_allocated_bytes or 0, default=None)

    @property
    def over_budget(self) -> bool:
        peak = self.peak_allocated_bytes
        return self.budget_bytes is not None and peak is not None and peak > self.budget_bytes

    # -- renderings ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "extras":
                continue
            value = getattr(self, f.name)
            if f.name in ("devices", "leak_hints", "ranks"):
                value = [d.to_dict() for d in value]
            elif f.name == "notes":
                value = list(self.shown_notes())
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        out["main_device"] = self.device
        out["over_budget"] = self.over_budget
        worst = self.worst_rank
        out["worst_rank"] = None if worst is None else worst.rank
        out.update(self.extras)
        return json.loads(json.dumps(out))  # JSON-native: tuples become lists

    def shown_notes(self) -> tuple[str, ...]:
        """The notes as the renderings show them: NO_CUDA says what the figures are instead."""
        cpu = next((d for d in self.devices if d.device == "cpu"), None)
        if NO_CUDA not in self.notes or cpu is None:
            return self.notes
        plain = (
            "No CUDA device: the figures are CPU tensor memory "
            f"(peak {format_bytes(cpu.peak_allocated_bytes)})."
        )
        return tuple(plain if n == NO_CUDA else n for n in self.notes)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {
            "text/plain": render_text(self),
            "text/html": render_html(self),
            MIME_TYPE: self.to_dict(),
        }

    def __str__(self) -> str:
        return render_text(self)


def main_device(devices: Sequence[DeviceReport]) -> str | None:
    """The device a cell used most: the largest rise of its peak above where it started.

    The one rule for "main device"; the wire format carries its answer to the front end.
    """
    if not devices:
        return None
    return max(devices, key=lambda d: d.peak_allocated_bytes - d.allocated_before_bytes).device


def report_from_dict(data: Mapping[str, Any]) -> Report:
    """A report back from its wire format (a worker's report file, a saved report).

    Fields this version does not know are left out, and so are structured fields it cannot
    rebuild; what the wire format computes on reading (``over_budget``) is recomputed.
    """
    known = {f.name: f for f in fields(Report)}
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name not in known or name == "extras":
            continue
        if name == "devices":
            values[name] = tuple(_device_from_dict(d) for d in value)
        elif name == "leak_hints":
            values[name] = tuple(_hint_from_dict(h) for h in value)
        elif name == "ranks":
            values[name] = tuple(report_from_dict(r) for r in value)
        elif name in ("notes", "warnings"):
            values[name] = tuple(str(v) for v in value)
        elif value is None or isinstance(value, (str, int, float, bool)):
            values[name] = value
    return Report(**values)


def _device_from_dict(data: Mapping[str, Any]) -> DeviceReport:
    known = {f.name for f in fields(DeviceReport)}
    values = {k: v for k, v in data.items() if k in known}
    timeline = data.get("timeline")
    if timeline is not None:
        values["timeline"] = Timeline(
            t_s=tuple(timeline["t_s"]),
            allocated_bytes=tuple(timeline["allocated_bytes"]),
            reserved_bytes=tuple(timeline["reserved_bytes"]),
            bands=tuple(PhaseBand(**b) for b in timeline["bands"]),
            peak_t_s=timeline["peak_t_s"],
            peak_bytes=timeline["peak_bytes"],
        )
    values["tensors"] = tuple(_tensor_from_dict(t) for t in data.get("tensors", ()))
    tree = data.get("module_tree")
    values["module_tree"] = None if tree is None else module_bytes_from_dict(tree)
    oom = data.get("oom")
    if oom is not None:
        values["oom"] = OomInfo(
            requested_bytes=oom["requested_bytes"],
            breakdown=dict(oom["breakdown"]),
            dominant=oom["dominant"],
            advice=oom["advice"],
            largest=tuple(_tensor_from_dict(t) for t in oom["largest"]),
        )
    return DeviceReport(**values)


def _tensor_from_dict(data: Mapping[str, Any]) -> TensorRecord:
    shape = data.get("shape")
    return TensorRecord(
        name=data.get("name"),
        shape=None if shape is None else tuple(shape),
        dtype=data.get("dtype"),
        nbytes=data["nbytes"],
        device=data["device"],
        line=data.get("line"),
        alive=data["alive"],
    )


def _hint_from_dict(data: Mapping[str, Any]) -> LeakHint:
    return LeakHint(
        kind=data["kind"],
        bytes=data["bytes"],
        template=data["template"],
        fix=data["fix"],
        where=tuple(data.get("where", ())),
        amounts=dict(data.get("amounts", {})),
    )


def status_of(error: BaseException | None) -> str:
    """A measured block's status: "ok", "oom" (the allocator ran out) or "error"."""
    if error is None:
        return "ok"
    return "oom" if type(error).__name__ == "OutOfMemoryError" else "error"
