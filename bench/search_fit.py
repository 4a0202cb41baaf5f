"""Make it fit: ``Trial.search`` against a brute-force grid measured for real.

    python bench/search_fit.py bench/results/search_fit_h100.json [--only gpt2-medium|vit-l16]
        [--shares 0.6 0.4 0.25] [--no-grid] [--grid-from EARLIER.json]

For each workload (GPT-2 medium, 355M, batch 8 x 1024; ViT-L/16, batch 64; fp32 AdamW) the
baseline is measured, then for each budget (a share of the baseline's measured peak) the
search runs (timed before verification: anchors estimated and measured, candidates composed,
the winner confirmed by its own estimate) and its winner is measured. The grid measures every
configuration of checkpointed blocks (none, half, all) x precision (as is, bf16 autocast) x
optimizer (AdamW, fused AdamW) x micro-batches (1, 2, 4): 36 configurations, each run once and
shared by the budgets; the fastest fitting one is the mark the winner's step time is held to
(within 10%). Step times of one configuration vary by about 10% from run to run, so after the
search the winner and the grid's three fastest fitting configurations are measured again in turn,
five rounds, each round starting one further on (``paired``): the winner's median against the fastest of theirs is the comparison
(``winner_vs_fastest_paired_pct``). ``--grid-from`` takes the grids of earlier runs of the same
workload (merged) instead of measuring them again; ``--grid-part K/N`` measures one N-th of the
grid, so that N GPUs share it. Each budget may run in its own process, one GPU each
(``CUDA_VISIBLE_DEVICES``); ``--shares`` with no value measures the baseline and the grid alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORKLOADS = ("gpt2-medium", "vit-l16")
ROUNDS = 5  # the winner and the grid's fastest fitting configurations, measured in turn
CONTENDERS = 3  # the grid's fastest fitting configurations measured again beside the winner


def build(name: str) -> Any:
    import torch

    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    if name == "vit-l16":
        import torchvision

        model = torchvision.models.vit_l_16().cuda()
        batch = (
            torch.randn(64, 3, 224, 224, device="cuda"),
            torch.randint(0, 1000, (64,), device="cuda"),
        )

        def vit_loss(m: Any, b: Any) -> Any:
            return torch.nn.functional.cross_entropy(m(b[0]), b[1])

        loss = vit_loss
    else:
        import transformers

        cfg = transformers.GPT2Config(n_layer=24, n_embd=1024, n_head=16)
        model = transformers.GPT2LMHeadModel(cfg).cuda()
        batch = torch.randint(0, 50257, (8, 1024), device="cuda")

        def lm_loss(m: Any, b: Any) -> Any:
            return m(input_ids=b, labels=b).loss

        loss = lm_loss
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return Trial(model, batch, loss, optimizer=opt, warmup=1, steps=3)


def grid(trial: Any) -> list[Any]:
    from jupyter_gpumem.techniques import Config, blocks

    names = tuple(blocks(trial.model))
    halves = (None, names[: len(names) // 2], names)
    return [
        Config(checkpoint=k or None, precision=p, optimizer=o, accumulate=a)
        for k, p, o, a in itertools.product(
            halves, (None, "bf16-autocast"), (None, "adamw-fused"), (1, 2, 4)
        )
    ]


def one(
    name: str,
    shares: list[float],
    with_grid: bool,
    save: Any,
    earlier: dict[str, Any] | None,
    grid_part: tuple[int, int] = (0, 1),
) -> dict[str, Any]:
    import torch

    from jupyter_gpumem.techniques import Config

    trial = build(name)
    base = trial.run(Config())
    peak = base.peak_allocated_bytes
    measured: dict[str, dict[str, Any]] = {}
    budgets: list[dict[str, Any]] = []
    result = {
        "workload": name, "baseline_peak": peak, "baseline_step_s": base.step_s,
        "grid": measured, "budgets": budgets, "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }  # fmt: skip
    if earlier is not None:
        measured.update(earlier["grid"])
        result["grid_from"] = "an earlier run"
    elif with_grid:
        part, parts = grid_part
        for config in grid(trial)[part::parts]:
            r = trial.run(config)
            measured[str(config)] = {
                "peak": r.peak_allocated_bytes,
                "step_s": r.step_s,
                "status": r.status,
            }
            print(json.dumps({"grid": str(config), **measured[str(config)]}), flush=True)
            save(result)  # a run cut short keeps the configurations done
    for share in shares:
        budget = int(share * peak)
        t0 = time.perf_counter()
        found = trial.search(budget)
        search_s = time.perf_counter() - t0
        row: dict[str, Any] = {
            "share": share, "budget": budget, "search_s": search_s, "candidates": found.candidates,
            "anchors": found.anchors, "winner": str(found.config) if found.config else None,
            "reasoning": list(found.reasoning),
        }  # fmt: skip
        if found.config is not None:
            r = found.verify()
            row.update(
                estimated=found.estimate.peak_bytes if found.estimate else None,
                predicted_step_s=found.predicted_step_s,
                measured_peak=r.peak_allocated_bytes, measured_step_s=r.step_s,
                estimated_reserved=found.estimate.peak_reserved_bytes if found.estimate else None,
                measured_reserved=r.peak_reserved_bytes,
                fits_measured=r.status == "ok" and (r.peak_allocated_bytes or 0) <= budget,
                optimizer_kept=found.config.optimizer in (None, "adamw-fused", "adamw-8bit"),
            )  # fmt: skip
        fitting = [
            (v["step_s"], k) for k, v in measured.items()
            if v["status"] == "ok" and v["peak"] is not None and v["peak"] <= budget and v["step_s"]
        ]  # fmt: skip
        if fitting:
            fastest = min(fitting)
            row["grid_fastest"] = {"config": fastest[1], "step_s": fastest[0]}
            if row.get("measured_step_s") and found.config is not None:
                row["winner_vs_fastest_pct"] = 100 * (row["measured_step_s"] / fastest[0] - 1)
                by_label = {str(c): c for c in grid(trial)}
                others = [k for _, k in sorted(fitting) if k != str(found.config)]
                contenders = [by_label[k] for k in others[:CONTENDERS]]
                row["paired"] = paired(trial, found.config, contenders)
                print(json.dumps({"paired": row["paired"]}), flush=True)
        print(json.dumps({k: v for k, v in row.items() if k != "reasoning"}), flush=True)
        budgets.append(row)
        save(result)  # a run cut short keeps the budgets done
    return result


def paired(trial: Any, winner: Any, contenders: list[Any]) -> dict[str, Any]:
    """The winner and the contenders measured in turn, ``ROUNDS`` times: medians compared."""
    import statistics

    times: dict[str, list[float]] = {str(c): [] for c in [winner, *contenders]}
    order = [winner, *contenders]
    for r in range(ROUNDS):  # each round starts one further on: no one always goes first
        for config in order[r % len(order) :] + order[: r % len(order)]:
            r = trial.run(config)
            if r.status == "ok" and r.step_s:
                times[str(config)].append(r.step_s)
    medians = {k: statistics.median(v) for k, v in times.items() if v}
    others = {k: v for k, v in medians.items() if k != str(winner)}
    out: dict[str, Any] = {"rounds": ROUNDS, "step_s": times, "median_s": medians}
    if str(winner) in medians and others:
        best = min(others, key=others.__getitem__)
        out["fastest_contender"] = best
        out["winner_vs_fastest_paired_pct"] = 100 * (medians[str(winner)] / others[best] - 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--only", choices=WORKLOADS, action="append")
    parser.add_argument("--shares", type=float, nargs="*", default=[0.6, 0.4, 0.25])
    parser.add_argument("--no-grid", action="store_true", help="the search alone (its time)")
    parser.add_argument(
        "--grid-from", type=Path, nargs="+", help="earlier results whose grids to reuse (merged)"
    )
    parser.add_argument(
        "--grid-part",
        default="0/1",
        help="K/N: measure every N-th grid configuration from the K-th",
    )
    args = parser.parse_args()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []

    def save(current: dict[str, Any]) -> None:
        workloads = [*results, current]
        args.output.write_text(
            json.dumps({"machine": platform.node(), "workloads": workloads}, indent=1)
        )

    earlier: dict[str, dict[str, Any]] = {}
    for path in args.grid_from or ():
        for w in json.loads(path.read_text())["workloads"]:
            merged = earlier.setdefault(w["workload"], {**w, "grid": {}})
            merged["grid"].update(w["grid"])
    part, parts = (int(n) for n in args.grid_part.split("/"))
    for name in args.only or WORKLOADS:
        results.append(
            one(name, args.shares, not args.no_grid, save, earlier.get(name), (part, parts))
        )


if __name__ == "__main__":
    main()
