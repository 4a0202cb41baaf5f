"""What `%%gpumem` costs a short host-bound training cell on the CPU, beside its long twin.

    python bench/short_cell_cpu.py --out bench/results/short_cell_cpu.json

The cell is ``bench/scale.py``'s 6 x Linear(512) MLP with Adam at batch 64 (forward, loss,
backward, optimizer step, zero_grad), run for 200 steps and for 2000, plain and under
`%%gpumem` alternately in one IPython shell with the extension loaded, on the CPU event source
(no CUDA device is seen). Whole-cell wall time is ``run_cell``'s, analysis and display
included; figures are medians over rounds, and ``whole_overhead`` the median of the adjacent
runs' ratios (see ``bench/scale.py``). ``--kernel lived-in`` first fills the namespace as
``bench/scale.py``'s lived-in kernel does, with its three models: 20,000 live tensors, three
models with AdamW state, 2,000,000 small dicts and a 5,000,000-row DataFrame. ``--update
by-hand`` trains the same MLP as plain tensors with a hand-written SGD update instead: a cell
that steps no optimizer and calls no module, whose steps are its loop's iterations.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU event source, as on a machine without CUDA
sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale
import torch

STEPS = (200, 2000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5, help="tripled for cells under 2 s")
    parser.add_argument("--kernel", choices=("fresh", "lived-in", "both"), default="both")
    parser.add_argument("--steps", type=int, nargs="*", default=list(STEPS))
    parser.add_argument(
        "--width", type=int, default=512, help="of each Linear (64: a cell of 1 ms steps)"
    )
    parser.add_argument("--update", choices=("adam", "by-hand"), default="adam")
    args = parser.parse_args()
    device = torch.device("cpu")
    bench = scale.Bench(device)
    results = []
    kernels = ["fresh", "lived-in"] if args.kernel == "both" else [args.kernel]
    for kernel in kernels:
        if kernel == "lived-in":
            t0 = time.perf_counter()
            bench.shell.user_ns.update(scale.lived_in(device, quick=False, models=True))
            gc.collect()
            settling = bench.settle()
            print(
                f"lived-in kernel filled in {time.perf_counter() - t0:.1f} s, "
                f"settled in {len(settling)} tiny cells",
                flush=True,
            )
        for steps in args.steps:
            by_hand = args.update == "by-hand"
            name = f"mlp{args.width}{'_by_hand' if by_hand else ''}_{steps}_steps_cpu"
            build = (lambda d: mlp_by_hand(d, args.width)) if by_hand else (lambda d: scale.mlp(d, args.width))  # fmt: skip
            cell = scale.Cell(name, steps, build)
            result = asdict(bench.run(cell, args.rounds, kernel))
            s = result["summary"]
            print(
                f"{kernel:8} {steps:5} steps: plain {s['plain_whole_s']:.3f} s, "
                f"%%gpumem {s['gpumem_whole_s']:.3f} s, "
                f"ratio {s['gpumem_whole_s'] / s['plain_whole_s']:.2f}x "
                f"(median of ratios {1 + s['whole_overhead']:.2f}x)",
                flush=True,
            )
            results.append(result)
    out = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": platform.processor() or "cpu",
        "cpu_threads": torch.get_num_threads(),
        "width": args.width,
        "update": args.update,
        "rounds": args.rounds,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))


def mlp_by_hand(device: torch.device, width: int) -> dict[str, object]:
    """The MLP cell as plain tensors and a hand-written SGD update: no optimizer, no module."""
    torch.manual_seed(0)
    weights = [
        (torch.randn(width, width, device=device) / width**0.5).requires_grad_() for _ in range(6)
    ]
    x = torch.randn(64, width, device=device)

    def train_step() -> None:
        h = x
        for w in weights:
            h = torch.relu(h @ w)
        h.pow(2).mean().backward()
        with torch.no_grad():
            for w in weights:
                w -= 1e-3 * w.grad
                w.grad = None

    return {"weights": weights, "x": x, "train_step": train_step}


if __name__ == "__main__":
    main()
