"""What Python's garbage collector costs `%%gpumem` cells over a session.

    python bench/gc_cost.py --out bench/results/gc_cost_cpu.json             # any machine
    python bench/gc_cost.py --kernel lived-in --out bench/results/gc_cost_h100.json

``bench/scale.py`` collects garbage before every run, so that runs compare alike; that also
hides what the collections the extension's own objects set off cost a real session. Here
nothing is collected by hand: each cell runs ``--cells`` times plain and as many times under
`%%gpumem`, alternately, and every collection is timed and counted, by generation, against
the run it fell in. A full (generation 2) collection visits every tracked object of the
process; in a lived-in kernel it is the slowest thing Python does, and a cell that moves many
objects into the oldest generation brings the next one closer. ``mean_whole_s`` carries those
collections shared out over the cells; ``median_whole_s`` mostly misses them.

Cells: ``tiny`` (``_z = 1``), ``gpt2_3_steps`` (GPT-2 124M on a GPU; a 2-layer GPT-2 on the
CPU) and ``mlp_200_steps`` (20 steps of a narrower MLP on the CPU), as in ``bench/scale.py``.
``--kernel lived-in`` fills the namespace as ``bench/scale.py`` does first.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import scale
import torch

CELLS = ("tiny", "gpt2_3_steps", "mlp_200_steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cells", type=int, default=40, help="runs of each kind per cell")
    parser.add_argument("--only", nargs="*", choices=CELLS, default=list(CELLS))
    parser.add_argument("--kernel", choices=("fresh", "lived-in"), default="fresh")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    bench = scale.Bench(device, natural_gc=True)
    if args.kernel == "lived-in":
        bench.shell.user_ns.update(scale.lived_in(device, quick=False, models=cuda))
        bench.settle()
    known = {c.name.removesuffix("_cpu"): c for c in scale.cells(quick=not cuda, cpu=False)}
    results = []
    for name in args.only:
        try:
            results.append(_run(bench, known[name], args.cells, device))
        except ImportError as exc:  # transformers, where it is not installed
            results.append({"cell": name, "skipped": repr(exc)})
        print(json.dumps(results[-1]), flush=True)
    out = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "kernel": args.kernel,
        "tracked_objects": len(gc.get_objects()),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))


def _run(bench: scale.Bench, cell: scale.Cell, n: int, device: torch.device) -> dict[str, Any]:
    ns = bench.shell.user_ns
    ns.update(cell.build(device), time=time, sync=bench.sync, torch=torch)
    body = scale.BODY.format(steps=cell.steps, step=cell.step)
    for source in (body, "%%gpumem --quiet\n" + body):  # warm-up
        bench._once(source)
    gc.collect()
    kinds = {"plain": body, "gpumem": "%%gpumem --quiet\n" + body}
    wholes: dict[str, list[float]] = {kind: [] for kind in kinds}
    spent: dict[str, dict[int, list[float]]] = {kind: {0: [], 1: [], 2: []} for kind in kinds}
    now = {"kind": "plain", "t0": 0.0}

    def timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            now["t0"] = time.perf_counter()
        else:
            took = time.perf_counter() - now["t0"]
            spent[str(now["kind"])][info["generation"]].append(took)

    gc.callbacks.append(timer)
    try:
        for _ in range(n):
            for kind, source in kinds.items():
                now["kind"] = kind
                wholes[kind].append(bench._once(source)[0])
    finally:
        gc.callbacks.remove(timer)
    for key in ("model", "opt", "ids", "x", "train_step", "r", "_"):
        ns.pop(key, None)
    gc.collect()
    out: dict[str, Any] = {"cell": cell.name, "steps": cell.steps, "cells": n}
    for kind in kinds:
        out[kind] = {
            "median_whole_s": statistics.median(wholes[kind]),
            "mean_whole_s": statistics.fmean(wholes[kind]),
            "collections_per_cell": {g: len(t) / n for g, t in spent[kind].items()},
            "collector_s_per_cell": {g: sum(t) / n for g, t in spent[kind].items()},
        }
    return out


if __name__ == "__main__":
    sys.exit(main())
