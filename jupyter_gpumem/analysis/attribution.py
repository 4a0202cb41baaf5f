"""Everything a replay can say about one device: breakdown, phase, timeline, tensors, OOM."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jupyter_gpumem.analysis.breakdown import (
    CUDA_CLOCK_SLACK_US,
    NO_LIBRARY,
    TensorRecord,
    categorize,
    peak_phase,
    tensor_records,
)
from jupyter_gpumem.analysis.by_module import ModuleBytes, ModuleTally, module_tree
from jupyter_gpumem.analysis.library_memory import LibraryMemory, Residue
from jupyter_gpumem.analysis.peaks import DevicePeaks
from jupyter_gpumem.analysis.replay import Live, Replay
from jupyter_gpumem.analysis.timeline import PhaseBand, Timeline, downsample
from jupyter_gpumem.records import (
    ModuleCall,
    NamedStorage,
    PhaseMark,
    ScopeMark,
    StepSample,
    Tag,
    TraceEvent,
)

ADVICE = {
    "activations": "activation checkpointing of the model's blocks (or a smaller batch, or bf16 autocast)",
    "optimizer_state": "a lighter optimizer: SGD with momentum (4 B/param), Adafactor, or 8-bit AdamW",
    "parameters": "keeping the weights in bf16 (pure bf16) or offloading part of the model",
    "gradients": "bf16 gradients, or fusing the optimizer step into backward",
    "kv_cache": "fewer new tokens or a smaller batch, a quantized or offloaded KV cache",
    "inputs": "a smaller batch or sequence length",
    "temporary": "a smaller batch, or chunking the largest operation",
    "other": "deleting tensors you no longer need (`del x`, `%gpumem free`)",
    "unattributed": "torch.cuda.empty_cache() and checking libraries that keep workspaces",
    "library_workspace": "CUBLAS_WORKSPACE_CONFIG=:4096:1 for a smaller cuBLAS workspace, fewer side streams",
    "cuda_graph_pool": 'torch.compile(mode="max-autotune-no-cudagraphs"), or fewer distinct input shapes',
    "communication": "smaller DDP buckets (bucket_cap_mb) or FSDP resharding after forward",
    "allocator_slack": (
        "torch.cuda.empty_cache() before the cell, or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    ),
}


@dataclass(frozen=True)
class OomInfo:
    """What was live when the allocator ran out of memory, and what would help most."""

    requested_bytes: int
    breakdown: dict[str, int]
    dominant: str
    advice: str
    largest: tuple[TensorRecord, ...]


@dataclass(frozen=True)
class Attribution:
    """Where one device's peak came from."""

    breakdown: dict[str, int]
    peak_phase: str | None
    peak_step: int | None
    timeline: Timeline
    tensors: tuple[TensorRecord, ...]
    oom: OomInfo | None
    residue: Residue = field(
        default_factory=Residue
    )  # at the peak: library buffers, why unattributed
    by_module: ModuleBytes | None = None  # the peak by module; None: no module call was seen


def attribute(
    replay: Replay,
    events: Sequence[TraceEvent],
    start_blocks: Sequence[Live],
    *,
    tags: Sequence[Tag],
    marks: Sequence[PhaseMark],
    named: Mapping[int, NamedStorage],
    device: str,
    started_at_us: int,
    cell: tuple[str, int] | None,
    top: int = 10,
    drawn: Timeline | None = None,
    listed: tuple[TensorRecord, ...] | None = None,
    library: LibraryMemory = NO_LIBRARY,
    calls: Sequence[ModuleCall] = (),
    scope_marks: Sequence[ScopeMark] = (),
) -> Attribution:
    """Breakdown at the peak (summing to it exactly), phase, timeline, tensor delta and OOM.

    ``drawn`` and ``listed`` are a timeline and tensor list made elsewhere (of a cell traced
    in part), used as they are.
    """
    on_device = {a: n for a, n in named.items() if n.device == device}
    slack = 0 if device == "cpu" else CUDA_CLOCK_SLACK_US

    def categories(
        touched: Sequence[Live],
        residue: Residue | None = None,
        modules: ModuleTally | None = None,
    ) -> dict[str, int]:
        """The breakdown of ``touched`` and of the blocks of segments no event touched."""
        return categorize(
            touched,
            events,
            tags,
            start_blocks,
            on_device,
            clock_slack_us=slack,
            held=replay.held,
            library=library,
            residue=residue,
            cell=cell,
            modules=modules,
        )

    residue = Residue()
    tally = ModuleTally(calls, scope_marks) if calls else None
    breakdown = categories(replay.touched_at_peak, residue, tally)
    peak_us = events[replay.peak_index].time_us if replay.peak_index >= 0 else started_at_us
    phase, step = peak_phase(marks, peak_us)
    oom = None
    if replay.oom_index is not None:
        at_oom = categories(replay.touched_at_oom)
        dominant = max(at_oom, key=at_oom.__getitem__)
        largest = tensor_records(
            events[: replay.oom_index], on_device, device=device, cell=cell, top=5, marks=marks
        )
        oom = OomInfo(
            requested_bytes=events[replay.oom_index].size,
            breakdown=at_oom,
            dominant=dominant,
            advice=ADVICE[dominant],
            largest=tuple(r for r in largest if r.alive),
        )
    return Attribution(
        breakdown=breakdown,
        peak_phase=phase,
        peak_step=step,
        timeline=drawn or timeline(replay, events, marks, started_at_us),
        tensors=listed
        if listed is not None
        else tensor_records(events, on_device, device=device, cell=cell, top=top, marks=marks),
        oom=oom,
        residue=residue,
        by_module=module_tree(tally, breakdown) if tally is not None else None,
    )


def timeline(
    replay: Replay, events: Sequence[TraceEvent], marks: Sequence[PhaseMark], started_at_us: int
) -> Timeline:
    """Allocated and reserved over the cell, against seconds since it started."""
    t0 = started_at_us
    t = [0.0] + [(e.time_us - t0) / 1e6 for e in events]
    if min(t) < 0.0:  # stamped before the cell's own start: clocks differ by microseconds
        t = [max(0.0, s) for s in t]
    allocated = [replay.allocated_start, *replay.allocated_series]
    reserved = [replay.reserved_start, *replay.reserved_series]
    ts, al, re = downsample(t, allocated, reserved)
    peak_t = t[replay.peak_index + 1] if replay.peak_index >= 0 else 0.0
    return Timeline(ts, al, re, _bands(marks, t0, t[-1]), peak_t, replay.peak_allocated)


def cell_timeline(
    peaks: DevicePeaks,
    samples: Sequence[StepSample],
    marks: Sequence[PhaseMark],
    started_at_us: int,
) -> Timeline:
    """Every event of the detailed windows, and the counters read at steps in between."""
    t0 = started_at_us
    points: list[tuple[int, int, int]] = []  # (time_us, allocated, reserved)
    peak_us = t0
    for wr in peaks.windows:
        r, w = wr.replay, wr.window
        points.append((w.started_us, r.allocated_start, r.reserved_start))
        points.extend(
            (e.time_us, a, res)
            for e, a, res in zip(w.events, r.allocated_series, r.reserved_series, strict=True)
        )
        if wr.replay is peaks.replay and r.peak_index >= 0:
            peak_us = w.events[r.peak_index].time_us
    previous = t0
    for sample in samples:
        # the highest point since the previous reading, then where the step boundary left it
        points.append(
            ((previous + sample.time_us) // 2, sample.peak_allocated, sample.peak_reserved)
        )
        points.append((sample.time_us, sample.allocated, sample.reserved))
        if peaks.replay is None or sample.peak_allocated > peaks.replay.peak_allocated:
            if sample.peak_allocated == peaks.peak_allocated and peak_us == t0:
                peak_us = (previous + sample.time_us) // 2
        previous = sample.time_us
    points.sort(key=lambda p: p[0])
    t = [max(0.0, (p[0] - t0) / 1e6) for p in points]
    ts, al, re = downsample(t, [p[1] for p in points], [p[2] for p in points])
    end_s = t[-1] if t else 0.0
    return Timeline(
        ts, al, re, _bands(marks, t0, end_s), max(0.0, (peak_us - t0) / 1e6), peaks.peak_allocated
    )


def _bands(marks: Sequence[PhaseMark], t0: int, end_s: float) -> tuple[PhaseBand, ...]:
    bands: list[PhaseBand] = []
    for i, mark in enumerate(marks):
        if mark.phase == "other":
            continue
        stop = marks[i + 1].time_us if i + 1 < len(marks) else t0 + int(end_s * 1e6)
        band = PhaseBand(
            max(0.0, (mark.time_us - t0) / 1e6),
            max(0.0, (stop - t0) / 1e6),
            mark.phase,
            mark.step,
        )
        last = bands[-1] if bands else None
        if last is not None and (last.phase, last.step, last.end_s) == (
            band.phase,
            band.step,
            band.start_s,
        ):  # a decode step's model call, then its logits' processing: one band
            bands[-1] = PhaseBand(last.start_s, band.end_s, band.phase, band.step)
        else:
            bands.append(band)
    return tuple(bands)
