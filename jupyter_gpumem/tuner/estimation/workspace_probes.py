"""Kernels' own allocations (cuDNN's convolutions, fused attention, layer norm), measured on the GPU.

A convolution on CUDA takes a workspace from the caching allocator for the algorithm cuDNN
chose and frees it before it returns; its backward takes one for the input's gradient and
one for the weight's. Their sizes are cuDNN's heuristics' choice for the GPU, the cuDNN
version, the shapes, strides, dtypes and flags: up to 174 MiB for one backward at batch 32
on an H200, and about the input plus the output for strided fp32 forwards
(``bench/results/op_transients_h200.json``). The fused attention kernels behind
``scaled_dot_product_attention`` (cuDNN's, flash, memory-efficient) take theirs too: 19.7 MiB
for each of ViT-B's cuDNN attention backwards at batch 32; and the layer norm kernels copy a
strided input to a contiguous one and keep partial sums of the weight's gradient: 69 MiB for
each of ConvNeXt's (55, 56, 56, 96) fp32 backwards. No formula gives them all, so each
distinct call of these ops in a fake step is run once, for real, where it would run: on the
same GPU, in a process of the estimate's own (:class:`~.worker_process.Worker`), which never
touches the user's allocator, its peak counters or what a ``%%gpumem`` cell records.

The probe records the op's allocations in order (:class:`Probe`); the fake op then allocates
its outputs and the workspaces in that order and frees the workspaces where the kernel did, so
the allocator model places them as the caching allocator did. Where the fake outputs do not
match the recorded ones, the op's highest beyond its outputs is made after them instead.

The worker starts with the fake step (:func:`warm`) and imports torch and starts CUDA
meanwhile; later probes take milliseconds each, and each call is probed once per process and
device. The worker ends
after :data:`IDLE_S` seconds without a probe, giving back its CUDA context.

Known limitations:
- With ``torch.backends.cudnn.benchmark`` on, the steady step's algorithm is probed; the
  first step's search, which tries several algorithms' workspaces, is not counted.
- A call the probe cannot run (the GPU has no room for its tensors) gets no workspace, and the
  estimate says how many.
- The probe's tensors hold no data: a kernel whose allocations follow values (none of these
  ops) would be probed wrongly. They are made at offset zero: a view's alignment, by which a
  kernel may choose, is not kept.
- An estimate without CUDA (:mod:`.without_cuda`) has no GPU to ask: no workspace there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpumem.tuner.estimation.worker_process import Worker
from jupyter_gpumem.units import format_bytes

IDLE_S = 20.0
_CONVOLUTIONS = frozenset({"convolution.default", "convolution_backward.default"})
_ATTENTION = frozenset(
    f"_scaled_dot_product_{kernel}_attention{part}.default"
    for kernel in ("cudnn", "flash", "efficient")
    for part in ("", "_backward")
)
_LAYER_NORMS = frozenset({"native_layer_norm.default", "native_layer_norm_backward.default"})
OPS = _CONVOLUTIONS | _ATTENTION | _LAYER_NORMS


@dataclass(frozen=True)
class Layout:
    """A tensor argument as the probe makes it again: shape, strides (elements), dtype and
    whether it is on the GPU or the host."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str  # "float32", "bfloat16", ...
    on_gpu: bool = True


@dataclass(frozen=True)
class Call:
    """One call of a probed op as its kernel sees it: the op, its arguments (tensors as
    layouts) and the flags that steer cuDNN's choice of algorithm."""

    op: str  # "convolution.default", "_scaled_dot_product_flash_attention.default", ...
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    flags: tuple[tuple[str, bool], ...]

    @property
    def kind(self) -> str:
        if self.op in _CONVOLUTIONS:
            return "convolution"
        return "attention" if self.op in _ATTENTION else "layer norm"


@dataclass(frozen=True)
class Probe:
    """What one call allocated on the GPU: ``steps`` in order, ``("alloc", i, bytes)``
    or ``("free", i, 0)`` (an allocation never freed is an output), and ``extra``, the most it
    held beyond its inputs and outputs."""

    steps: tuple[tuple[str, int, int], ...]
    extra: int

    def outputs(self) -> list[int]:
        """The bytes of each output, in the order they were allocated."""
        freed = {i for kind, i, _ in self.steps if kind == "free"}
        return [n for kind, i, n in self.steps if kind == "alloc" and i not in freed]


Measure = Callable[[Sequence[Call]], Sequence["Probe | str"]]


@dataclass
class Prober:
    """The workspaces of one device's probed calls: what ``measure`` found for each (a Probe, or
    why it could not), kept for the process's life."""

    device_name: str
    measure: Measure
    worker: Worker | None = None  # the process that measures, where there is one
    found: dict[Call, Probe | str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def probe(self, call: Call) -> Probe | str:
        with self.lock:
            if call not in self.found:
                (self.found[call],) = self.measure([call])
            return self.found[call]


@dataclass
class Tally:
    """What one fake run's probed calls were given: for the estimate's note."""

    device_name: str = ""
    probed: set[Call] = field(default_factory=set)
    failed: dict[Call, str] = field(default_factory=dict)
    largest: int = 0

    def note(self) -> str:
        """One line for the estimate; empty where the run had no call to probe."""
        if not self.probed and not self.failed:
            return ""
        kinds = [c.kind for c in self.probed]
        parts = [
            f"{n} distinct {one if n == 1 else many}"
            for kind, one, many in _KINDS
            for n in [kinds.count(kind)]
            if n
        ]
        counts = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
        line = (
            "the kernels' own allocations (cuDNN's convolutions, fused attention, layer norm) "
            f"measured on this {self.device_name} for {counts or 'no call'} "
            f"(largest {format_bytes(self.largest)})"
        )
        if self.failed:
            why = next(iter(self.failed.values()))
            line += f"; {len(self.failed)} could not be probed and count none ({why})"
        return line


_KINDS = (  # Call.kind, its name for one and for several
    ("convolution", "convolution", "convolutions"),
    ("attention", "attention call", "attention calls"),
    ("layer norm", "layer norm", "layer norms"),
)
PROBERS: dict[str, Prober] = {}  # str(device) -> its prober; CUDA devices' made on first use


def recorded(
    torch: Any,
    func: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    out: Any,
    record: Callable[[Any, Any, Any], None],
    tally: Tally,
) -> bool:
    """Record ``out``, ``func``'s fake outputs, and its workspaces through
    ``record(tensor, args, kwargs)`` (the storage log's, one tensor at a time) in the order the probe found them; False, and nothing recorded, for other
    ops and on devices with no prober."""
    name = getattr(func, "__name__", None)
    if name not in OPS or not args or not isinstance(args[0], torch.Tensor):
        return False
    device = args[0].device
    prober = prober_for(torch, device)
    if prober is None:
        return False
    call = signature(torch, name, args, kwargs)
    found = prober.probe(call)
    tally.device_name = prober.device_name
    flat = out if isinstance(out, (tuple, list)) else (out,)
    outputs = [t for t in flat if isinstance(t, torch.Tensor) and t.device == device]
    if isinstance(found, str):
        tally.failed[call] = found
        for t in outputs:
            record(t, args, kwargs)
        return True
    tally.probed.add(call)
    tally.largest = max(tally.largest, found.extra)
    order = _matched(found, [_rounded(t.untyped_storage().nbytes()) for t in outputs])
    held: dict[int, Any] = {}

    def buffer(n: int) -> Any:
        return torch.empty(n, dtype=torch.uint8, device=device)

    if order is None:  # outputs first, then the most the op held beyond them
        for t in outputs:
            record(t, args, kwargs)
        if found.extra:
            record(buffer(found.extra), args, kwargs)
        return True
    unmatched = set(range(len(outputs))) - set(order.values())
    for kind, i, n in found.steps:
        if kind == "free":
            held.pop(i, None)  # the fake buffer dies here, and the log sees it freed
        elif i in order:
            record(outputs[order[i]], args, kwargs)
        else:
            held[i] = buffer(n)
            record(held[i], args, kwargs)
    for k in sorted(unmatched):  # empty ones: no allocation on the GPU
        record(outputs[k], args, kwargs)
    return True


def _rounded(n: int) -> int:
    """The caching allocator's size for a request of ``n`` bytes (512-byte multiples)."""
    return max(512, -(-n // 512) * 512) if n else 0


def _matched(found: Probe, sizes: list[int]) -> dict[int, int] | None:
    """The probe's output allocations (by step index) matched to the fake outputs of
    ``sizes``, each to the first unmatched one of its size; None where they do not all match."""
    freed = {i for kind, i, _ in found.steps if kind == "free"}
    order: dict[int, int] = {}
    free = [k for k, n in enumerate(sizes) if n]
    for kind, i, n in found.steps:
        if kind != "alloc" or i in freed:
            continue
        k = next((k for k in free if sizes[k] == n), None)
        if k is None:
            return None
        free.remove(k)
        order[i] = k
    return order if not free else None


def signature(
    torch: Any, op: str, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None
) -> Call:
    """``op`` called with ``args`` and ``kwargs`` as the probe will call it, with this
    process's cuDNN flags."""

    def plain(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            shape, strides = tuple(a.shape), tuple(a.stride())
            dtype = str(a.dtype).removeprefix("torch.")
            return Layout(shape, strides, dtype, a.device.type != "cpu")
        if isinstance(a, (list, tuple)):
            return tuple(plain(x) for x in a)
        return a

    named = tuple(sorted((k, plain(v)) for k, v in (kwargs or {}).items()))
    return Call(op, tuple(plain(a) for a in args), named, cudnn_flags(torch))


def cudnn_flags(torch: Any) -> tuple[tuple[str, bool], ...]:
    """The switches that steer cuDNN's choice: enabled, benchmark, deterministic, TF32."""
    cudnn = torch.backends.cudnn
    try:
        tf32 = bool(cudnn.allow_tf32)
    except RuntimeError:  # the newer fp32_precision API is in use; the two do not mix
        tf32 = cudnn.conv.fp32_precision == "tf32"
    return (
        ("enabled", bool(cudnn.enabled)),
        ("benchmark", bool(cudnn.benchmark)),
        ("deterministic", bool(cudnn.deterministic)),
        ("allow_tf32", tf32),
    )


def prober_for(torch: Any, device: Any) -> Prober | None:
    """The prober of ``device``: a registered one, or for a CUDA device one that probes in a
    worker on the same GPU; None for other devices."""
    key = str(device)
    if key in PROBERS:
        return PROBERS[key]
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    visible = _visible_name(props)
    env = {"CUDA_VISIBLE_DEVICES": visible}
    worker = Worker(prepare=f"{__name__}:ready", env=env, idle_s=IDLE_S)
    PROBERS[key] = Prober(props.name, lambda calls: _in_worker(worker, calls), worker)
    return PROBERS[key]


def warm(torch: Any, device: Any) -> None:
    """Start ``device``'s probing process, where it has one, so that it imports torch and
    starts CUDA while the fake step runs up to its first probe."""
    prober = prober_for(torch, torch.device(device))
    if prober is not None and prober.worker is not None:
        prober.worker.start()


def _visible_name(props: Any) -> str:
    """What ``CUDA_VISIBLE_DEVICES`` names this GPU by in a child process: its UUID."""
    uuid = str(props.uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _in_worker(worker: Worker, calls: Sequence[Call]) -> Sequence[Probe | str]:
    try:
        found = worker.call(measure, list(calls))
    except BaseException:
        worker.stop()  # an interrupt leaves the worker mid-probe: a fresh one next time
        raise
    if isinstance(found, str):  # the worker failed as a whole
        return [found] * len(calls)
    return found


# -- in the worker ---------------------------------------------------------------------------
def ready() -> None:
    """The worker's first act: torch imported, CUDA and cuDNN started."""
    import torch

    torch.cuda.init()
    torch.backends.cudnn.version()


def measure(calls: Sequence[Call]) -> list[Probe | str]:
    """Each call run twice on the GPU, on uninitialised tensors of its layouts; the second
    run's allocations in order (in the allocator's sizes), and what it held at its highest
    beyond its outputs."""
    import torch

    out: list[Probe | str] = []
    for call in calls:
        for name, on in call.flags:
            setattr(torch.backends.cudnn, name, on)
        packet, _, overload = call.op.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        try:
            args = [_made(torch, a) for a in call.args]
            kwargs = {k: _made(torch, v) for k, v in call.kwargs}
            op(*args, **kwargs)  # the first call chooses and builds the plan
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.memory._record_memory_history(context=None, max_entries=10_000)
            try:
                result = op(*args, **kwargs)
                torch.cuda.synchronize()
                trace = torch.cuda.memory._snapshot()["device_traces"][0]
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
            extra = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
            out.append(Probe(_steps(trace), extra))
            del result, args, kwargs
        except torch.OutOfMemoryError:
            out.append("the GPU had no room for the op's tensors")
        except RuntimeError as exc:
            out.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    torch.cuda.empty_cache()  # the worker keeps no cache between jobs
    return out


def _steps(trace: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, int, int], ...]:
    """A memory history's allocations and frees as :attr:`Probe.steps`."""
    steps: list[tuple[str, int, int]] = []
    live: dict[int, int] = {}  # address -> step index of its allocation
    for entry in trace:
        action, address = entry["action"], entry["addr"]
        if action == "alloc":
            live[address] = len(steps)
            steps.append(("alloc", len(steps), _rounded(entry["size"])))
        elif action == "free_requested" and address in live:
            steps.append(("free", live.pop(address), 0))
    return tuple(steps)


def _made(torch: Any, a: Any) -> Any:
    if isinstance(a, Layout):
        device = "cuda" if a.on_gpu else "cpu"
        return torch.empty_strided(a.shape, a.strides, dtype=getattr(torch, a.dtype), device=device)
    if isinstance(a, tuple):
        return [_made(torch, x) for x in a]
    return a
