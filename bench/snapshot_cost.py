"""What reading the allocator's layout costs, apart from what we make of it.

    python bench/snapshot_cost.py --out bench/results/snapshot_cost_h100.json   # GPU machine

In the lived-in kernel of ``bench/scale.py`` (its CUDA part: 20,000 cached tensors and three
models with AdamW state), times, as medians of ``--repeat`` calls each:

- ``snapshot_s``: ``torch.cuda.memory._snapshot()``, layout and trace, as a cell's first
  window takes it;
- ``layout_only_s``: the layout without trace entries (``memory_snapshot(include_traces=False)``,
  where torch has it);
- ``parse_all_s``: our records of every segment (``tracking/snapshot.py``);
- ``trace_only_s``: the trace without the layout, as a window's end reads it
  (``tracking/cuda.TRACES``: a snapshot filtered to an empty memory pool of ours).

Asking for a memory pool that does not exist crashed torch 2.11's ``_cuda_memorySnapshot``
on an H100; a pool that exists and holds nothing is what ``TRACES`` asks for.

Each also with the allocator's trace on (``recording_*``), since the snapshot then carries
every block's frames.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch


def _median_s(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(repeat: int) -> dict[str, Any]:
    from jupyter_gpumem.tracking import cuda, snapshot

    snap = torch.cuda.memory._snapshot()
    blocks = sum(len(s["blocks"]) for s in snap["segments"])
    figures: dict[str, Any] = {
        "segments": len(snap["segments"]),
        "blocks": blocks,
        "trace_entries": sum(len(t) for t in snap["device_traces"]),
        "snapshot_s": _median_s(torch.cuda.memory._snapshot, repeat),
        "parse_all_s": _median_s(lambda: snapshot.read_segments(snap["segments"], 0), repeat),
    }
    if cuda.TRACES.read(torch) is not None:
        figures["trace_only_s"] = _median_s(lambda: cuda.TRACES.read(torch), repeat)
    if "include_traces" in inspect.signature(torch.cuda.memory.memory_snapshot).parameters:
        layout = torch.cuda.memory.memory_snapshot
        figures["layout_only_s"] = _median_s(lambda: layout(include_traces=False), repeat)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    import scale

    device = torch.device("cuda")
    held = scale.lived_in(device, args.quick)
    held.pop("rows"), held.pop("df")  # host objects: the snapshot does not see them
    result = {"idle": measure(args.repeat)}
    torch.cuda.memory._record_memory_history("all", context="alloc", stacks="python")
    result["recording"] = measure(args.repeat)
    torch.cuda.memory._record_memory_history(None)
    out = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0),
        **result,
    }
    print(json.dumps(out, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
