"""Where the time of a `%%gpumem` cell goes: cProfile around ``run_cell``, after warm-ups.

python bench/profile_cell.py gpt2_3_steps                  # any cell names of bench/scale.py
python bench/profile_cell.py mlp_200_steps tiny --quick
python bench/profile_cell.py tiny gpt2_3_steps --lived-in  # in the lived-in kernel of bench/scale.py
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


if __name__ == "__main__":
    main()
