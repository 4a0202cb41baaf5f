"""From a fake run to the peak a real trial would measure, through the same replay and breakdown.

On a GPU the trial's peak is the allocator's counter: every block on the device, rounded and
split by the caching allocator, the blocks the trial finds there included. So the fake run's
allocations are handed to :class:`~jupyter_gpumem.tuner.estimation.allocator_model.CachingAllocator`,
started from the device's real layout as the trial will find it (the user's gradients and
optimizer state freed, empty segments released, as ``Trial`` does before its first step), and
the peaks it counts as it places them (what :func:`~jupyter_gpumem.analysis.replay.replay`
gives for its trace, which :data:`CHECKED` replays to compare) are categorised by
:func:`~jupyter_gpumem.analysis.breakdown.categorize`, as a measured window is.
What else the process holds there (a tensor of the user's, a loaded copy of a meta model) is
counted as ``held_before``, or left out of the layout where the estimate is for a fresh process.

On the CPU the trial's peak is the dispatch source's: exact storage bytes of the storages the
model, optimizer and batch hold when the measured steps begin, and of those the steps make,
replayed by :func:`~jupyter_gpumem.analysis.replay.replay_exact`.

The device's library workspaces (cuBLAS, cuBLASLt, one per thread that runs matmuls) are made
once per device by a few tiny matmuls, forward and backward, so that the layout holds them as
the trial's first step would; the CUDA context and other memory outside PyTorch's allocator is
read from NVML at the same time. Both are cached for the process. The workspaces are told by
address, not by the size they ask for (a 512 x 512 fp32 weight asks for cuBLASLt's 1 MiB):
torch's are cleared and made again, and the blocks that appear are theirs
(:func:`~jupyter_gpumem.tracking.workspaces.remade`). Each layout checks those addresses and
finds them again where it doubts them; where torch cannot clear them safely, sizes tell them,
and the estimate says so (:func:`workspace_note`).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from jupyter_gpumem.analysis.breakdown import ALLOCATOR_SLACK, categorize, peak_phase, phase_peaks
from jupyter_gpumem.analysis.library_memory import LIBRARY_WORKSPACE
from jupyter_gpumem.analysis.replay import Live, Replay, live_blocks, replay, replay_exact
from jupyter_gpumem.gc_pause import pausing
from jupyter_gpumem.records import ALLOCATED, FREE, BlockState, SegmentState, Tag, TraceEvent
from jupyter_gpumem.tracking.snapshot import in_private_pool
from jupyter_gpumem.tracking.workspaces import allocated, memory_snapshot, remade, workspaces
from jupyter_gpumem.tuner.estimation.allocator_model import CachingAllocator
from jupyter_gpumem.tuner.estimation.fake_step import FakeRun
from jupyter_gpumem.tuner.estimation.repeated_steps import repeated
from jupyter_gpumem.units import format_bytes

CHECKED = False  # True: the allocator model's own count compared with its trace's replay
HELD_BEFORE = "held_before"  # the category of what the process held before the call
PRIVATE_POOL = 1  # the allocator model's pool for the run's storages made in a CUDA graph's pool
_MODELLED_CONF = ("expandable_segments", "max_split_size_mb", "roundup_power2", "cudaMallocAsync")


@dataclass(frozen=True)
class Peaks:
    """The measured window's peak as the analysis sees it."""

    peak_bytes: int
    peak_reserved_bytes: int
    breakdown: dict[str, int]
    phase: str | None
    resident_bytes: int | None  # on the device before the trial and not the trial's (GPU only)
    most: dict[str, int] = field(default_factory=dict)  # see most_held
    # held on the device before the call, neither the run's nor a library workspace (GPU only)
    held_bytes: int | None = None
    held_counted: bool = True  # whether held_bytes is in the peak, as HELD_BEFORE
    # reserved before the call by private pools (CUDA graphs'): in the reserved peak, never used
    pool_bytes: int = 0
    phases: dict[str, int] = field(default_factory=dict)  # the most allocated in each phase


@dataclass(frozen=True)
class DeviceFacts:
    """What one GPU adds to every run, measured once per process."""

    name: str
    total_bytes: int
    capability: tuple[int, int]  # CUDA compute capability (major, minor)
    workspace_bytes: int  # library workspaces this measurement had to create (0: already there)
    context_bytes: int | None  # NVML's figure for the process minus PyTorch's reserved bytes
    # where torch cannot tell the library workspaces by address: what each asks for, to tell
    # them by (empty where it can: start_layout marks them, as WorkspaceBlock)
    workspace_sizes: tuple[int, ...] = ()
    l2_cache_bytes: int = 0  # the card's L2 cache (Inductor's benchmarks flush a buffer this size)


@dataclass(frozen=True)
class WorkspaceBlock(BlockState):
    """An allocated block of a library workspace in a layout, told by its address."""


@dataclass(frozen=True)
class FoundWorkspaces:
    """The library workspaces of one device, found by clearing them and making them again.

    Known limitation: where a workspace is freed (torch's clear, called by the user or by
    torch.compile's CUDA-graph trees) and a tensor of its request takes its block before any
    matmul makes a new one, the tensor is taken for the workspace until the next find.
    """

    at: Mapping[int, int]  # address -> bytes requested
    others: frozenset[int]  # the blocks of a workspace's request the clear left: not workspaces
    sizes: frozenset[int]  # the requests a workspace makes: those found, and torch's rules

    def describes(self, snapshot: Sequence[Mapping[str, Any]], index: int) -> bool:
        """Whether device ``index`` in ``snapshot`` is still as found: each workspace allocated
        at its address with its request, and no block of a workspace's request at an address
        not found (one a new thread or stream made, or a tensor made since: found again)."""
        seen = {}
        for address, requested in allocated(snapshot, index):
            if address in self.at:
                seen[address] = requested
            elif requested in self.sizes and address not in self.others:
                return False
        return seen == dict(self.at)


_FACTS: dict[str, DeviceFacts] = {}
_FOUND: dict[str, FoundWorkspaces] = {}  # by device, where torch can clear the workspaces


def device_facts(torch: Any, device: Any) -> DeviceFacts:
    """The device's library workspaces made (once) and found by address, its CUDA context and
    size; cached. Finding them clears torch's workspaces (every thread's) and makes them again:
    see :func:`~jupyter_gpumem.tracking.workspaces.clearer` for when that is done, and its caveat.
    """
    key = str(device)
    facts = _FACTS.get(key)
    if facts is not None:
        return facts
    from jupyter_gpumem.tracking.process import process_bytes

    before = torch.cuda.memory_allocated(device)
    found = _find(torch, device, None)
    made = max(0, torch.cuda.memory_allocated(device) - before)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if found is not None:
        _FOUND[key] = found[0]
    nvml = process_bytes().get(index)
    reserved = torch.cuda.memory_reserved(device)
    props = torch.cuda.get_device_properties(device)
    facts = DeviceFacts(
        name=props.name,
        total_bytes=int(props.total_memory),
        capability=(int(props.major), int(props.minor)),
        workspace_bytes=made,
        context_bytes=None if nvml is None else max(0, nvml - reserved),
        workspace_sizes=() if found else tuple(w.requested for w in workspaces(torch, index)),
        l2_cache_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
    )
    _FACTS[key] = facts
    return facts


def library_workspaces(torch: Any, device: Any) -> frozenset[int] | None:
    """The addresses of the library workspaces of ``device`` now, found again as
    :func:`device_facts` finds them (cleared and made again); None where torch cannot."""
    found = _find(torch, device, _FOUND.get(str(device)))
    if found is None:
        _FOUND.pop(str(device), None)
        return None
    _FOUND[str(device)] = found[0]
    return frozenset(found[0].at)


def workspace_note(facts: DeviceFacts) -> str | None:
    """Where the library workspaces are told by size, what that takes for one; else None."""
    if not facts.workspace_sizes:
        return None
    sizes = " or ".join(format_bytes(n) for n in facts.workspace_sizes)
    return (
        f"library workspaces told by the size they ask for ({sizes}), not by address (this "
        "torch cannot clear them safely, or clearing them found none): a tensor held of that "
        "size counts as a workspace, not as held before the call"
    )


def _find(
    torch: Any, device: Any, before: FoundWorkspaces | None
) -> tuple[FoundWorkspaces, list[dict[str, Any]]] | None:
    """The library workspaces the trial's first step uses made, and found by address where torch
    can clear them (with the allocator's snapshot then); None where it cannot, or found none.

    ``before``: those found last; where the clear freed nothing, those still allocated stand.
    """
    got = remade(torch, device, lambda: _make_workspaces(torch, device))
    if got is None:
        _make_workspaces(torch, device)
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    blocks = allocated(got.snapshot, index)
    at = got.workspaces
    if not at and before is not None:
        at = {a: n for a, n in blocks if before.at.get(a) == n}
    if not at:
        return None
    sizes = frozenset(at.values()) | {w.requested for w in workspaces(torch, index)}
    others = frozenset(a for a, n in blocks if n in sizes and a not in at)
    return FoundWorkspaces(at, others, sizes), got.snapshot


def _make_workspaces(torch: Any, device: Any) -> None:
    """Tiny matmuls forward and backward in each dtype: the workspaces of this thread's handles
    and of autograd's device thread, as the trial's first step makes them."""
    with torch.cuda.device(device), torch.inference_mode(False), torch.enable_grad():
        dtypes = [torch.float32, torch.float16]
        if torch.cuda.is_bf16_supported():
            dtypes.append(torch.bfloat16)
        w = torch.ones(64, 64, device=device, requires_grad=True)
        b = torch.ones(64, device=device, requires_grad=True)
        for dtype in dtypes:
            x = w.to(dtype)
            y = torch.nn.functional.linear(x, x, b.to(dtype))  # addmm: cuBLASLt
            z = torch.bmm(y[None], x[None]) @ x  # bmm and mm: cuBLAS
            z.float().sum().backward()  # the same on autograd's device thread
        del w, b, x, y, z
        torch.cuda.synchronize(device)


def allocator_notes() -> list[str]:
    """Allocator settings the model does not follow, as notes."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
    found = [name for name in _MODELLED_CONF if name in conf]
    if not found:
        return []
    return [
        f"PYTORCH_CUDA_ALLOC_CONF sets {', '.join(found)}, which the allocator model does not "
        "follow: block sizes may differ from the real run's"
    ]


def start_layout(
    torch: Any, device: Any, drop: Collection[int]
) -> tuple[tuple[SegmentState, ...], frozenset[int]]:
    """The device's segments as the trial will find them, and those of other streams.

    Blocks at the addresses in ``drop`` (the user's gradients and optimizer state, which the
    trial clears) are free; segments left with no allocated block are released, as the trial's
    ``empty_cache()`` does. The library workspaces are :class:`WorkspaceBlock`, by the addresses
    :func:`device_facts` found, found again where the layout doubts them
    (:meth:`FoundWorkspaces.describes`); where torch cannot clear them, plain blocks.
    """
    key = str(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(device).cuda_stream
    found = _FOUND.get(key)
    segments = memory_snapshot(torch)
    if found is not None and not found.describes(segments, index):
        again = _find(torch, device, found)
        if again is None:
            del _FOUND[key]
            found, segments = None, memory_snapshot(torch)
        else:
            found, segments = again
            _FOUND[key] = found
    return layout_of(segments, index, stream, drop, () if found is None else found.at)


def layout_of(
    snapshot: Sequence[Mapping[str, Any]],
    index: int,
    stream: int,
    drop: Collection[int],
    workspaces: Collection[int] = (),
) -> tuple[tuple[SegmentState, ...], frozenset[int]]:
    """The segments of device ``index`` in ``snapshot`` (``torch.cuda.memory_snapshot()``) as
    :func:`start_layout` says, and those of streams other than ``stream``: blocks at ``drop``
    free, those at ``workspaces`` (addresses) :class:`WorkspaceBlock`."""
    segments: list[SegmentState] = []
    foreign: set[int] = set()
    for seg in snapshot:
        if seg.get("device", 0) != index:
            continue
        blocks = tuple(_block(b, drop, workspaces) for b in seg.get("blocks", ()))
        private = in_private_pool(seg)
        if not private and not any(b.state == ALLOCATED for b in blocks):
            continue
        segments.append(
            SegmentState(
                int(seg["address"]),
                int(seg["total_size"]),
                seg.get("segment_type") == "small",
                blocks,
                private_pool=private,
            )
        )
        if private or seg.get("stream", 0) != stream:
            foreign.add(int(seg["address"]))
    return tuple(segments), frozenset(foreign)


def _block(b: Mapping[str, Any], drop: Collection[int], workspaces: Collection[int]) -> BlockState:
    address, size = int(b["address"]), int(b["size"])
    if b["state"] != "active_allocated" or address in drop:
        return BlockState(address, size, FREE)
    kind = WorkspaceBlock if address in workspaces else BlockState
    return kind(address, size, ALLOCATED, b.get("requested_size") or None)


def held_blocks(
    run: FakeRun, segments: Sequence[SegmentState], workspaces: Collection[int] = ()
) -> dict[int, int]:
    """What the process held before the call: the allocated blocks of ``segments`` that are
    neither a real storage of the run's nor a library workspace, as address -> bytes requested.

    A workspace is a :class:`WorkspaceBlock` (told by its address); where torch cannot tell them
    so, any block whose request is one of the sizes ``workspaces``.
    """
    return _owners(run, segments, workspaces)[0]


def _owners(
    run: FakeRun, segments: Sequence[SegmentState], workspaces: Collection[int]
) -> tuple[dict[int, int], dict[int, int]]:
    """The allocated blocks of ``segments`` not the run's: (held before the call, library
    workspaces), each as address -> bytes requested."""
    own = set(run.real.values())
    sizes = set(workspaces)
    held, library = {}, {}
    for seg in segments:
        for b in seg.blocks:
            if b.state != ALLOCATED or b.address in own:
                continue
            requested = b.size if b.requested_size is None else b.requested_size
            if isinstance(b, WorkspaceBlock) or requested in sizes:
                library[b.address] = requested
            else:
                held[b.address] = requested
    return held, library


def without(
    segments: Sequence[SegmentState], addresses: Collection[int]
) -> tuple[SegmentState, ...]:
    """``segments`` with the blocks at ``addresses`` freed and the segments left empty released."""
    out = []
    for seg in segments:
        blocks = tuple(
            replace(b, state=FREE, requested_size=None) if b.address in addresses else b
            for b in seg.blocks
        )
        if any(b.state == ALLOCATED for b in blocks):
            out.append(replace(seg, blocks=blocks))
    return tuple(out)


@pausing  # a long decode's model makes a million objects, none in a cycle the collector must find
def cuda_peaks(
    run: FakeRun,
    segments: Sequence[SegmentState],
    foreign: Collection[int] = (),
    *,
    workspaces: Collection[int] = (),
    count_held: bool = True,
) -> Peaks:
    """The fake run's storages placed by the allocator model, from ``segments`` on, its
    measured step played as many times as it stands for (:mod:`.repeated_steps`).

    What the process held before the call (:func:`held_blocks`; ``workspaces``: the library
    workspaces' sizes, where the layout does not mark them) is counted as ``HELD_BEFORE``, or,
    where ``count_held`` is False, freed from the layout first: the peak of a process that holds
    nothing else. The library workspaces count as ``library_workspace``.
    """
    base, run = run, repeated(run, run.measured_steps)
    # where each played step ends: once one ends in the layout the one before ended in, every
    # later one plays the same (the model is deterministic), and the rest is not played
    step = len(base.events) - base.window
    ends = set(range(len(base.events), len(run.events), step)) if run is not base else set()
    ended: tuple[SegmentState, ...] | None = None
    held, library = _owners(run, segments, workspaces)
    if not count_held:
        segments = without(segments, held)
    pools = sum(s.total_size for s in segments if s.private_pool)
    alloc = CachingAllocator(segments, foreign=foreign)
    address: dict[int, int] = {}
    resident = alloc.allocated
    for i in run.existing:
        real = run.real.get(i)
        size = alloc.block_size(real) if real is not None else None
        if size is not None:
            address[i] = real  # type: ignore[assignment]  # real is not None where size is
            resident -= size
    for i in run.existing:
        if i in run.loading and i not in address:  # placed as loading placed it (4-bit)
            made: list[int] = []
            for action, value in run.loading[i]:
                if action == "alloc":
                    made.append(alloc.malloc(value, 0))
                elif action == "place":
                    address[value] = alloc.malloc(run.sizes[value], 0)
                else:
                    alloc.free(made[value], 0)
        elif i not in address and run.sizes[i]:
            address[i] = alloc.malloc(run.sizes[i], 0)  # a fake storage with no real block
    if run.loading:  # what loading let go is released, as QLoRA's preparation releases it
        alloc.empty_cache()
    born: dict[int, int] = {}  # storage -> clock, for those the measured steps allocate
    at_birth: dict[int, int] = {}
    window: tuple[tuple[SegmentState, ...], int, int, int, dict[int, int]] | None = None
    # the clocks of the cache's emptying and of the workspaces' clearing, the next one last
    at = sorted([(c, "empty") for c in run.emptied] + [(c, "clear") for c in run.cleared])[::-1]
    for n, (action, i, clock) in enumerate(run.events):
        while at and at[-1][0] < clock:
            when, what = at.pop()
            if what == "empty":
                alloc.empty_cache(when)
            else:  # the library's workspaces go; a matmul after the run makes them again
                for block in library:
                    if alloc.block_size(block) is not None:
                        alloc.free(block, when)
        if n in ends:
            layout = alloc.layout()
            if layout == ended:
                run = replace(run, events=run.events[:n])  # what follows reads what was played
                break
            ended = layout
        if n == run.window:
            window = (
                alloc.layout(),
                len(alloc.events),
                alloc.allocated,
                alloc.reserved,
                dict(address),
            )
        if action == "alloc":
            if run.sizes[i]:
                pool = PRIVATE_POOL if i in run.pooled else 0
                address[i] = alloc.malloc(run.sizes[i], clock, run.communication.get(i, ()), pool)
                if window is not None:
                    born[i], at_birth[i] = clock, address[i]
        elif i in address:
            alloc.free(address.pop(i), clock)
    if window is None:  # the measured steps allocated and freed nothing
        window = (alloc.layout(), len(alloc.events), alloc.allocated, alloc.reserved, dict(address))
    start, first, allocated, reserved, at_window = window
    events = alloc.events[first:]
    result = alloc.played(first)
    if CHECKED:
        _check_played(
            result, replay(start, events, allocated_start=allocated, reserved_start=reserved)
        )
    start_blocks = live_blocks(start)
    tags = _tags(run, at_window, at_birth, born)
    # the library workspaces at the peak (CUDA graph trees may have cleared them before it)
    at_peak = [b for b in result.live_at_peak if b.address in library]
    peaks = _peaks(run, result, events, start_blocks, tags, resident, {b.address for b in at_peak})
    counted = sum(held.values()) if count_held else 0
    workspace = sum(library[b.address] for b in at_peak)
    # held blocks are older than the window and never freed: the breakdown finds each at the
    # peak, claimed by nothing, so unattributed; they are named here, as the workspaces are
    breakdown = dict(peaks.breakdown)
    breakdown["unattributed"] -= counted
    breakdown[HELD_BEFORE] = counted
    breakdown[LIBRARY_WORKSPACE] += workspace
    breakdown[ALLOCATOR_SLACK] += sum(b.size for b in at_peak) - workspace
    alloc.close()
    return replace(
        peaks,
        breakdown=breakdown,
        held_bytes=sum(held.values()),
        held_counted=count_held,
        pool_bytes=pools,
    )


def _check_played(played: Replay, replayed: Replay) -> None:
    """``played`` (the allocator model's own count) is what the replay of its trace gives."""
    if not replayed.exact:
        raise RuntimeError(f"the allocator model's trace does not replay: {replayed.reason}")
    fields = ("allocated_start", "allocated_end", "reserved_start", "reserved_end",
              "peak_allocated", "peak_reserved", "peak_index", "live_at_peak",
              "allocated_series", "reserved_series")  # fmt: skip
    for name in fields:
        if getattr(played, name) != getattr(replayed, name):
            raise RuntimeError(f"the allocator model's own count differs from its trace's: {name}")


@pausing
def cpu_peaks(run: FakeRun) -> Peaks:
    """The dispatch source's view: storages held at the window's start and those made after."""
    start = [i for i in run.live_at_window if i in run.reachable and run.sizes[i]]
    followed = set(start)
    events: list[TraceEvent] = []
    born: dict[int, int] = {}
    for action, i, clock in run.events[run.window :]:
        size = run.sizes[i]
        if action == "alloc":
            if size:
                frames = run.communication.get(i, ())
                events.append(TraceEvent("alloc", _cpu_address(i), size, clock, frames))
                followed.add(i)
                born[i] = clock
        elif i in followed:
            followed.discard(i)
            events.append(TraceEvent("free_requested", _cpu_address(i), size, clock))
            events.append(TraceEvent("free_completed", _cpu_address(i), size, clock))
    start_blocks = [Live(_cpu_address(i), run.sizes[i], run.sizes[i], -1) for i in start]
    result = replay_exact(events, start=start_blocks)
    at_window = {i: _cpu_address(i) for i in start}
    at_birth = {i: _cpu_address(i) for i in born}
    tags = _tags(run, at_window, at_birth, born)
    return _peaks(run, result, events, start_blocks, tags, None)


def most_held(run: FakeRun) -> dict[str, int]:
    """The most bytes of each category held at once in the measured steps, whenever the peak.

    A storage counts for every category it was ever tagged with; the bytes are its own, as
    requested (FSDP2's gradients at the end of the backward are each rank's padded shards).
    """
    categories: dict[int, set[str]] = {}
    for i, category in run.tags:
        categories.setdefault(i, set()).add(category)
    held: dict[str, int] = {}
    live = set(run.live_at_window)
    for i in live:
        for category in categories.get(i, ()):
            held[category] = held.get(category, 0) + run.sizes[i]
    most = dict(held)
    for action, i, _ in run.events[run.window :]:
        if action == "alloc" and i not in live:
            live.add(i)
            sign = 1
        elif action == "free" and i in live:
            live.discard(i)
            sign = -1
        else:
            continue
        for category in categories.get(i, ()):
            held[category] = held.get(category, 0) + sign * run.sizes[i]
            most[category] = max(most.get(category, 0), held[category])
    return most


def _cpu_address(i: int) -> int:
    return (i + 1) * 512  # one address per storage: the exact replay needs no reuse


def _tags(
    run: FakeRun, at_window: dict[int, int], at_birth: dict[int, int], born: dict[int, int]
) -> list[Tag]:
    """The run's tags on the replay's addresses and clock."""
    tags = []
    # what torch.distributed made before the measured steps (DDP's buckets) has no frames there
    for i in run.communication:
        if i in at_window:
            tags.append(Tag(at_window[i], "communication", run.window_clock, run.sizes[i]))
    for i, category in run.tags:
        if i in at_birth:
            tags.append(Tag(at_birth[i], category, born[i], run.sizes[i]))
        elif i in at_window:
            tags.append(Tag(at_window[i], category, run.window_clock, run.sizes[i]))
    return tags


def _peaks(
    run: FakeRun,
    result: Replay,
    events: Sequence[TraceEvent],
    start_blocks: Sequence[Live],
    tags: Sequence[Tag],
    resident: int | None,
    leave: Collection[int] = (),
) -> Peaks:
    """The peaks of ``result``; the blocks at addresses ``leave`` out of the breakdown."""
    blocks = [b for b in result.live_at_peak if b.address not in leave] if leave else None
    breakdown = categorize(
        result.live_at_peak if blocks is None else blocks, events, tags, start_blocks, {}
    )
    when = events[result.peak_index].time_us if result.peak_index >= 0 else run.window_clock
    phase, _ = peak_phase(run.marks, when)
    phases = phase_peaks(
        run.marks,
        events,
        result.allocated_series,
        start_us=run.window_clock,
        start_bytes=result.allocated_start,
    )
    return Peaks(
        peak_bytes=result.peak_allocated,
        peak_reserved_bytes=result.peak_reserved,
        breakdown=breakdown,
        phase=phase,
        resident_bytes=resident,
        most=most_held(run),
        phases=phases,
    )
