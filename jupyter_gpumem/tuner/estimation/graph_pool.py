"""generate's compiled decode step, placed as CUDA graph trees place it: in a private pool.

Where transformers' ``generate`` compiles the model's forward for a static cache on CUDA
(``torch.compile(mode="reduce-overhead")``: Inductor's kernels, run as CUDA graphs), the prefill
runs eagerly and each decode call runs the compiled forward. CUDA graph trees warm the first call
up and record the second in a private memory pool of their own, with a cuBLAS workspace of
their own made inside it (their stream's, cleared after each); later calls replay the graph in
that memory. So the pool holds the decode call's largest live set and the workspace, reserved
beside the default pool and never shared with it.

The fake run plays each decode call eagerly, as it plays an uncompiled one, and marks what the
call allocates as the pool's (:attr:`~.storage_log.StorageLog.pool`); the allocator model gives
those requests segments of a pool of their own (:mod:`.allocator_model`). The warm-up and the
recording each begin with a capture (the tree's first, empty, then the recording's), and
``torch.cuda.graph`` empties the default pool's cache as it begins one; each then makes the
pool's workspace and frees it at the call's end. In the warm-up Inductor also benchmarks the
kernels it compiled, flushing the L2 cache between runs with a buffer of the L2's size (60 MiB
on an H200): held through the warm-up call, it takes a segment of the pool's own.

Known limitations:
- Inductor's kernels are taken to allocate what the eager ops allocate. They fuse elementwise
  ops, so they make fewer and smaller intermediates; a decode call's large ones (the logits, a
  grouped-query attention's keys and values repeated over the cache, the attention's inputs)
  are made by both.
- ``clear_cublas_manager`` frees every cuBLAS workspace (the default stream's and autograd's
  thread's too) as the warm-up begins; the estimate frees the library workspaces it found there,
  and the recording's capture then releases their segments. No eager matmul runs between a
  compiled generate's decode calls, so none makes them again within the call.
- A call whose graphs this process has already recorded (the same shapes again) reuses their
  pool: the estimate places a new one, as for the first call. So does a compile whose kernels
  Inductor's cache already holds benchmarked (the same model compiled before on this machine),
  which makes no flush buffer: the estimate is then above the call by up to the L2's size.
  Graphs recorded for another batch or length keep their pool's segments reserved beside the new
  call's (the zoo's largest-batch runs, after the row's own, reserved 15% to 20% more than the
  estimate placed for a first call), and a second shape makes torch compile again with dynamic
  shapes, whose kernels held less than the eager ops (5% of the peak).
- The benchmarks also clone each input a kernel mutates (a static cache's layer); these are
  freed as made, and not modelled.
- Only caches of plain static layers are placed (:meth:`GraphPool.check`): a sliding window's
  layer (Gemma-2's) counts its tokens in a Python int that the compiled call guards on, so the
  second decode call compiles again (two functions, each warmed up with its own benchmarks, and a
  graph recorded per count), which is refused with its reason.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.analysis.library_memory import CUDA_GRAPH_POOL
from jupyter_gpumem.tuner.estimation import cards
from jupyter_gpumem.tuner.estimation.storage_log import StorageLog
from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable

# a cache whose layers are not all plain static ones: guarded on per step, or not known to be
RECOMPILES = (
    "generate compiles the model's forward for this cache on this device (CUDA graphs); its "
    "{} layers keep a Python count the compiled call guards on (it compiles again, and CUDA "
    "graph trees record a graph per count), which the estimate does not model; estimate and run "
    "it with disable_compile=True"
)
NOT_STATIC = (
    "generate compiles the model's forward for this cache on this device (CUDA graphs); a {} "
    "is not made of static layers, whose compiled calls the estimate models; estimate and run "
    "it with disable_compile=True"
)
RECORDED_CALLS = 2  # CUDA graph trees warm a function up once, then record it
GRAPH_MODES = ("reduce-overhead",)  # torch.compile's modes that run CUDA graph trees, modelled

NOTE = (
    "generate compiles its decode calls for this cache (CUDA graphs): their warm-up and "
    "recording are placed in a private pool with its own cuBLAS workspace and, in the warm-up, "
    "the L2-sized buffer Inductor's first benchmarks flush (less where its cache is warm); the "
    "compiled kernels' buffers taken as the eager ops'"
)


@dataclass(frozen=True)
class PoolRequests:
    """What a compiled decode call asks of its pool beside its ops' tensors, on one card."""

    workspaces: tuple[int, ...]  # the pool stream's cuBLAS workspace, each warm-up and recording
    flush: int  # Inductor's benchmarks' L2 flush buffer, held through the warm-up (0: none)


def refused(mode: Any, device_type: str) -> str:
    """Why a compiled ``generate`` is not estimated on this device or in this mode."""
    if device_type not in ("cuda", "cudalike"):
        return (
            f"generate compiles the model's forward for this cache on {device_type}, whose "
            "memory fake tensors do not model; estimate and run it with disable_compile=True"
        )
    return (
        f"generate compiles the model's forward for this cache with mode={mode!r}, whose memory "
        f"the estimate models only for mode {' or '.join(map(repr, GRAPH_MODES))} (CUDA graphs); "
        "estimate and run it with disable_compile=True"
    )


def requests(capability: tuple[int, int], l2_cache_bytes: int) -> PoolRequests:
    """A card's pool requests: cuBLAS's workspace per handle for its compute capability, and
    its L2 cache's size."""
    workspace = cards.HOPPER_WORKSPACE if capability >= (9, 0) else cards.EARLIER_WORKSPACE
    return PoolRequests((workspace,), l2_cache_bytes)


class GraphPool:
    """The decode calls of one fake ``generate``: what each allocates marked as the pool's."""

    def __init__(self, log: StorageLog, asks: PoolRequests) -> None:
        self.log = log
        self.asks = asks
        self.compiled = False  # set once generate decides to compile
        self.calls = 0
        self._held: list[int] = []
        self._inside = False

    def enter(self) -> None:
        """A decode call begins."""
        if not self.compiled:
            return
        self.log.pool = self._inside = True
        if self.calls < RECORDED_CALLS:
            self.log.empty_cache()  # a capture begins so (the tree's first, then the recording)
            if self.calls == 0:  # the trees' clear_cublas_manager, before the warm-up
                self.log.clear_workspaces()
            flush = (self.asks.flush,) if self.calls == 0 and self.asks.flush else ()
            for size in (*flush, *self.asks.workspaces):
                index = self.log.virtual_alloc(size)
                self.log.tags.append((index, CUDA_GRAPH_POOL))
                self._held.append(index)

    def check(self, caches: Sequence[Any]) -> None:
        """Raise :class:`Unfakeable` where a cache a call returned is not made of plain static
        layers only: a sliding window's layer counts its tokens in a Python int (Gemma-2's
        cache), on which the compiled call guards and compiles again."""
        if not self.compiled:
            return
        for cache in caches:
            kinds = {type(layer).__name__ for layer in getattr(cache, "layers", None) or ()}
            if not kinds:
                raise Unfakeable(NOT_STATIC.format(type(cache).__name__))
            if kinds != {"StaticLayer"}:
                raise Unfakeable(RECOMPILES.format(" and ".join(sorted(kinds - {"StaticLayer"}))))

    def leave(self, kept: Sequence[Any] = ()) -> None:
        """The decode call ends: its workspace freed, as the warm-up and recording free it.
        ``kept``: the cache's tensors, which the eager prefill makes, never the pool (a call
        standing for a decode step may make them, see :mod:`.generation`)."""
        if not self._inside:
            return
        for index in self._held:
            self.log.early_free(index)
        self._held.clear()
        for t in kept:
            self.log.pooled.discard(self.log.index_of(t))  # type: ignore[arg-type]
        self.log.pool = self._inside = False
        self.calls += 1


@contextmanager
def deciding(pool: GraphPool | None, device_type: str) -> Iterator[None]:
    """generate's decision to compile taken as made, its forward then played eagerly: the
    decode calls marked for ``pool``. Without one (or in a mode not modelled) a compiled call
    raises :class:`Unfakeable` with the reason."""
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.__dict__.get("_valid_auto_compile_criteria")
    if original is None:  # a transformers that never compiles on its own
        yield
        return

    def criteria(self: Any, model_kwargs: Any, generation_config: Any) -> bool:
        if not original(self, model_kwargs, generation_config):
            return False
        mode = getattr(generation_config.compile_config, "mode", GRAPH_MODES[0])
        if pool is None or mode not in GRAPH_MODES:
            raise Unfakeable(refused(mode, device_type))
        if getattr(generation_config, "prefill_chunk_size", None) is not None:
            raise Unfakeable(
                "generate compiles a chunked prefill (prefill_chunk_size), whose CUDA graphs "
                "the estimate does not model; estimate and run it with disable_compile=True"
            )
        pool.compiled = True
        return False

    GenerationMixin._valid_auto_compile_criteria = criteria  # type: ignore[method-assign]
    try:
        yield
    finally:
        GenerationMixin._valid_auto_compile_criteria = original  # type: ignore[method-assign]
