"""The order in which each op of a training step allocates, on the GPU and in the estimate's fake step.

    python bench/op_order.py OUTPUT_DIR CASE [CASE ...]

Two steps with the same sizes can reserve different bytes when their allocations come in a
different order: the allocator's blocks are split and reused by the order of requests. For each
case of :mod:`zoo` at its bench size, three training steps run on the GPU (random weights,
AdamW, the case's precision) under a dispatch mode that names the op behind every allocation
(the allocator's count of requests read around each op); the estimate's fake step, from the
meta device, names its storages' ops the same way. ``OUTPUT_DIR/order_<case>.json`` gets the
last step's (op, bytes) in order from both, and where they part; and the same step run plainly
(no mode: a mode's Python wrappers change what the autograd engine may do in place) with each
allocation's C++ frames. Needs a GPU.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import model_zoo
import zoo


def _rounded(size: int) -> int:
    return -(-size // 512) * 512


def _steps(case: zoo.Case, built: Any) -> Iterator[int]:
    """Three training steps as the zoo's trial makes them (AdamW, the case's precision);
    yields each step's number before it runs."""
    import torch

    params = [p for p in built.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    bf16 = case.precision == "bf16-autocast"
    for step in range(3):
        yield step
        with torch.autocast("cuda", torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = built.loss(built.model, built.batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss


def real_order(case: zoo.Case) -> list[tuple[str, int]]:
    """(op, bytes) of every allocation of the last of three steps on the GPU, in order."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    built = case.build("cuda", "bench")
    names: list[tuple[int, int, str]] = []  # (first request, end, op)

    def requests() -> int:
        return int(torch.cuda.memory_stats().get("allocation.all.allocated", 0))

    class Named(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            before = requests()
            out = func(*args, **(kwargs or {}))
            names.append((before, requests(), str(func)))
            return out

    starts = []
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None, stacks="python")
    first = requests()
    with Named():
        for _ in _steps(case, built):
            starts.append(requests())
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    allocs = [e["size"] for e in trace if e["action"] == "alloc"]
    op_of = ["(outside any op)"] * len(allocs)
    for before, after, name in names:
        for k in range(before - first, min(after - first, len(allocs))):
            if op_of[k] == "(outside any op)":  # the innermost op names it (nested ops first)
                op_of[k] = name
    last = starts[-1] - first
    del built
    return [(op_of[k], _rounded(allocs[k])) for k in range(last, len(allocs))]


def real_frames(case: zoo.Case) -> list[tuple[str, int]]:
    """(C++ frames, bytes) of every allocation of the last of three plain steps on the GPU, in
    order: no dispatch mode, so the step runs as a user's does (a mode's Python wrappers change
    what the autograd engine may do in place)."""
    import torch

    built = case.build("cuda", "bench")
    for step in _steps(case, built):
        if step == 2:
            torch.cuda.synchronize()
            torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="all")
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    del built
    keep = ("at::native::", "torch::autograd::", "at::_ops::", "c10d::")
    out = []
    for e in trace:
        if e["action"] != "alloc":
            continue
        names = [f["name"] for f in e.get("frames", ()) if f["name"].startswith(keep)]
        names = [n.split("(")[0] for n in names if "_ops::" not in n or "redispatch" not in n]
        out.append((" < ".join(dict.fromkeys(names[:6])), _rounded(e["size"])))
    return out


def fake_order(case: zoo.Case) -> list[tuple[str, int]]:
    """(op, bytes) of every allocation of the estimate's measured step, in order."""
    from jupyter_gpumem.tuner.estimation import fake_peaks, fake_step, storage_log

    current: list[str] = []
    op_of: dict[int, str] = {}
    mode = fake_step.recording_mode()
    dispatch = mode.__torch_dispatch__
    add = storage_log.StorageLog._add
    peaks = fake_peaks.cuda_peaks
    runs: list[Any] = []

    def named(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        current.append(str(func))
        try:
            return dispatch(self, func, types, args, kwargs)
        finally:
            current.pop()

    def added(self: Any, st: Any, *, event: bool) -> int:
        index = add(self, st, event=event)
        op_of.setdefault(index, current[-1] if current else "(outside any op)")
        return index

    def spy(run: Any, *args: Any, **kwargs: Any) -> Any:
        runs.append(run)
        return peaks(run, *args, **kwargs)

    mode.__torch_dispatch__ = named
    storage_log.StorageLog._add = added
    fake_peaks.cuda_peaks = spy
    try:
        model_zoo.estimate(case, "bench", "cuda")
    finally:
        mode.__torch_dispatch__ = dispatch
        storage_log.StorageLog._add = add
        fake_peaks.cuda_peaks = peaks
    run = runs[-1]
    return [
        (op_of.get(i, "?"), _rounded(run.sizes[i]))
        for action, i, _ in run.events[run.window :]
        if action == "alloc" and run.sizes[i]
    ]


def parted(real: list[tuple[str, int]], fake: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """Where the two orders part: each stretch that differs, with its neighbours' ops."""
    matcher = difflib.SequenceMatcher(None, [s for _, s in fake], [s for _, s in real], False)
    out = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            out.append({
                "at": [i1, j1],
                "fake": fake[max(i1 - 1, 0) : i2 + 1],
                "real": real[max(j1 - 1, 0) : j2 + 1],
            })  # fmt: skip
    return out


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:]:
        case = zoo.case(name)
        fake = fake_order(case)
        real = real_order(case)
        plain = real_frames(case)
        result = {
            "case": name, "parted": parted(real, fake), "parted_plain": parted(plain, fake),
            "real": real, "plain": plain, "fake": fake,
        }  # fmt: skip
        (out / f"order_{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(name, "real", len(real), "fake", len(fake), "parted", len(result["parted"]))


if __name__ == "__main__":
    main()
