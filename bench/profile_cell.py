"""Where the time of a `%%gpumem` cell goes: cProfile around ``run_cell``, after warm-ups.

python bench/profile_cell.py gpt2_3_steps                  # any cell names of bench/scale.py
python bench/profile_cell.py mlp_200_steps tiny --quick
python bench/profile_cell.py tiny gpt2_3_steps --lived-in  # in the lived-in kernel of bench/scale.py
python bench/profile_cell.py mlp_200_steps --lived-in --timers  # wall time of our parts, unprofiled
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="+")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--lines", type=int, default=45)
    parser.add_argument(
        "--warm", type=int, default=3, help="`%%gpumem` runs before the profiled one"
    )
    parser.add_argument("--lived-in", action="store_true", help="fill the namespace first")
    parser.add_argument(
        "--natural-gc",
        action="store_true",
        help="with --timers: no collection before each run, so collections fall where they would",
    )
    parser.add_argument(
        "--timers",
        action="store_true",
        help="time our main parts with perf_counter instead of cProfile (no profiler overhead)",
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    bench = scale.Bench(device)
    if args.lived_in:
        bench.shell.user_ns.update(scale.lived_in(device, args.quick))
        settling = bench.settle()
        print(f"settled in {len(settling)} cells, the last {settling[-1] * 1e3:.1f} ms")
    known = {c.name: c for c in scale.cells(args.quick, cpu=not cuda)}
    for name in args.cells:
        _profile(bench, known[name], device, args)


def _profile(bench: scale.Bench, cell: scale.Cell, device: torch.device, args) -> None:
    bench.shell.user_ns.update(cell.build(device), time=time, sync=bench.sync, torch=torch)
    body = scale.BODY.format(steps=cell.steps, step=cell.step)
    bench._once(body)
    for _ in range(args.warm):
        bench._once("%%gpumem --quiet\n" + body)
        bench._once(body)
    plain, _, _ = bench._once(body)
    if args.timers:
        _timed(bench, cell, body, plain, args)
        return
    profile = cProfile.Profile()
    with contextlib.redirect_stdout(io.StringIO()):
        t0 = time.perf_counter()
        profile.enable()
        bench.shell.run_cell("%%gpumem -o r\n" + body)
        profile.disable()
        whole = time.perf_counter() - t0
    in_cell = bench.shell.user_ns["_in_cell_s"]
    print(
        f"== {cell.name}: plain {plain:.3f} s, %%gpumem {whole:.3f} s (in the cell {in_cell:.3f} s)"
    )
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(key).print_stats(args.lines)
        print(out.getvalue())


_PARTS = (
    ("jupyter_gpumem.tracking.cuda", "CudaSession", "_begin"),
    ("jupyter_gpumem.tracking.cuda", "CudaSession", "_close"),
    ("jupyter_gpumem.tracking.cuda", "CudaSession", "finish"),
    ("jupyter_gpumem.tracking.cuda", "TraceReader", "read"),
    ("jupyter_gpumem.tracking.recorder", "Recorder", "start"),
    ("jupyter_gpumem.tracking.recorder", "Recorder", "stop"),
    ("jupyter_gpumem.tracking.recorder", "Recorder", "_named"),
    ("jupyter_gpumem.session", "Measurement", "finish"),
    ("jupyter_gpumem.session", "Measurement", "_leak_hints"),
    ("jupyter_gpumem.ipython.magic", "GpuMemMagics", "_finish"),
    ("jupyter_gpumem.session", None, "build_report"),
    ("jupyter_gpumem.analysis.attribution", None, "categorize"),
    ("jupyter_gpumem.analysis.peaks", None, "replay"),
    ("jupyter_gpumem.held.ipython_refs", None, "scan_namespace"),
    ("jupyter_gpumem.held.ipython_refs", None, "check_leaks"),
    ("jupyter_gpumem.tracking.namespace", "NamedMemo", "named"),
    ("jupyter_gpumem.tracking.tags", "Tagger", "start"),
    ("jupyter_gpumem.tracking.tags", "Tagger", "stop"),
    ("jupyter_gpumem.tracking.cuda", None, "_events"),
    ("jupyter_gpumem.tracking.cuda", None, "_segments"),
    ("jupyter_gpumem.tracking.cuda", None, "_new_blocks"),
    ("jupyter_gpumem.analysis.breakdown", None, "_categorize_held"),
    ("jupyter_gpumem.analysis.breakdown", None, "tensor_records"),
    ("jupyter_gpumem.analysis.replay", None, "layout_after"),
    ("jupyter_gpumem.records", "AllocatedSummary", "of"),
    ("jupyter_gpumem.ipython.display", None, "show"),
    ("jupyter_gpumem.ipython.cell_run", None, "run"),
    ("jupyter_gpumem.ipython.cell_run", None, "prepare"),
    ("jupyter_gpumem.session", "Measurement", "__init__"),
    ("jupyter_gpumem.session", None, "process_bytes"),
    ("jupyter_gpumem.session", None, "with_ranks"),
    ("jupyter_gpumem.logbook.store", None, "keep"),
    ("jupyter_gpumem.report.build", None, "_device_attribution"),
    ("jupyter_gpumem.tracking.cuda", "CudaSession", "_enable"),
    ("jupyter_gpumem.tracking.cuda", "CudaSession", "sample"),
    ("jupyter_gpumem.tracking.cuda", "CudaSession", "begin_window"),
    ("jupyter_gpumem.tracking.recorder", "Recorder", "_boundary"),
    ("jupyter_gpumem.tracking.cuda", None, "workspaces"),
    ("torch.cuda.memory", None, "_snapshot"),
)


def _timed(
    bench: scale.Bench, cell: scale.Cell, body: str, plain: float, args: argparse.Namespace
) -> None:
    """Median wall time of each part over 9 `%%gpumem` runs, alternating with plain runs."""
    import importlib
    import statistics

    spent: dict[str, list[float]] = {}
    originals = []
    for module_name, cls_name, attr in _PARTS:
        module = importlib.import_module(module_name)
        cls = module if cls_name is None else getattr(module, cls_name, None)
        if cls is None or not hasattr(cls, attr):
            print(f"  (no {module_name}.{attr})")
            continue
        original = getattr(cls, attr)
        key = f"{cls_name or module_name.rsplit('.', 1)[-1]}.{attr}"

        def timed(*a, _f=original, _k=key, **k):
            t0 = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                spent.setdefault(_k, []).append(time.perf_counter() - t0)

        setattr(cls, attr, timed)
        originals.append((cls, attr, original))
    import gc

    collecting: dict[str, float] = {}

    collect = gc.collect

    def explicit_collect(*a: object) -> int:  # the harness's own, before each run: not timed
        if args.natural_gc:
            return 0
        collecting["explicit"] = 1.0
        try:
            return collect(*a)  # type: ignore[arg-type]
        finally:
            collecting.pop("explicit")

    scale.gc.collect = explicit_collect  # type: ignore[attr-defined]

    def gc_timer(phase: str, info: dict) -> None:
        if "explicit" in collecting:
            return
        if phase == "start":
            collecting["t0"] = time.perf_counter()
        elif "t0" in collecting:
            key = f"gc gen{info['generation']} [{collecting['run']}]"
            spent.setdefault(key, []).append(time.perf_counter() - collecting.pop("t0"))

    gc.callbacks.append(gc_timer)
    wholes, plains, in_cells, plain_in_cells = [], [], [], []
    runs = 9
    try:
        for _ in range(runs):
            collecting["run"] = "gpumem"
            whole, in_cell, _ = bench._once("%%gpumem --quiet\n" + body)
            wholes.append(whole)
            in_cells.append(in_cell)
            collecting["run"] = "plain"
            whole, in_cell, _ = bench._once(body)
            plains.append(whole)
            plain_in_cells.append(in_cell)
    finally:
        gc.callbacks.remove(gc_timer)
        scale.gc.collect = collect  # type: ignore[attr-defined]
        for owner, attr, original in originals:
            setattr(owner, attr, original)
    plain = statistics.median(plains)
    ratios = [w / p for w, p in zip(wholes, plains, strict=True)]
    print(
        f"== {cell.name}: plain {plain * 1e3:.1f} ms, %%gpumem {statistics.median(wholes) * 1e3:.1f} ms"
        f" (median ratio {statistics.median(ratios):.3f}); in the cell: plain"
        f" {statistics.median(plain_in_cells) * 1e3:.1f} ms, %%gpumem"
        f" {statistics.median(in_cells) * 1e3:.1f} ms"
    )
    for key, times in spent.items():
        per_cell = sum(times) / runs
        print(f"  {key:32s} {per_cell * 1e3:8.2f} ms per cell ({len(times) / runs:.0f} calls)")


if __name__ == "__main__":
    main()
