"""Record a real allocator trace on the GPU machine as a small JSON fixture for CI.

    python bench/record_trace_fixture.py OUT.json

The fixture holds the cell's starting layout, its events (without stack frames)
and the allocator's own counters measured independently, so that CPU tests can
check the replay against a real CUDA allocator.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import torch
import torch.nn as nn

from jupyter_gpumem.tracking.recorder import Recorder, RecordOptions


def main(path: str) -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    keep = [torch.empty(n, device=dev) for n in (3_000_000, 700_000, 5, 4_000_000, 123_457)]
    del keep[1], keep[2]
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    tracker = Recorder(RecordOptions())
    tracker.start()
    for _ in range(2):
        x = torch.randn(64, 256, device=dev)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    big = torch.empty(5_000_000, device=dev)
    del big, x, loss
    recording = tracker.stop(None)
    rec = recording.devices[0]
    data = asdict(rec)
    data["events"] = [{k: v for k, v in e.items() if k != "frames"} for e in data["events"]]
    data["independent_peak_allocated"] = torch.cuda.max_memory_allocated()
    data["independent_peak_reserved"] = torch.cuda.max_memory_reserved()
    data["torch_version"] = torch.__version__
    with open(path, "w") as f:
        json.dump(data, f)
    print(f"{len(rec.events)} events -> {path}")


if __name__ == "__main__":
    main(sys.argv[1])
