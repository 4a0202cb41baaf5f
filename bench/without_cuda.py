"""The model zoo estimated without CUDA, beside what the same cases measured on a GPU.

    python bench/without_cuda.py bench/results/without_cuda_h200.json [--only CASE ...]
    python bench/without_cuda.py --table bench/results/without_cuda_h200.json

Each training and inference case of :mod:`zoo` is built on the meta device and estimated for
``gpu="H200"`` from a trial on ``device="cpu"``: on a torch without CUDA, the path a laptop takes
(:mod:`jupyter_gpumem.tuner.estimation.without_cuda`). The measured figures and the estimate the
GPU machine made are those of ``bench/results/model_zoo_h200.json`` (an H200, written by
``bench/model_zoo.py``). Targets: allocated within 2% and reserved within 5% of the measured;
within 0.5% of the GPU machine's own estimate.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import model_zoo
import zoo

MEASURED = Path(__file__).resolve().parent / "results" / "model_zoo_h200.json"
GPU = "H200"


def one(case: zoo.Case, measured: dict[str, Any]) -> dict[str, Any]:
    """The case estimated here for the H200, beside its measured row."""
    built = case.build("meta", "bench")
    trial = model_zoo.trial_of(case, built, "cpu")
    t0 = time.perf_counter()
    found = trial.estimate(gpu=GPU, config=model_zoo.config_of(case))
    row: dict[str, Any] = {"case": case.name, "estimate_s": time.perf_counter() - t0}
    row.update(estimated_allocated=found.peak_bytes, estimated_reserved=found.peak_reserved_bytes)
    row.update(reason=found.reason, notes=list(found.notes))
    for key in ("measured_allocated", "measured_reserved", "estimated_allocated"):
        row[("gpu_" if key.startswith("estimated") else "") + key] = measured.get(key)
    if found.peak_bytes is not None and measured.get("measured_allocated"):
        row["error_allocated_pct"] = 100 * (found.peak_bytes / measured["measured_allocated"] - 1)
        row["error_reserved_pct"] = 100 * (
            found.peak_reserved_bytes / measured["measured_reserved"] - 1
        )
        if measured.get("estimated_allocated"):
            row["vs_gpu_estimate_pct"] = 100 * (
                found.peak_bytes / measured["estimated_allocated"] - 1
            )
    return row


def table(results: dict[str, Any]) -> str:
    """The README's table: per row, the estimate made here beside the H200's figures."""
    lines = [
        "| case | estimated here alloc. / res. (GB) | measured on the H200 (GB) "
        "| error alloc. / res. | vs the H200's own estimate | time |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["cases"]:
        if r["estimated_allocated"] is None:
            lines.append(f"| {r['case']} | refused: {r['reason'][:120]} | | | | |")
            continue
        gb = lambda n: f"{n / 1e9:.3f}"  # noqa: E731
        lines.append(
            f"| {r['case']} | {gb(r['estimated_allocated'])} / {gb(r['estimated_reserved'])} "
            f"| {gb(r['measured_allocated'])} / {gb(r['measured_reserved'])} "
            f"| {r['error_allocated_pct']:+.2f}% / {r['error_reserved_pct']:+.2f}% "
            f"| {r.get('vs_gpu_estimate_pct', 0):+.3f}% | {r['estimate_s']:.1f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output", type=Path)
    parser.add_argument("--only", action="append")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.output.read_text())))
        return
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    measured = {r["case"]: r for r in json.loads(MEASURED.read_text())["cases"]}
    cases = [c for c in zoo.CASES if c.workload != "generate" and c.name in measured]
    cases = [c for c in cases if not args.only or c.name in args.only]
    results: dict[str, Any] = {
        "machine": platform.machine(),
        "torch": torch.__version__,
        "cuda_built": torch.backends.cuda.is_built(),
        "transformers": transformers.__version__,
        "measured_on": str(MEASURED.name),
        "cases": [],
    }
    for case in cases:
        why = zoo.available(case)
        if why:
            print(f"{case.name}: skipped ({why})", flush=True)
            continue
        row = one(case, measured[case.name])
        results["cases"].append(row)
        args.output.write_text(json.dumps(results, indent=1) + "\n")
        print(json.dumps({k: row.get(k) for k in ("case", "error_allocated_pct",
              "error_reserved_pct", "vs_gpu_estimate_pct", "estimate_s")}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
