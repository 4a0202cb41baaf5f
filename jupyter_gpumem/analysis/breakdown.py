"""What the peak was made of, when it happened, and which tensors the cell left behind.

Pure: takes the replay, the tags and phase marks recorded by the hooks, and the
storages named in the user's namespace, and returns plain records.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import NamedTuple

from jupyter_gpumem.analysis.by_module import OUTSIDE, ModuleTally
from jupyter_gpumem.analysis.library_memory import (
    CUDA_GRAPH_POOL_NAME,
    LibraryMemory,
    Residue,
    category_of,
    why_unattributed,
)
from jupyter_gpumem.analysis.replay import Live, round_size
from jupyter_gpumem.records import (
    BlockState,
    NamedStorage,
    PhaseMark,
    SegmentState,
    Tag,
    TraceEvent,
    allocated_by_communication,
)

CATEGORIES = (
    "parameters", "gradients", "optimizer_state", "kv_cache", "activations", "inputs", "other", "temporary",
    "unattributed", "library_workspace", "cuda_graph_pool",
    "communication", "allocator_slack",
)  # fmt: skip
# A block holds its tensor's request plus the allocator's slack: the rounding up to 512 bytes,
# and the rest of a cached free block too small to split off. The request counts in the
# tensor's category, so fp32 parameters are 4 bytes each whatever the cache's layout was.
ALLOCATOR_SLACK = "allocator_slack"
# When a storage carries several tags, the most specific wins.
_PRIORITY = {
    "parameters": 0, "optimizer_state": 1, "gradients": 2, "kv_cache": 3, "inputs": 4, "activations": 5,
    "communication": 6, "cuda_graph_pool": 7,
}  # fmt: skip
NO_LIBRARY = LibraryMemory()
CUDA_CLOCK_SLACK_US = 2_000  # the allocator's clock and Python's agree to well within this
MIN_CLOCK_READINGS = 20  # tags that tell the lag of Python's clock behind the allocator's


@dataclass(frozen=True)
class TensorRecord:
    """A tensor the cell left alive, or one of the largest it freed."""

    name: str | None
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int
    device: str
    line: str | None  # "cell line 3" or "file.py:42"
    alive: bool

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "shape": list(self.shape) if self.shape is not None else None}


def categorize(
    blocks: Sequence[Live],
    events: Sequence[TraceEvent],
    tags: Sequence[Tag],
    start_blocks: Sequence[Live],
    named: Mapping[int, NamedStorage],
    *,
    clock_slack_us: int = 0,
    held: Sequence[SegmentState] = (),
    library: LibraryMemory = NO_LIBRARY,
    residue: Residue | None = None,
    cell: tuple[str, int] | None = None,
    modules: ModuleTally | None = None,
) -> dict[str, int]:
    """Bytes per category for ``blocks`` and the allocated blocks of ``held`` (segments no
    event touched); the values sum to the blocks' total, exactly.

    Each block's request counts in its category and the rest of the block in ``ALLOCATOR_SLACK``.

    A tag names a storage at an address, at a time: it belongs to the storage of that
    address, and of the tag's size, whose life (allocation to free) is nearest the tag's
    time, within ``clock_slack_us`` where the events and tags use different clocks.
    A block nothing claims is a library's buffer where ``library`` knows it, else
    unattributed; ``residue`` (when given) collects the buffers' names and why the
    unattributed bytes are so. ``modules`` (when given) collects each block's bytes under
    the module call its tag names, else the one that allocated it.
    """
    by_address: dict[int, list[Tag]] = {}
    for tag in sorted(tags, key=lambda t: t.time_us):
        by_address.setdefault(tag.address, []).append(tag)
    touched = {ev.address for ev in events}
    lives = storage_lives(events, start_blocks, {b.address for b in blocks} & touched)
    shift = clock_shift(by_address, lives, events, clock_slack_us)
    standing = _standing(by_address, named)
    scoped = _standing_scopes(by_address, standing) if modules is not None else {}
    out = dict.fromkeys(CATEGORIES, 0)

    def unclaimed(address: int, request: int, origin: TraceEvent | None) -> str:
        name = library.name(address, request)
        if name is not None:
            if residue is not None:
                residue.add_library(name, request)
            return category_of(name)
        if residue is not None:
            residue.add_unattributed(why_unattributed(origin, cell), request)
        return "unattributed"

    for block in blocks:
        request = min(block.requested_size, block.size)
        scope = OUTSIDE
        if block.event_index < 0 and block.address not in touched:
            category = standing.get(block.address) or unclaimed(block.address, request, None)
            scope = scoped.get(block.address, OUTSIDE)
        else:
            category, scope = _category(
                block, events, by_address, lives, named, clock_slack_us, shift
            )
            if category == "unattributed":
                origin = events[block.event_index] if block.event_index >= 0 else None
                category = unclaimed(block.address, request, origin)
        out[category] += request
        out[ALLOCATOR_SLACK] += block.size - request
        if category == "other" and residue is not None and block.address in named:
            residue.add_held(named[block.address].name, request)
        if modules is not None:
            if scope == OUTSIDE and block.event_index >= 0:
                scope = modules.scope_at(events[block.event_index].time_us)
            modules.add(scope, category, request)
    if held:
        _categorize_held(held, standing, scoped, library, residue, modules, out, named)
    return out


def _categorize_held(
    held: Sequence[SegmentState],
    standing: Mapping[int, str],
    scoped: Mapping[int, int],
    library: LibraryMemory,
    residue: Residue | None,
    modules: ModuleTally | None,
    out: dict[str, int],
    named: Mapping[int, NamedStorage],
) -> None:
    """Add the allocated blocks of segments no event touched to ``out``, as the per-block
    rule does, at a cost that grows with the named storages, not with the blocks.

    A kernel holding a list of 20,000 tensors has as many such blocks on every cell. Each
    segment's totals and index are made once per layout; here only the storages that tags
    and names claim are looked up, and the rest is counted in bulk: a private pool's
    segment as a CUDA graph's, blocks of a workspace's size as that workspace, the rest as
    unattributed, held from before the window.
    """
    ordered = sorted(held, key=lambda seg: seg.address)
    starts = [seg.address for seg in ordered]
    summaries = [seg.allocated_summary() for seg in ordered]
    pooled = [seg.private_pool or library.in_pool(seg.address) for seg in ordered]
    unclaimed = [s.requested for s in summaries]  # per segment
    claimed_requests: dict[
        int, int
    ] = {}  # outside pools: how many claimed blocks asked for each size
    for address, category in standing.items():
        i = bisect.bisect_right(starts, address) - 1
        block = summaries[i].blocks.get(address) if i >= 0 else None
        if block is None:
            continue
        request = block.request
        out[category] += request
        unclaimed[i] -= request
        if category == "other" and residue is not None and address in named:
            residue.add_held(named[address].name, request)
        if not pooled[i]:
            claimed_requests[request] = claimed_requests.get(request, 0) + 1
        if modules is not None and address in scoped:
            modules.add(scoped[address], category, request)
    out[ALLOCATOR_SLACK] += sum(s.size - s.requested for s in summaries)
    in_pools = sum(u for u, p in zip(unclaimed, pooled, strict=True) if p)
    rest = sum(unclaimed) - in_pools
    found = [(CUDA_GRAPH_POOL_NAME, in_pools)]
    for workspace in library.workspaces:
        size = workspace.requested
        count = sum(  # a segment whose tensors asked for less in all holds none
            s.requests.get(size, 0)
            for s, p in zip(summaries, pooled, strict=True)
            if not p and s.requested >= size
        )
        nbytes = size * (count - claimed_requests.get(size, 0))
        found.append((workspace.name, nbytes))
        rest -= nbytes
    for name, nbytes in found:
        if nbytes:
            out[category_of(name)] += nbytes
            if residue is not None:
                residue.add_library(name, nbytes)
    out["unattributed"] += rest
    if residue is not None and rest:
        residue.add_unattributed(why_unattributed(None), rest)


def _standing(
    by_address: Mapping[int, list[Tag]], named: Mapping[int, NamedStorage]
) -> dict[int, str]:
    """The category of a block older than the window at an address no event touched.

    Its one storage lives through the whole window, so every tag at its address is its own
    (the most specific wins), else the namespace's name says what it is: what `_category`
    finds for such a block, without the per-address lives. Addresses absent: unattributed.
    """
    rank = _PRIORITY.__getitem__
    out = {
        address: near[0].category if len(near) == 1 else min((t.category for t in near), key=rank)
        for address, near in by_address.items()
    }
    for address, hit in named.items():
        out.setdefault(address, hit.category or "other")
    return out


def _standing_scopes(
    by_address: Mapping[int, list[Tag]], standing: Mapping[int, str]
) -> dict[int, int]:
    """The module call of a standing block: the first tag of its category that names one."""
    out = {}
    for address, near in by_address.items():
        category = standing.get(address)
        for tag in near:
            if tag.category == category and tag.scope != OUTSIDE:
                out[address] = tag.scope
                break
    return out


def clock_shift(
    by_address: Mapping[int, list[Tag]],
    lives: Mapping[int, AddressLives],
    events: Sequence[TraceEvent],
    slack: int,
) -> int:
    """Microseconds to add to the tags' times to bring them to the events' clock.

    A tag is made after its storage was allocated. Where an address held one storage in the
    window, born in it, its first tag of that size says how far the tag's clock trails the
    allocator's, if it reads before the birth. The lag is read low in the spread of at least
    ``MIN_CLOCK_READINGS`` readings (the 5th percentile), so a stray tag of an older storage
    does not set it, and is at most ``slack``. Without it, a storage freed and one of the same size allocated at
    its address microseconds later could trade a tag made just after the second was born.
    """
    if slack <= 0:
        return 0
    readings = []
    for address, at in lives.items():
        if len(at.allocs) != 1 or at.allocs[0] < 0:
            continue
        born = events[at.allocs[0]]
        first = next((t for t in by_address.get(address, ()) if t.nbytes == born.size), None)
        if first is not None:
            readings.append(first.time_us - born.time_us)
    if len(readings) < MIN_CLOCK_READINGS:
        return 0
    readings.sort()
    low = readings[len(readings) // 20]
    return min(max(0, -low), slack)


class StorageLife(NamedTuple):
    """One storage at an address: when it was allocated and freed (None: outside the window)."""

    born_us: int | None
    freed_us: int | None
    requested: int | None  # None: older than the window, size unknown to the events

    def distance(self, t_us: int) -> int:
        """Microseconds from ``t_us`` to this life; 0 within it."""
        if self.born_us is not None and t_us < self.born_us:
            return self.born_us - t_us
        if self.freed_us is not None and t_us > self.freed_us:
            return t_us - self.freed_us
        return 0

    def holds(self, nbytes: int) -> bool:
        return self.requested is None or self.requested == nbytes


@dataclass
class AddressLives:
    """The storages an address held during the window, in order of allocation."""

    allocs: list[int]  # each storage's alloc event index; -1: older than the window
    freed_us: list[int | None]  # when each was freed; None: not in the window
    index: dict[int, int]  # alloc event index -> position

    def life(self, k: int, events: Sequence[TraceEvent]) -> StorageLife | None:
        """The ``k``-th storage's life; None past either end."""
        if not 0 <= k < len(self.allocs):
            return None
        i = self.allocs[k]
        if i < 0:
            return StorageLife(None, self.freed_us[k], None)
        return StorageLife(events[i].time_us, self.freed_us[k], events[i].size)

    def nearest_holding(
        self, k: int, step: int, nbytes: int, events: Sequence[TraceEvent]
    ) -> StorageLife | None:
        """The life nearest the ``k``-th one, before it (``step`` -1) or after it (1), of a
        storage that could hold a tensor of ``nbytes``; None where there is none. Lives at one
        address follow each other, so the nearest one of that size is the nearest in time."""
        j = k + step
        while (life := self.life(j, events)) is not None:
            if life.holds(nbytes):
                return life
            j += step
        return None


def storage_lives(
    events: Sequence[TraceEvent], start_blocks: Sequence[Live], addresses: Set[int]
) -> dict[int, AddressLives]:
    """The storages each of ``addresses`` held during the window, in one pass over the events."""
    out: dict[int, AddressLives] = {}
    current: dict[int, int] = {}  # address -> position of its live storage
    for b in start_blocks:
        if b.address in addresses:
            out[b.address] = AddressLives([-1], [None], {-1: 0})
            current[b.address] = 0
    for i, ev in enumerate(events):
        address = ev.address
        if address not in addresses:
            continue
        if ev.action == "alloc":
            at = out.get(address)
            if at is None:
                at = out[address] = AddressLives([], [], {})
            current[address] = at.index[i] = len(at.allocs)
            at.allocs.append(i)
            at.freed_us.append(None)
        elif ev.action == "free_requested":
            k = current.pop(address, None)
            if k is not None:
                out[address].freed_us[k] = ev.time_us
    return out


def _category(
    block: Live,
    events: Sequence[TraceEvent],
    by_address: Mapping[int, list[Tag]],
    lives: Mapping[int, AddressLives],
    named: Mapping[int, NamedStorage],
    slack: int,
    shift: int = 0,
) -> tuple[str, int]:
    """The block's category, and the module call its winning tag names (``OUTSIDE``: none);
    ``shift`` is added to the tags' times (see :func:`clock_shift`)."""
    at = lives.get(block.address)
    k = at.index.get(block.event_index) if at is not None else None
    own = StorageLife(None, None, None)
    if at is not None and k is not None:
        own = at.life(k, events) or own
    valid = []
    rivals: dict[int, tuple[StorageLife | None, StorageLife | None]] = {}  # by tag size
    near = by_address.get(block.address, [])
    if own.born_us is not None:  # tags in time order: skip those long before this storage
        first = own.born_us - slack - shift
        near = near[bisect.bisect_left(near, first, key=lambda t: t.time_us) :]
    for tag in near:
        t = tag.time_us + shift
        if own.freed_us is not None and t > own.freed_us + slack:
            break
        if not own.holds(tag.nbytes):
            continue
        d = own.distance(t)
        if d > slack:
            continue
        # another storage of the tag's size nearer its time holds it (on a tie, the later one)
        if at is not None and k is not None:
            if tag.nbytes not in rivals:  # tags at one address mostly share a size
                rivals[tag.nbytes] = (
                    at.nearest_holding(k, -1, tag.nbytes, events),
                    at.nearest_holding(k, 1, tag.nbytes, events),
                )
            before, after = rivals[tag.nbytes]
            if before is not None and before.distance(t) < d:
                continue
            if after is not None and after.distance(t) <= d:
                continue
        valid.append(tag)
    if valid:
        category = min((t.category for t in valid), key=_PRIORITY.__getitem__)
        scope = next(
            (t.scope for t in valid if t.category == category and t.scope != OUTSIDE), OUTSIDE
        )
        return category, scope
    if own.born_us is not None and allocated_by_communication(events[block.event_index].frames):
        return "communication", OUTSIDE  # all-gather and reduce-scatter buffers, DDP's buckets
    if own.freed_us is not None:
        return "temporary", OUTSIDE
    hit = named.get(block.address)
    if hit is not None:
        return hit.category or "other", OUTSIDE
    return "unattributed", OUTSIDE


def peak_phase(
    marks: Sequence[PhaseMark], peak_time_us: int | None
) -> tuple[str | None, int | None]:
    """The phase and loop step the cell was in at the peak; (None, None) without marks."""
    if not marks or peak_time_us is None:
        return None, None
    times = [m.time_us for m in marks]
    i = bisect.bisect_right(times, peak_time_us) - 1
    if i < 0:
        return "other", marks[0].step
    return marks[i].phase, marks[i].step


def phase_peaks(
    marks: Sequence[PhaseMark],
    events: Sequence[TraceEvent],
    allocated: Sequence[int],
    *,
    start_us: int,
    start_bytes: int,
) -> dict[str, int]:
    """The most allocated in each phase: ``allocated[k]`` is the count after ``events[k]`` (in
    time order), ``start_bytes`` the count at ``start_us``; each instant's phase as
    :func:`peak_phase` names it. Empty without marks."""
    if not marks:
        return {}
    start_phase, _ = peak_phase(marks, start_us)
    out = {start_phase or "other": start_bytes}
    # the events in each mark's span, found by halving: a decode's trace holds a million
    bounds = [bisect.bisect_left(events, m.time_us, key=_time_of) for m in marks]
    spans = [("other", 0, bounds[0])]
    ends = [*bounds[1:], len(events)]
    spans += [(m.phase, a, b) for m, a, b in zip(marks, bounds, ends, strict=True)]
    for phase, a, b in spans:
        if a < b:
            most = max(allocated[a:b])
            if most > out.get(phase, -1):
                out[phase] = most
    return out


def _time_of(event: TraceEvent) -> int:
    return event.time_us


def tensor_records(
    events: Sequence[TraceEvent],
    named: Mapping[int, NamedStorage],
    *,
    device: str,
    cell: tuple[str, int] | None,
    top: int,
    marks: Sequence[PhaseMark] = (),
) -> tuple[TensorRecord, ...]:
    """Storages the cell allocated and left alive (named where possible), then the largest it freed."""
    born: dict[int, TraceEvent] = {}
    freed: list[TraceEvent] = []
    for ev in events:
        if ev.action == "alloc":
            born[ev.address] = ev
        elif ev.action == "free_requested" and ev.address in born:
            freed.append(born.pop(ev.address))
    # named first, then the largest; lines are read from the frames of the listed ones only
    listed = sorted(
        ((named.get(address), ev) for address, ev in born.items()),
        key=lambda p: (p[0] is None, -(p[0].nbytes if p[0] else p[1].size)),
    )[:top]
    alive = [
        _alive(n, ev.size, device, source_line(ev, cell) or _during(marks, ev)) for n, ev in listed
    ]
    gone = [
        TensorRecord(
            None,
            None,
            None,
            ev.size,
            device,
            source_line(ev, cell) or _during(marks, ev),
            alive=False,
        )
        for ev in sorted(freed, key=lambda e: -e.size)[:top]
    ]
    return tuple(alive) + tuple(gone)


def _alive(n: NamedStorage | None, nbytes: int, device: str, line: str | None) -> TensorRecord:
    """A storage the cell left alive: as the namespace names it, else ``nbytes`` unnamed."""
    return TensorRecord(
        name=n.name if n else None,
        shape=n.shape if n else None,
        dtype=n.dtype if n else None,
        nbytes=n.nbytes if n else nbytes,
        device=device,
        line=line,
        alive=True,
    )


def tensors_at_end(
    events: Sequence[TraceEvent],
    start_blocks: Sequence[Live],
    end_blocks: Sequence[BlockState],
    named: Mapping[int, NamedStorage],
    *,
    device: str,
    cell: tuple[str, int] | None,
    top: int,
    marks: Sequence[PhaseMark] = (),
    block_size: Callable[[int], int] = round_size,
) -> tuple[TensorRecord, ...]:
    """Like :func:`tensor_records` for a cell traced in part: what is alive comes from the
    allocator's layout at the end, where each block was made from the traced events.
    ``block_size`` is the block a request of that size takes (exact on the CPU)."""
    before = {b.address: b.size for b in start_blocks}  # ints only: nothing for the collector
    made: dict[int, TraceEvent] = {}
    for ev in events:
        if ev.action == "alloc":
            made[ev.address] = ev
    alive = []
    for block in end_blocks:
        if before.get(block.address) == block.size:
            continue
        n = named.get(block.address)
        origin = made.get(block.address)
        line = None
        if origin is not None and block_size(origin.size) == block.size:
            line = source_line(origin, cell) or _during(marks, origin)
        alive.append(_alive(n, block.size, device, line or "outside the recorded part"))
    alive.sort(key=lambda r: (r.name is None, -r.nbytes))
    gone = [
        r
        for r in tensor_records(events, named, device=device, cell=cell, top=top, marks=marks)
        if not r.alive
    ]
    return tuple(alive[:top]) + tuple(gone)


def _during(marks: Sequence[PhaseMark], ev: TraceEvent) -> str | None:
    """For allocations with no Python frame (autograd's engine thread): the phase they fell in."""
    phase, step = peak_phase(marks, ev.time_us)
    return None if phase is None else f"during {phase} (step {step})"


def source_line(ev: TraceEvent, cell: tuple[str, int] | None) -> str | None:
    """The cell line (as the cell's traceback numbers it: from the body's first line that is not blank), else the innermost frame outside torch.

    A frame in another notebook cell (a function a worker process runs, defined earlier)
    reads "cell [N] line L" where IPython's file name gives the cell's number.
    """
    fallback = None
    for frame in ev.frames:
        filename = str(frame.get("filename", ""))
        line = frame.get("line")
        if cell is not None and filename == cell[0] and isinstance(line, int):
            return f"cell line {line + cell[1]}"
        if (
            fallback is None
            and "/torch/" not in filename
            and "jupyter_gpumem" not in filename
            and filename
        ):
            fallback = _cell_line(filename, line) or f"{filename}:{line}"
    return fallback


_OTHER_CELL = re.compile(r"^<ipython-input-(\d+)-[0-9a-f]+>$")  # IPython's name of a cell's code
_KERNEL_CELL = re.compile(r"[/\\]ipykernel_\d+[/\\]\d+\.py$")  # ipykernel's


def _cell_line(filename: str, line: object) -> str | None:
    """A line of another cell, where the file name says it is one."""
    match = _OTHER_CELL.match(filename)
    if match:
        return f"cell [{match.group(1)}] line {line}"
    if _KERNEL_CELL.search(filename):
        return f"cell line {line}"
    return None
