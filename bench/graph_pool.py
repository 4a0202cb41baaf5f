"""What generate's compiled static cache holds on the GPU: its CUDA graph pool, by request.

    python bench/graph_pool.py OUTPUT.json [CASE ...] [--lived-in]
    python bench/graph_pool.py --from-cpu MEASURED.json OUTPUT.json   # no GPU needed

For each zoo ``generate`` case whose cache generate compiles (``cache_implementation="static"``
without ``disable_compile``), a process of its own builds the model on the GPU and runs the
call once with the allocator's history on (C++ frames too); with ``--lived-in`` after the
case's estimate in the same process, as ``model_zoo.py`` measures it. It writes the peak
allocated and reserved bytes, the segments at the end by pool (the default pool and each
private CUDA graph pool), the segments held at the reserved peak with the request that made
each, and the requests made inside private pools (in a private segment after its making:
``torch.cuda.graph`` empties the cache first, so a pool may reuse the default pool's
addresses), by size and by the frames that asked (Python's outside torch, and C++'s that name
a library's workspace). Beside them, the estimate from the meta device, its pool included
(:mod:`jupyter_gpumem.tuner.estimation.graph_pool`). Needs a GPU.

``--from-cpu`` needs none: each compiled row of a ``model_zoo.py`` result measured on an H200 is
estimated for the H200 from this CPU (the estimate without CUDA, in this process), beside
what the GPU measured.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import model_zoo
import zoo

_CPP_NAMED = ("Workspace", "workspace", "cublas", "Cublas")


def _pools(snapshot: dict[str, Any]) -> dict[str, dict[str, int]]:
    pools: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for seg in snapshot["segments"]:
        pool = str(tuple(seg.get("segment_pool_id", (0, 0))))
        pools[pool]["segments"] += 1
        pools[pool]["reserved"] += seg["total_size"]
        pools[pool]["allocated"] += seg["allocated_size"]
        pools[pool][f"{seg['segment_type']}_segments"] += 1
    return {k: dict(v) for k, v in pools.items()}


def _asker(frames: list[dict[str, Any]]) -> str:
    """The request's frames worth reading: a library workspace's C++ frame, else the first
    Python frames outside torch."""
    for f in frames:
        if not f["filename"].endswith(".py") and any(n in f["name"] for n in _CPP_NAMED):
            return f["name"][:120]
    py = [f for f in frames if f["filename"].endswith(".py") and "/torch/" not in f["filename"]]
    return " < ".join(f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in py[:3])


def measured_pool(name: str, lived_in: bool = False) -> dict[str, Any]:
    """The case's compiled call on the GPU, its private pools' requests named (this process),
    after the case's estimate where ``lived_in``; with the segments held at the reserved peak."""
    import torch

    case = zoo.case(name)
    if lived_in:  # as the zoo measures it: the estimate first, in the same process
        model_zoo.estimate(case, "bench", "cuda")
    built = case.build("cuda", "bench")
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="all")
    allocated, reserved = model_zoo.measured(case, built, "bench")
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    private = {
        s["address"]: s["address"] + s["total_size"]
        for s in snap["segments"]
        if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0)
    }
    trace = snap["device_traces"][0]
    made: dict[int, int] = {}  # private segment -> the index of its making in the trace
    for n, e in enumerate(trace):
        if e["action"] == "segment_alloc" and e["addr"] in private:
            made[e["addr"]] = n
    requests: collections.Counter[tuple[int, str]] = collections.Counter()
    for n, e in enumerate(trace):
        if e["action"] != "alloc":
            continue
        for start, end in private.items():
            if start <= e["addr"] < end and made.get(start, len(trace)) < n:
                requests[(e["size"], _asker(e.get("frames", [])))] += 1
    return {
        "case": name,
        "lived_in": lived_in,
        "at_reserved_peak": _at_reserved_peak(trace, private),
        "allocated": allocated,
        "reserved": reserved,
        "pools": _pools(snap),
        "segment_frees": sum(1 for e in trace if e["action"] == "segment_free"),
        "private_requests": [
            {"size": s, "count": n, "asker": a} for (s, a), n in sorted(requests.items())
        ],
        "private_segments": sorted(
            s["total_size"]
            for s in snap["segments"]
            if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0)
        ),
    }


def _at_reserved_peak(trace: list[dict[str, Any]], private: dict[int, int]) -> dict[str, Any]:
    """The segments held when the trace's reserved bytes were highest, each with the request
    that made it (bytes are counted from the trace's start: what was reserved before is not)."""
    held: dict[int, tuple[int, str]] = {}
    total = best = 0
    chosen: list[tuple[int, str]] = []
    for n, e in enumerate(trace):
        if e["action"] == "segment_alloc":
            held[e["addr"]] = (e["size"], f"{n}: {_asker(e.get('frames', []))}")
            total += e["size"]
            if total > best:
                best, chosen = total, list(held.values())
        elif e["action"] == "segment_free" and e["addr"] in held:
            total -= held.pop(e["addr"])[0]
    return {"made_since_start": best, "segments": sorted(chosen, reverse=True)[:40]}


def estimated(name: str) -> dict[str, Any]:
    case = zoo.case(name)
    t0 = time.perf_counter()
    found, _ = model_zoo.estimate(case, "bench", "cuda")
    return {
        "estimated_allocated": found.peak_bytes,
        "estimated_reserved": found.peak_reserved_bytes,
        "estimate_s": time.perf_counter() - t0,
        "reason": found.reason,
        "breakdown": found.breakdown,
        "notes": list(found.notes),
    }


def from_cpu(measured: Path, out: Path) -> None:
    """The compiled rows of ``measured`` estimated for an H200 from the CPU, beside the GPU's."""
    from jupyter_gpumem.tuner.estimation import cards, without_cuda
    from jupyter_gpumem.tuner.estimation.generation import generate_run

    without_cuda.prepare()
    rows = []
    for m in json.loads(measured.read_text())["cases"]:
        case = zoo.case(m["case"])
        batch, prompt, new = zoo.GENERATE["bench"]
        built = case.build("meta", "bench")
        job = (
            built.model, cards.card("H200"), (batch, prompt, new),
            model_zoo.generate_kwargs(case, new), case.name, generate_run,
        )  # fmt: skip
        found = without_cuda._generate_job(job)
        row = {
            "case": case.name,
            "reason": found.reason,
            "estimated_allocated": found.peak_bytes,
            "estimated_reserved": found.peak_reserved_bytes,
            "measured_allocated": m["measured_allocated"],
            "measured_reserved": m["measured_reserved"],
            "breakdown": found.breakdown,
        }
        if found.peak_bytes is not None and found.peak_reserved_bytes is not None:
            row["error_allocated_pct"] = 100 * (found.peak_bytes / m["measured_allocated"] - 1)
            row["error_reserved_pct"] = 100 * (
                found.peak_reserved_bytes / m["measured_reserved"] - 1
            )
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "breakdown"}), flush=True)
    out.write_text(json.dumps({"measured": str(measured), "cases": rows}, indent=1) + "\n")


def main() -> None:
    if sys.argv[1] == "--from-cpu":
        from_cpu(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    if sys.argv[1] == "--case":  # one case, in this process
        name, out = sys.argv[2], Path(sys.argv[3])
        if "--estimate" in sys.argv:
            row = estimated(name)
        else:
            row = measured_pool(name, "--lived-in" in sys.argv)
        out.write_text(json.dumps(row, indent=1))
        return
    out = Path(sys.argv[1])
    lived_in = "--lived-in" in sys.argv
    names = [a for a in sys.argv[2:] if a != "--lived-in"] or ["llama-generate-static-compiled"]
    rows = []
    for name in names:
        row: dict[str, Any] = {}
        for extra in (["--lived-in"] if lived_in else [], ["--estimate"]):  # a process each
            part = out.with_suffix(f".{name}{''.join(extra)}.json")
            cmd = [sys.executable, __file__, "--case", name, str(part), *extra]
            with tempfile.TemporaryDirectory() as cache:  # compiled as on a fresh machine
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                done = subprocess.run(cmd, text=True, capture_output=True, env=env)
            if done.returncode:
                row[f"failed{''.join(extra)}"] = done.stderr[-2000:]
                continue
            row.update(json.loads(part.read_text()))
            part.unlink()
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "private_requests"}), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cases": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
