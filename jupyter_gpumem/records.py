"""The recorded facts of one cell: what the event sources hand to the analysis.

Plain, frozen records of bytes, addresses and microseconds, with no behaviour beyond
reading themselves. Everything else in the package builds on these; this module imports
nothing of ours, so a recording can be saved, loaded and analysed without torch or a GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

ALLOCATED, PENDING, FREE = "allocated", "pending", "free"  # a block's state
# Trace actions that add or remove a segment: a layout cannot be carried across them, since
# only a snapshot tells which pool the segment belongs to.
SEGMENT_ACTIONS = frozenset({"segment_alloc", "segment_free", "segment_map", "segment_unmap"})


@dataclass(frozen=True)
class BlockState:
    """One block of a segment at the start of the interval."""

    address: int
    size: int
    state: str  # ALLOCATED, PENDING (freed, awaiting stream events) or FREE
    requested_size: int | None = None  # what the allocated block's tensor asked for; None: unknown


class AllocatedBlock(NamedTuple):
    """An allocated block as the analysis of untouched segments reads it."""

    address: int
    size: int
    requested_size: int | None

    @property
    def request(self) -> int:
        """What its tensor asked for, at most the block; the whole block where unknown."""
        return self.size if self.requested_size is None else min(self.requested_size, self.size)


class AllocatedSummary:
    """A segment's allocated blocks, totalled; their index by address and the count of each
    request are made when first read (the breakdown looks into few of a kernel's segments)."""

    __slots__ = ("_blocks", "_index", "_requests", "requested", "size")

    def __init__(
        self, size: int, requested: int, blocks: Callable[[], Sequence[AllocatedBlock]]
    ) -> None:
        self.size = size  # bytes of its allocated blocks
        self.requested = requested  # what their tensors asked for, at most ``size``
        self._blocks = blocks  # made when first read
        self._index: dict[int, AllocatedBlock] | None = None
        self._requests: Mapping[int, int] | None = None

    @classmethod
    def of(cls, blocks: Sequence[AllocatedBlock]) -> AllocatedSummary:
        return cls(sum(b.size for b in blocks), sum(b.request for b in blocks), lambda: blocks)

    @property
    def blocks(self) -> Mapping[int, AllocatedBlock]:
        """The allocated blocks by address."""
        if self._index is None:
            self._index = {b.address: b for b in self._blocks()}
        return self._index

    @property
    def requests(self) -> Mapping[int, int]:
        """How many blocks asked for each size."""
        if self._requests is None:
            self._requests = Counter(b.request for b in self._blocks())
        return self._requests


@dataclass(frozen=True)
class SegmentState:
    """One cudaMalloc'd segment at the start of the interval.

    ``blocks`` is a tuple, or a view that makes block records only when they are read
    (a layout from a snapshot of tens of thousands of blocks, most of which no event touches).
    """

    address: int
    total_size: int
    is_small: bool
    blocks: Sequence[BlockState]
    private_pool: bool = False  # in a private pool: a CUDA graph's (or a ``torch.cuda.MemPool``)

    def allocated_blocks(self) -> Sequence[AllocatedBlock]:
        """The allocated blocks, read the cheapest way the layout offers."""
        if isinstance(self.blocks, tuple):
            return [
                AllocatedBlock(b.address, b.size, b.requested_size)
                for b in self.blocks
                if b.state == ALLOCATED
            ]
        return self.blocks.allocated_blocks()  # type: ignore[attr-defined]

    def allocated_size(self) -> int:
        """Bytes of the allocated blocks: the snapshot's own total where it gave one."""
        size = getattr(self.blocks, "allocated_size", None)
        return size() if size is not None else self.allocated_summary().size

    def allocated_summary(self) -> AllocatedSummary:
        """The allocated blocks' totals and index, kept by a layout view that can keep it."""
        summary = getattr(self.blocks, "allocated_summary", None)
        return summary() if summary is not None else AllocatedSummary.of(self.allocated_blocks())


class TraceEvent(NamedTuple):
    """One allocator action, as recorded by ``_record_memory_history``.

    A named tuple rather than a dataclass: a long cell's windows hold tens of thousands,
    made in one pass after the cell, where construction cost is what the user waits for.
    """

    action: str  # alloc, free_requested, free_completed, segment_alloc, segment_free, ...
    address: int
    size: int  # requested bytes for alloc/free, segment bytes for segment actions
    time_us: int = 0
    frames: Sequence[Mapping[str, Any]] = ()  # {filename, line, name}, innermost first
    stream: int = 0  # the CUDA stream it was allocated on; 0: the default stream


# Who asked for an allocation: the innermost frame of its stack that is not plumbing. torch's
# op machinery, decorators and DTensor's op dispatch pass a call through; torch.distributed's
# own code (FSDP's all-gather and reduce-scatter, DDP's buckets, DTensor's redistribution)
# allocates communication buffers; anything else is a caller like any other.
PASS_THROUGH, COMMUNICATION, CALLER = "pass-through", "communication", "caller"
_COLLECTIVES = ("/torch/distributed/tensor/_redistribute.py", "/torch/distributed/tensor/_collective_utils.py")  # fmt: skip
_PLUMBING = (
    "/torch/_ops.py", "/torch/_library/", "/torch/utils/_python_dispatch.py", "/torch/overrides.py",
    "/torch/_compile.py", "/torch/_dynamo/eval_frame.py", "/torch/utils/_contextlib.py",
    "/torch/utils/_pytree.py", "/torch/distributed/tensor/",
)  # fmt: skip
_DISTRIBUTED = ("/torch/distributed/", "/torch/nn/parallel/distributed.py")


def frame_role(filename: str) -> str:
    """``PASS_THROUGH``, ``COMMUNICATION`` or ``CALLER``: what a frame's file says of an allocation."""
    name = filename.replace("\\", "/")
    if any(part in name for part in _COLLECTIVES):
        return COMMUNICATION
    if any(part in name for part in _PLUMBING):
        return PASS_THROUGH
    return COMMUNICATION if any(part in name for part in _DISTRIBUTED) else CALLER


def allocated_by_communication(frames: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the innermost caller in ``frames`` (innermost first) is torch.distributed code."""
    for frame in frames:
        role = frame_role(str(frame.get("filename", "")))
        if role != PASS_THROUGH:
            return role == COMMUNICATION
    return False


class Tag(NamedTuple):
    """``address`` held a storage of ``category`` at ``time_us`` (unix microseconds).

    A named tuple: a cell makes one per storage its hooks see and per named storage at its
    start, thousands in a kernel holding several models, while the user waits.
    """

    address: int
    category: str  # parameters, gradients, optimizer_state, activations, inputs
    time_us: int
    nbytes: int  # the storage's size, to tell it from a later storage at the same address
    scope: int = -1  # the module call it belongs to (index in ``CellRecording.calls``); -1: none


@dataclass(frozen=True)
class PhaseMark:
    """From ``time_us`` on, the cell was in ``phase`` of loop iteration ``step``."""

    time_us: int
    phase: str  # forward, backward, optimizer, other
    step: int


class ModuleCall(NamedTuple):
    """One call of a module while tags were recorded, or a module owning parameters.

    Calls nest: ``parent`` is the enclosing call's index in the cell's calls (-1: outside
    every module). ``call`` counts the calls of ``name`` within one forward of its model, so
    a shared layer or a loop over one block is told apart per call; an owner of parameters
    that is not a call has ``call`` -1.
    """

    name: str  # the module's qualified name in its model ("transformer.h.3.attn"; "" the model)
    call: int
    parent: int


class ScopeMark(NamedTuple):
    """From ``time_us`` on, allocations came from module call ``scope`` (-1: outside every module)."""

    time_us: int
    scope: int


@dataclass(frozen=True)
class NamedStorage:
    """A tensor storage reachable from the user's namespace."""

    address: int
    nbytes: int
    name: str
    category: str | None  # parameters, gradients, optimizer_state, or None for plain tensors
    shape: tuple[int, ...]
    dtype: str
    device: str


@dataclass(frozen=True)
class TraceWindow:
    """A stretch of the cell recorded event by event: starting layout, events, counters."""

    segments_before: tuple[SegmentState, ...]
    events: tuple[TraceEvent, ...]
    allocated_start: int
    reserved_start: int
    allocated_end: int  # the counters when the window closed: the replay must end on them
    reserved_end: int
    first_step: int  # the first loop step it covers
    last_step: int | None  # the step it ended before; None if it lasted to the end of the cell
    problem: str | None = None  # why the window's trace cannot be used; None when it can
    started_us: int = 0  # unix microseconds, the clock of the trace and of the tags
    # (address, size) of the segments in private pools at the window's start or end
    private_pools: tuple[tuple[int, int], ...] = ()
    # The analysis' digest of the window (its replay), made when the window closed mid-cell:
    # a GPU-bound loop is then still running queued kernels, so it costs the user nothing.
    replayed: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class StepSample:
    """The counters read at a step boundary outside the detailed windows."""

    time_us: int
    step: int
    allocated: int  # at the boundary
    reserved: int
    peak_allocated: int  # highest since the previous sample
    peak_reserved: int


class Workspace(NamedTuple):
    """A buffer a library allocates once and keeps, told by the size it asks for."""

    name: str  # "cuBLAS workspace"
    requested: int  # bytes


@dataclass(frozen=True)
class DeviceRecording:
    """Everything recorded on one device for one cell; input to the analysis."""

    index: int
    name: str
    total_bytes: int
    allocated_before: int
    reserved_before: int
    allocated_after: int
    reserved_after: int
    max_allocated_after: int  # the allocator's (resettable) peak counters at the end
    max_reserved_after: int
    windows: tuple[TraceWindow, ...]  # detailed stretches, in order
    samples: tuple[StepSample, ...] = ()  # step boundaries between and after the windows
    cell_peak_allocated: int | None = None  # the cell's own peak counters; None if not kept
    cell_peak_reserved: int | None = None
    trace_problem: str | None = None  # why no window was traced; None when one was
    # After a light stretch: the blocks allocated at the end that the first window's start
    # layout did not hold (the ones the cell may have left alive). None: not read.
    end_blocks: tuple[BlockState, ...] | None = None
    workspaces: tuple[Workspace, ...] = ()  # the library buffers this device's allocator may hold

    @property
    def segments_before(self) -> tuple[SegmentState, ...]:
        return self.windows[0].segments_before if self.windows else ()

    @property
    def events(self) -> tuple[TraceEvent, ...]:
        """The first window's events: the whole cell's when it was detailed throughout."""
        return self.windows[0].events if self.windows else ()


@dataclass(frozen=True)
class CellRecording:
    """What was recorded while one cell ran; the analysis turns it into a report."""

    started_at: float
    wall_s: float
    cuda_available: bool
    devices: dict[int, DeviceRecording]
    error: BaseException | None
    notes: tuple[str, ...] = field(default=())
    tags: tuple[Tag, ...] = ()
    marks: tuple[PhaseMark, ...] = ()
    named: Mapping[int, NamedStorage] = field(default_factory=dict)
    cpu_events: tuple[TraceEvent, ...] | None = None  # the CPU source's events, when it ran
    cpu_start: tuple[
        tuple[int, int], ...
    ] = ()  # (address, bytes) of CPU storages alive at the start
    cpu_detail_until_us: int | None = None  # when the CPU source stepped aside, if it did
    cpu_detail_steps: int | None = None  # the loop steps recorded before it stepped aside
    # iterations of the cell's own loop recorded, where it stepped aside at its header
    cpu_detail_iterations: int | None = None
    steps: int = 0  # loop steps the cell ran (optimizer steps, else root-module forwards)
    calls: tuple[ModuleCall, ...] = ()  # the module calls tags and scope marks point into
    scope_marks: tuple[ScopeMark, ...] = ()  # in time order
