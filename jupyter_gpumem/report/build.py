"""Turn a cell's recording into its report: pure, so it is tested without a GPU."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from jupyter_gpumem.analysis.attribution import Attribution, attribute, cell_timeline
from jupyter_gpumem.analysis.breakdown import CUDA_CLOCK_SLACK_US, tensors_at_end
from jupyter_gpumem.analysis.leak_hints import LeakHint, worth_showing
from jupyter_gpumem.analysis.library_memory import LibraryMemory
from jupyter_gpumem.analysis.peaks import DevicePeaks, device_peaks, past_windows
from jupyter_gpumem.analysis.replay import Live, Replay, live_blocks, replay_exact
from jupyter_gpumem.analysis.timeline import extended, held_until
from jupyter_gpumem.records import BlockState, CellRecording, DeviceRecording, TraceEvent
from jupyter_gpumem.report.record import NO_CUDA, DeviceReport, Report, main_device, status_of
from jupyter_gpumem.units import format_bytes, format_seconds


def build_report(
    rec: CellRecording,
    *,
    name: str | None = None,
    execution_count: int | None = None,
    budget_bytes: int | None = None,
    all_devices: bool = False,
    process_bytes: Mapping[int, int | None] | None = None,
    cell: tuple[str, int] | None = None,
    top: int = 10,
    cell_key: str | None = None,
    leak_hints: Callable[[DeviceReport | None], Sequence[LeakHint]] | None = None,
) -> Report:
    """The report of one cell.

    ``process_bytes`` maps device index to NVML's figure for this process; ``leak_hints``
    gives the hints for the cell's main device (the memory IPython holds on it, growth
    across runs of ``cell_key``), of which those ``worth_showing`` are kept.
    """
    notes = list(rec.notes)

    devices: list[DeviceReport] = []
    sources: set[str] = set()
    chosen = rec.devices if all_devices else _touched(rec.devices)
    for index, drec in sorted(chosen.items()):
        peaks = device_peaks(drec)
        sources.add(peaks.source)
        if peaks.note:
            notes.append(f"cuda:{index}: {peaks.note}")
        nvml = (process_bytes or {}).get(index)
        found = None
        if peaks.replay is not None and peaks.window is not None:
            found = _device_attribution(rec, drec, peaks, cell, top)
            if rec.tags:
                notes += (f"cuda:{index}: {n}" for n in residue_notes(found, peaks.peak_allocated))
        pools = {r for w in drec.windows for r in w.private_pools}
        if pools:
            notes.append(f"cuda:{index}: {graph_pool_note(sum(size for _, size in pools))}")
        devices.append(
            DeviceReport(
                device=f"cuda:{index}",
                index=index,
                name=drec.name,
                total_bytes=drec.total_bytes,
                allocated_before_bytes=drec.allocated_before,
                allocated_after_bytes=drec.allocated_after,
                allocated_delta_bytes=drec.allocated_after - drec.allocated_before,
                peak_allocated_bytes=peaks.peak_allocated,
                peak_reserved_bytes=peaks.peak_reserved,
                reserved_after_bytes=drec.reserved_after,
                cache_bytes=drec.reserved_after - drec.allocated_after,
                nvml_process_bytes=nvml,
                non_torch_bytes=None if nvml is None else max(0, nvml - drec.reserved_after),
                source=peaks.source,
                **_found_fields(found, tagged=bool(rec.tags)),
            )
        )
    if rec.cpu_events is not None:
        cpu, note = _cpu_device(rec, cell=cell, top=top)
        devices.append(cpu)
        sources.add(cpu.source)
        if note:
            notes.append(note)
    if not rec.cuda_available:
        notes.insert(0, NO_CUDA)
    devices = [
        d if d.timeline is None else replace(d, timeline=held_until(d.timeline, rec.wall_s))
        for d in devices
    ]
    status = "ok"
    error = None
    if rec.error is not None:
        status = status_of(rec.error)
        error = f"{type(rec.error).__name__}: {rec.error}"
    main = main_device(devices)
    hints: tuple[LeakHint, ...] = ()
    if leak_hints is not None:
        shown = next((d for d in devices if d.device == main), None)
        peak = None if shown is None else shown.peak_allocated_bytes
        hints = tuple(h for h in leak_hints(shown) if worth_showing(h, peak))
    return Report(
        id=uuid.uuid4().hex,
        name=name,
        execution_count=execution_count,
        started_at=rec.started_at,
        wall_s=rec.wall_s,
        status=status,
        error=error,
        cuda_available=rec.cuda_available,
        source=_overall_source(sources),
        budget_bytes=budget_bytes,
        devices=tuple(devices),
        notes=tuple(notes),
        leak_hints=hints,
        cell_key=cell_key,
        main_device=main,
    )


def _device_attribution(
    rec: CellRecording,
    drec: DeviceRecording,
    peaks: DevicePeaks,
    cell: tuple[str, int] | None,
    top: int,
) -> Attribution:
    """Attribution from the window that reached the peak, spread over the whole cell."""
    assert peaks.replay is not None and peaks.window is not None
    window = peaks.window
    device = f"cuda:{drec.index}"
    started_us = int(rec.started_at * 1e6)
    tags = rec.tags
    if window.first_step > 0:  # a later window: the tagger tagged afresh when it began
        tags = tuple(t for t in tags if t.time_us + CUDA_CLOCK_SLACK_US >= window.started_us)
    whole = len(drec.windows) <= 1 and not past_windows(drec)  # one window, the whole cell
    listed = None
    if not whole and drec.end_blocks is not None:
        listed = tensors_at_end(
            [e for w in peaks.windows for e in w.window.events],
            (),  # end_blocks holds only the blocks the first window's start did not
            drec.end_blocks,
            {a: n for a, n in rec.named.items() if n.device == device},
            device=device,
            cell=cell,
            top=top,
            marks=rec.marks,
        )
    held = {id(seg) for seg in peaks.replay.held}  # categorized whole, without their blocks
    found = attribute(
        peaks.replay,
        window.events,
        live_blocks([seg for seg in window.segments_before if id(seg) not in held]),
        tags=tags,
        marks=rec.marks,
        named=rec.named,
        device=device,
        started_at_us=started_us,
        cell=cell,
        top=top,
        drawn=None if whole else cell_timeline(peaks, drec.samples, rec.marks, started_us),
        listed=listed,
        library=LibraryMemory(drec.workspaces, window.private_pools),
        calls=rec.calls,
        scope_marks=rec.scope_marks,
    )
    if whole:
        return found
    breakdown = dict(found.breakdown)
    missing = peaks.peak_allocated - peaks.replay.peak_allocated
    breakdown["unattributed"] = breakdown.get("unattributed", 0) + missing
    if missing:
        found.residue.add_unattributed(BETWEEN_WINDOWS, missing)
    by_module = found.by_module
    if by_module is not None:  # the root's entry is the breakdown, whatever it came to
        by_module = replace(by_module, bytes={c: n for c, n in breakdown.items() if n})
    return replace(
        found,
        breakdown=breakdown,
        by_module=by_module,
        peak_phase=found.peak_phase if missing == 0 else None,
        peak_step=found.peak_step if missing == 0 else peaks.peak_step,
    )


HELD_SHOWN = 3  # the holders of ``other`` bytes a note names
HELD_NOTE_SHARE = 0.01  # from this share of the peak held as ``other``, the note names holders
UNATTRIBUTED_NOTE_SHARE = 0.02  # above this share of the peak, say why bytes are unattributed
BETWEEN_WINDOWS = "the peak came between the detailed steps, where blocks are not followed"


def residue_notes(found: Attribution, peak: int) -> list[str]:
    """What the library buffers at the peak are, what holds the ``other`` bytes, and, when the
    unattributed bytes are more than 2% of the peak, what kind of allocations they are."""
    out = []
    library = found.residue.library
    if library:
        parts = ", ".join(f"{name} {format_bytes(n)}" for name, n in _largest(library))
        out.append(f"library buffers at the peak: {parts}")
    held = found.residue.held
    if peak > 0 and sum(n for n, _ in held.values()) >= HELD_NOTE_SHARE * peak:
        largest = sorted(held.items(), key=lambda item: -item[1][0])[:HELD_SHOWN]
        parts = ", ".join(
            f"{name} {format_bytes(n)}" + (f" ({count} tensors)" if count > 1 else "")
            for name, (n, count) in largest
        )
        more = len(held) - len(largest)
        out.append(f"other at the peak, held by: {parts}" + (f" and {more} more" if more else ""))
    unattributed = found.breakdown.get("unattributed", 0) if found.breakdown else 0
    if peak > 0 and unattributed > UNATTRIBUTED_NOTE_SHARE * peak:
        why = found.residue.unattributed
        parts = "; ".join(f"{format_bytes(n)} {reason}" for reason, n in _largest(why))
        out.append(
            f"{format_bytes(unattributed)} unattributed ({unattributed / peak:.1%} of the peak)"
            + (f": {parts}" if parts else "")
        )
    return out


def graph_pool_note(reserved: int) -> str:
    return (
        f"CUDA graph pools reserve {format_bytes(reserved)}: memory only graph replays use, "
        "in the breakdown only where a graph's output is alive at the peak"
    )


def _largest(amounts: Mapping[str, int]) -> list[tuple[str, int]]:
    return sorted(((k, v) for k, v in amounts.items() if v), key=lambda item: -item[1])


def _cpu_device(
    rec: CellRecording, *, cell: tuple[str, int] | None, top: int
) -> tuple[DeviceReport, str | None]:
    """CPU tensor storages, from the dispatch source: the same analysis as a GPU, exact sizes.

    A source that stepped aside after the first steps still follows the frees of what it saw;
    what later steps made and left alive is read from the namespace at the cell's end, so the
    figures after the cell, the tensors it left alive and the timeline cover the whole cell.
    """
    events = rec.cpu_events or ()
    start = tuple(Live(a, n, n, -1) for a, n in rec.cpu_start)
    replay = replay_exact(events, start=start)
    found = _attribute(rec, replay, events, start, "cpu", cell, top)
    notes = [] if replay.exact else [f"the tensor trace is incomplete ({replay.reason})"]
    after = replay.allocated_end
    detailed = rec.cpu_detail_steps
    until_us = rec.cpu_detail_until_us
    # A source that stepped aside at a step boundary with no step after it saw the whole cell.
    if until_us is not None and detailed is not None and (rec.steps > detailed or not detailed):
        known = _live_at_end(events, start)
        named = {a: n for a, n in rec.named.items() if n.device == "cpu"}
        later = [BlockState(a, n.nbytes, "allocated") for a, n in named.items() if a not in known]
        after += sum(b.size for b in later)
        begun = {b.address for b in start}
        made = [BlockState(a, n, "allocated") for a, n in known.items() if a not in begun]
        listed = tensors_at_end(
            events, start, [*made, *later], named,
            device="cpu", cell=cell, top=top, marks=rec.marks, block_size=lambda n: n,
        )  # fmt: skip
        until_s = max(0.0, until_us / 1e6 - rec.started_at)
        timeline = found.timeline
        if timeline is not None:
            timeline = extended(timeline, rec.wall_s, after)
        found = replace(found, tensors=listed, timeline=timeline)
        iterations = rec.cpu_detail_iterations
        if detailed:
            part = (
                f"the first {detailed} of {rec.steps} steps (the first {format_seconds(until_s)})"
            )
        elif iterations:
            part = (
                f"the first {iterations} iterations of the cell's loop (the first "
                f"{format_seconds(until_s)} of {format_seconds(rec.wall_s)}; it counts no "
                "optimizer steps or model calls)"
            )
        else:
            part = (
                f"the first {format_seconds(until_s)} of {format_seconds(rec.wall_s)}, up to a "
                "statement of the cell (it counts no optimizer steps or model calls)"
            )
        notes.append(
            f"tensor allocations recorded in detail for {part}; the CPU keeps no peak counters "
            "to follow the rest, which is taken to repeat it: the figures after the cell "
            "and the tensors it left alive are read at its end, and the timeline joins the two"
        )
    if rec.tags:
        notes.extend(residue_notes(found, replay.peak_allocated))
    note = "cpu: " + "; ".join(notes) if notes else None
    report = DeviceReport(
        device="cpu",
        index=-1,
        name="CPU tensors",
        total_bytes=None,
        allocated_before_bytes=replay.allocated_start,
        allocated_after_bytes=after,
        allocated_delta_bytes=after - replay.allocated_start,
        peak_allocated_bytes=max(replay.peak_allocated, after),
        peak_reserved_bytes=max(replay.peak_reserved, after),
        reserved_after_bytes=after,
        cache_bytes=0,
        nvml_process_bytes=None,
        non_torch_bytes=None,
        source="cpu-dispatch",
        **_found_fields(found, tagged=bool(rec.tags)),
    )
    return report, note


def _live_at_end(events: Sequence[TraceEvent], start: Sequence[Live]) -> dict[int, int]:
    """Address -> bytes of the storages alive after ``events``, from those alive at ``start``."""
    live = {b.address: b.size for b in start}
    for ev in events:
        if ev.action == "alloc":
            live[ev.address] = ev.size
        elif ev.action == "free_requested":
            live.pop(ev.address, None)
    return live


def _attribute(
    rec: CellRecording,
    replay: Replay,
    events: Sequence[TraceEvent],
    start: Sequence[Live],
    device: str,
    cell: tuple[str, int] | None,
    top: int,
) -> Attribution:
    return attribute(
        replay,
        events,
        start,
        tags=rec.tags,
        marks=rec.marks,
        named=rec.named,
        device=device,
        started_at_us=int(rec.started_at * 1e6),
        cell=cell,
        top=top,
        calls=rec.calls,
        scope_marks=rec.scope_marks,
    )


def _found_fields(found: Attribution | None, *, tagged: bool) -> dict[str, Any]:
    """DeviceReport fields from an attribution; no breakdown without tags, which would mislabel it."""
    if found is None:
        return {}
    return {
        "breakdown": found.breakdown if tagged else None,
        "peak_phase": found.peak_phase,
        "peak_step": found.peak_step,
        "timeline": found.timeline,
        "tensors": found.tensors,
        "oom": found.oom,
        "module_tree": found.by_module if tagged else None,
    }


def _overall_source(sources: set[str]) -> str:
    for source in ("counters", "allocator-trace", "cpu-dispatch"):
        if source in sources:
            return source
    return "none"


def _touched(devices: Mapping[int, DeviceRecording]) -> dict[int, DeviceRecording]:
    """Devices the cell used; the first device when it used none, so the report is never blank."""
    used = {
        i: d
        for i, d in devices.items()
        if any(w.events for w in d.windows)
        or d.allocated_after != d.allocated_before
        or d.reserved_after != d.reserved_before
        or (d.cell_peak_allocated is not None and d.cell_peak_allocated > d.allocated_before)
    }
    if used or not devices:
        return used
    first = min(devices)
    return {first: devices[first]}
