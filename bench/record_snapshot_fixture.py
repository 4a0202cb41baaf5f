"""Record torch's own snapshot dicts of a training step on the GPU machine, as a CI fixture.

    python bench/record_snapshot_fixture.py OUT.json

The fixture holds two ``torch.cuda.memory._snapshot()`` results as torch gives them (the
layout when recording starts, and the layout with the trace after two Adam steps), frames
trimmed to one per entry, and the allocator's own counters over the same interval. CPU tests
read it with :mod:`jupyter_gpumem.tracking.snapshot` and check the replay against the counters.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn as nn


def _trimmed(snapshot: dict) -> dict:
    """Only the fields the decoding reads, one frame per trace entry (the fixture stays small)."""
    segments = [
        {k: v for k, v in seg.items() if k != "frames"}
        | {"blocks": [{k: v for k, v in b.items() if k != "frames"} for b in seg["blocks"]]}
        for seg in snapshot["segments"]
    ]
    traces = [
        [{k: (v[:1] if k == "frames" else v) for k, v in e.items()} for e in trace]
        for trace in snapshot["device_traces"]
    ]
    return {"segments": segments, "device_traces": traces}


def main(path: str) -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    keep = [torch.empty(n, device=dev) for n in (3_000_000, 700_000, 5, 4_000_000, 123_457)]
    del keep[1], keep[2]  # a fragmented starting layout
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history("all", context="alloc", stacks="python")
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory._snapshot()
    allocated_before = torch.cuda.memory_allocated()
    reserved_before = torch.cuda.memory_reserved()
    for _ in range(2):
        x = torch.randn(64, 256, device=dev)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    big = torch.empty(5_000_000, device=dev)
    del big, x, loss
    torch.cuda.synchronize()
    after = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    data = {
        "before": _trimmed(before),
        "after": _trimmed(after),
        "allocated_before": allocated_before,
        "reserved_before": reserved_before,
        "allocated_after": torch.cuda.memory_allocated(),
        "reserved_after": torch.cuda.memory_reserved(),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "max_reserved": torch.cuda.max_memory_reserved(),
        "torch_version": torch.__version__,
        "device_name": torch.cuda.get_device_name(dev),
    }
    with open(path, "w") as f:
        json.dump(data, f)
    print(f"{len(data['after']['device_traces'][0])} trace entries -> {path}")


if __name__ == "__main__":
    main(sys.argv[1])
