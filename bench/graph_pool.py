"""What generate's compiled static cache holds on the GPU: its CUDA graph pools, by segment.

    python bench/graph_pool.py OUTPUT.json [CASE]

For a zoo ``generate`` case whose cache generate compiles (``cache_implementation="static"``
without ``disable_compile``), the call runs twice on the GPU with the allocator's history on:
once eager (``disable_compile=True``) and once compiled. For each: peak allocated and reserved,
and the segments at the end split by pool (the default pool and each private CUDA graph pool),
with the allocations made inside private pools summed by the frames that asked. Needs a GPU.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import model_zoo
import zoo


def _pools(snapshot: dict[str, Any]) -> dict[str, dict[str, int]]:
    pools: dict[str, dict[str, int]] = collections.defaultdict(lambda: collections.Counter())
    for seg in snapshot["segments"]:
        pool = str(tuple(seg.get("segment_pool_id", (0, 0))))
        pools[pool]["segments"] += 1
        pools[pool]["reserved"] += seg["total_size"]
        pools[pool]["allocated"] += seg["allocated_size"]
        pools[pool][f"{seg['segment_type']}_segments"] += 1
    return {k: dict(v) for k, v in pools.items()}


def _run(case: zoo.Case, built: zoo.Built, compiled: bool) -> dict[str, Any]:
    import torch

    extra = {} if compiled else {"disable_compile": True}
    patched = zoo.Case(
        case.name, case.family, case.workload, case.precision, case.dtype, case.attention,
        {**case.generate, **extra}, case.needs,
    )  # fmt: skip
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    allocated, reserved = model_zoo.measured(patched, built, "bench")
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    private = {
        tuple(s["segment_pool_id"])
        for s in snap["segments"]
        if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0)
    }
    by_frames: collections.Counter[str] = collections.Counter()
    addresses = {
        (s["address"], s["address"] + s["total_size"])
        for s in snap["segments"]
        if tuple(s.get("segment_pool_id", (0, 0))) in private
    }
    for e in snap["device_traces"][0]:
        if e["action"] != "alloc" or not any(a <= e["addr"] < b for a, b in addresses):
            continue
        frames = [f for f in e.get("frames", ()) if f["filename"].endswith(".py")][:4]
        key = " < ".join(f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in frames)
        by_frames[key] += e["size"]
    return {
        "compiled": compiled,
        "allocated": allocated,
        "reserved": reserved,
        "pools": _pools(snap),
        "private_allocations_by_frames": by_frames.most_common(30),
        "segment_sizes": sorted(
            (s["total_size"], str(tuple(s.get("segment_pool_id", (0, 0)))))
            for s in snap["segments"]
        ),
    }


def main() -> None:
    out = Path(sys.argv[1])
    case = zoo.case(sys.argv[2] if len(sys.argv) > 2 else "llama-generate-static-compiled")
    built = case.build("cuda", "bench")
    runs = [_run(case, built, compiled=False), _run(case, built, compiled=True)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"case": case.name, "runs": runs}, indent=1) + "\n")
    for r in runs:
        print(json.dumps({k: r[k] for k in ("compiled", "allocated", "reserved", "pools")}))


if __name__ == "__main__":
    main()
