"""cuDNN's convolution workspaces, measured on the GPU once for each convolution an estimate meets.

A convolution on CUDA takes a workspace from the caching allocator for the algorithm cuDNN
chose and frees it before it returns; its backward takes one for the input's gradient and
one for the weight's. Their sizes are cuDNN's heuristics' choice for the GPU, the cuDNN
version, the shapes, strides, dtypes and flags: up to 174 MiB for one backward at batch 32
on an H200, and about the input plus the output for strided fp32 forwards
(``bench/results/op_transients_h200.json``). No formula gives them, so each distinct
convolution of a fake step is run once, for real, where it would run: on the same GPU, in a
process of the estimate's own (:class:`~.worker_process.Worker`), which never touches the
user's allocator, its peak counters or what a ``%%gpumem`` cell records. What the op held at
its highest beyond its inputs and outputs is made, fake, after its outputs.

The worker's first probe costs a second or two (it imports torch and starts CUDA); later ones
milliseconds each, and each convolution is probed once per process and device. The worker ends
after :data:`IDLE_S` seconds without a probe, giving back its CUDA context.

Known limitations:
- With ``torch.backends.cudnn.benchmark`` on, the steady step's algorithm is probed; the
  first step's search, which tries several algorithms' workspaces, is not counted.
- A convolution the probe cannot run (the GPU has no room for its tensors) gets no workspace,
  and the estimate says how many.
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
_OPS = frozenset({"convolution.default", "convolution_backward.default"})


@dataclass(frozen=True)
class Layout:
    """A tensor argument as the probe makes it again: shape, strides (elements) and dtype."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str  # "float32", "bfloat16", ...


@dataclass(frozen=True)
class Convolution:
    """One convolution as cuDNN sees it: the op, its arguments (tensors as layouts) and the
    flags that steer cuDNN's choice of algorithm."""

    op: str  # "convolution.default" or "convolution_backward.default"
    args: tuple[Any, ...]
    flags: tuple[tuple[str, bool], ...]


Measure = Callable[[Sequence[Convolution]], Sequence["int | str"]]


@dataclass
class Prober:
    """The workspaces of one device's convolutions: what ``measure`` found for each (bytes, or
    why it could not), kept for the process's life."""

    device_name: str
    measure: Measure
    found: dict[Convolution, int | str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def workspace(self, conv: Convolution) -> int | str:
        with self.lock:
            if conv not in self.found:
                (self.found[conv],) = self.measure([conv])
            return self.found[conv]


@dataclass
class Tally:
    """What one fake run's convolutions were given: for the estimate's note."""

    device_name: str = ""
    probed: set[Convolution] = field(default_factory=set)
    failed: dict[Convolution, str] = field(default_factory=dict)
    largest: int = 0

    def note(self) -> str:
        """One line for the estimate; empty where the run had no convolution to probe."""
        if not self.probed and not self.failed:
            return ""
        line = (
            f"cuDNN's convolution workspaces measured on this {self.device_name} for "
            f"{len(self.probed)} distinct convolutions (largest {format_bytes(self.largest)})"
        )
        if self.failed:
            why = next(iter(self.failed.values()))
            line += f"; {len(self.failed)} could not be probed and count none ({why})"
        return line


PROBERS: dict[str, Prober] = {}  # str(device) -> its prober; CUDA devices' made on first use


def buffers(
    torch: Any, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None, tally: Tally
) -> list[Any]:
    """The workspace ``func`` holds beyond its outputs while it runs, made (fake) after them;
    none for other ops, and on devices with no prober."""
    name = getattr(func, "__name__", None)
    if name not in _OPS or kwargs or not args or not isinstance(args[0], torch.Tensor):
        return []
    device = args[0].device
    prober = prober_for(torch, device)
    if prober is None:
        return []
    conv = signature(torch, name, args)
    size = prober.workspace(conv)
    tally.device_name = prober.device_name
    if isinstance(size, str):
        tally.failed[conv] = size
        return []
    tally.probed.add(conv)
    tally.largest = max(tally.largest, size)
    return [torch.empty(size, dtype=torch.uint8, device=device)] if size else []


def signature(torch: Any, op: str, args: Sequence[Any]) -> Convolution:
    """``op`` called with ``args`` as the probe will call it, with this process's cuDNN flags."""

    def plain(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return Layout(tuple(a.shape), tuple(a.stride()), str(a.dtype).removeprefix("torch."))
        if isinstance(a, (list, tuple)):
            return tuple(plain(x) for x in a)
        return a

    return Convolution(op, tuple(plain(a) for a in args), cudnn_flags(torch))


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
    worker = Worker(env={"CUDA_VISIBLE_DEVICES": visible}, idle_s=IDLE_S)
    PROBERS[key] = Prober(props.name, lambda convs: _in_worker(worker, convs))
    return PROBERS[key]


def _visible_name(props: Any) -> str:
    """What ``CUDA_VISIBLE_DEVICES`` names this GPU by in a child process: its UUID."""
    uuid = str(props.uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _in_worker(worker: Worker, convs: Sequence[Convolution]) -> Sequence[int | str]:
    try:
        found = worker.call(measure, list(convs))
    except BaseException:
        worker.stop()  # an interrupt leaves the worker mid-probe: a fresh one next time
        raise
    if isinstance(found, str):  # the worker failed as a whole
        return [found] * len(convs)
    return found


# -- in the worker ---------------------------------------------------------------------------
def measure(convs: Sequence[Convolution]) -> list[int | str]:
    """Each convolution run twice on the GPU, on uninitialised tensors of its layouts: what
    the second run held at its highest beyond what it held after (its outputs), in bytes."""
    import torch

    out: list[int | str] = []
    for conv in convs:
        for name, on in conv.flags:
            setattr(torch.backends.cudnn, name, on)
        packet, _, overload = conv.op.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        try:
            args = [_made(torch, a) for a in conv.args]
            op(*args)  # the first call chooses and builds the plan
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            result = op(*args)
            torch.cuda.synchronize()
            out.append(torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated())
            del result, args
        except torch.OutOfMemoryError:
            out.append("the GPU had no room for the convolution's tensors")
        except RuntimeError as exc:
            out.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    torch.cuda.empty_cache()  # the worker keeps no cache between jobs
    return out


def _made(torch: Any, a: Any) -> Any:
    if isinstance(a, Layout):
        dtype = getattr(torch, a.dtype)
        return torch.empty_strided(a.shape, a.strides, dtype=dtype, device="cuda")
    if isinstance(a, tuple):
        return [_made(torch, x) for x in a]
    return a
