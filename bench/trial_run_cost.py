"""What one ``Trial.run`` costs the user on the CPU: whole-run wall time, reported step time, host memory.

    python bench/trial_run_cost.py bench/results/trial_run_cost_cpu.json [--label NAME]

Workloads: a small host-bound MLP (width 256, batch 64) and a tiny GPT (4 layers, d 128, 256
tokens x 8), each with ``steps=3`` and a long run of ``steps=20`` (one warm-up step). Each runs
in a fresh kernel-like process and in a lived-in one (three extra models, 2,000 live tensors
and two million small Python objects alive). Every figure is the median of three runs after one
discarded run; host memory is the process's peak resident set, before and after. Run it on two
checkouts (``PYTHONPATH``) to compare them; ``--label`` names the checkout in the results.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def child(workload: str, steps: int, lived_in: bool) -> dict[str, Any]:
    import torch
    from torch import nn

    from jupyter_gpumem.techniques import Config
    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    torch.set_num_threads(1)
    kept: list[Any] = []
    if lived_in:
        kept += [nn.Linear(512, 512) for _ in range(3)]
        kept += [torch.randn(64) for _ in range(2000)]
        kept.append([{"i": i} for i in range(2_000_000)])
    if workload == "mlp":
        model: nn.Module = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        batch: Any = torch.randn(64, 256)

        def loss(m: nn.Module, b: Any) -> Any:
            return m(b).square().mean()
    else:
        layer = nn.TransformerEncoderLayer(128, 4, 512, batch_first=True)
        model = nn.Sequential(nn.Embedding(1000, 128), nn.TransformerEncoder(layer, 4))
        batch = torch.randint(0, 1000, (8, 256))

        def loss(m: nn.Module, b: Any) -> Any:
            return m(b).square().mean()

    opt = torch.optim.AdamW(model.parameters())
    trial = Trial(model, batch, loss, optimizer=opt, warmup=1, steps=steps)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    walls, step_s = [], []
    for i in range(4):
        t0 = time.perf_counter()
        r = trial.run(Config())
        if i:
            walls.append(time.perf_counter() - t0)
            step_s.append(r.step_s)
    return {
        "workload": workload, "steps": steps, "kernel": "lived-in" if lived_in else "fresh",
        "run_wall_s": statistics.median(walls), "step_s": statistics.median(step_s),
        "peak_rss_before": rss_before,
        "peak_rss_after": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--label", default="working tree")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        workload, steps, lived_in = args.child
        print(json.dumps(child(workload, int(steps), lived_in == "1")))
        return
    rows = []
    for workload in ("mlp", "gpt"):
        for steps in (3, 20):
            for lived_in in ("0", "1"):
                out = subprocess.run(
                    [sys.executable, __file__, str(args.output), "--child", workload, str(steps), lived_in],
                    check=True, capture_output=True, text=True,
                ).stdout  # fmt: skip
                rows.append(json.loads(out.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
    results = json.loads(args.output.read_text()) if args.output.exists() else {"runs": {}}
    results["machine"] = f"{platform.node()}, {platform.processor() or platform.machine()}"
    results["runs"][args.label] = rows
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
