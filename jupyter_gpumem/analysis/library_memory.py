"""Bytes no tensor owns: what libraries keep for themselves, and why the rest is unattributed.

A block that no tag and no name claims is a library's when its size is one the library
allocates once and keeps (a cuBLAS workspace), or when it lies in a private pool (a CUDA
graph's). What is left is unattributed, and :class:`Residue` keeps why: it came from
before the window, it has no Python frame, a library's code asked for it, or it was made
on another stream.

Known limitation: workspaces are told by size alone, so a tensor of exactly a workspace's
size that nothing names and nothing tags counts as that workspace.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from jupyter_gpumem.records import TraceEvent, Workspace

LIBRARY_WORKSPACE, CUDA_GRAPH_POOL = "library_workspace", "cuda_graph_pool"
CUDA_GRAPH_POOL_NAME = "CUDA graph pool"

# why a block is unattributed
OLDER = "held since before the window by nothing the namespace reaches"
NO_FRAME = "allocated with no Python frame (autograd's engine thread, or C++ code)"
OTHER_STREAM = "allocated on a side CUDA stream"


def inside(library: str) -> str:
    return f"allocated inside {library}"


def at(line: str) -> str:
    return f"allocated at {line} and held by nothing the namespace reaches"


@dataclass(frozen=True)
class LibraryMemory:
    """The library buffers of one device's allocator: workspaces by size, pools by address."""

    workspaces: tuple[Workspace, ...] = ()
    private_pools: tuple[tuple[int, int], ...] = ()  # (address, size), sorted by address

    def __post_init__(self) -> None:
        object.__setattr__(self, "_names", {w.requested: w.name for w in self.workspaces})
        object.__setattr__(self, "_starts", [a for a, _ in self.private_pools])

    def in_pool(self, address: int) -> bool:
        i = bisect.bisect_right(self._starts, address) - 1  # type: ignore[attr-defined]
        return i >= 0 and address < self.private_pools[i][0] + self.private_pools[i][1]

    def name(self, address: int, requested: int) -> str | None:
        """What library buffer an unclaimed block is; None: no library's."""
        if self._starts and self.in_pool(address):  # type: ignore[attr-defined]
            return CUDA_GRAPH_POOL_NAME
        return self._names.get(requested)  # type: ignore[attr-defined,no-any-return]


@dataclass
class Residue:
    """Filled by the breakdown: the library buffers it found by name, and why the
    unattributed bytes are unattributed."""

    library: dict[str, int] = field(default_factory=dict)  # "cuBLAS workspace" -> bytes
    unattributed: dict[str, int] = field(default_factory=dict)  # reason -> bytes
    # what holds the ``other`` bytes the namespace names: holder -> (bytes, tensors)
    held: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add_library(self, name: str, nbytes: int) -> None:
        self.library[name] = self.library.get(name, 0) + nbytes

    def add_held(self, name: str, nbytes: int) -> None:
        """A named tensor counted as ``other``, under what holds it (:func:`holder_of`)."""
        holder = holder_of(name)
        total, count = self.held.get(holder, (0, 0))
        self.held[holder] = (total + nbytes, count + 1)

    def add_unattributed(self, reason: str, nbytes: int) -> None:
        self.unattributed[reason] = self.unattributed.get(reason, 0) + nbytes


def holder_of(name: str) -> str:
    """The variable or attribute that holds a named tensor: its name up to the first index,
    a cache's layers taken together (``out.past_key_values.layers[3].keys`` is held by
    ``out.past_key_values``, ``xs[4]`` by ``xs``)."""
    holder = name.split("[", 1)[0]
    return holder.removesuffix(".layers") if holder != name else name


def category_of(name: str) -> str:
    """The breakdown category of a library buffer's name."""
    return CUDA_GRAPH_POOL if name == CUDA_GRAPH_POOL_NAME else LIBRARY_WORKSPACE


def why_unattributed(ev: TraceEvent | None, cell: tuple[str, int] | None = None) -> str:
    """Why a block allocated by ``ev`` (None: before the window) has no name."""
    if ev is None:
        return OLDER
    if ev.stream:
        return OTHER_STREAM
    for frame in ev.frames:  # innermost first: the first frame outside torch asked for it
        filename = str(frame.get("filename", "")).replace("\\", "/")
        if not filename or "/torch/" in filename or "/jupyter_gpumem/" in filename:
            continue
        package = _package(filename)
        if package is not None:
            return inside(package)
        line = frame.get("line")
        if cell is not None and filename == cell[0] and isinstance(line, int):
            return at(f"cell line {line + cell[1]}")
        return at(f"{filename}:{line}")
    return NO_FRAME


def _package(filename: str) -> str | None:
    """The installed package a file belongs to; None for the user's own files."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in filename:
            return filename.split(marker, 1)[1].split("/", 1)[0]
    return None
