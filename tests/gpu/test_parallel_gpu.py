"""Will it fit on N GPUs: per-rank estimates against forked ranks on the GPU (issue 23).

GPT-2 124M and a torchvision ViT-B/16, for ``ddp`` and ``fsdp2``, ``world_size`` 2 and 4. With
fewer GPUs than ranks the ranks share the GPUs over gloo; with enough, each has its own over
NCCL. Each rank's estimate (made in one process, on fake tensors, before any rank ran) must be
within 5% of its measured peak, and each rank's measured peak must equal its own
``torch.cuda.max_memory_allocated()`` over the measured steps.

One fresh interpreter builds the models on the CPU, so that CUDA stays untouched in it and the
ranks can be forked; the figures go to ``$GPUMEM_OUT/parallel_gpu.json`` when it is set.
``GPUMEM_WORLD_SIZES`` (default ``2,4``) picks the world sizes: ``2`` on a two-GPU machine
runs the NCCL case alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

TOLERANCE_PCT = 5.0
WORLD_SIZES = tuple(int(w) for w in os.environ.get("GPUMEM_WORLD_SIZES", "2,4").split(","))
SCRIPT = textwrap.dedent(
    """
    import json, sys, time, multiprocessing, os
    import torch, torch.nn as nn
    from jupyter_gpumem.techniques import Config
    from jupyter_gpumem.tuner.trial import Trial

    def gpt2():
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config())
        ids = torch.randint(0, 50257, (4, 512))
        return model, ids, lambda m, b: m(input_ids=b, labels=b).loss

    def vit():
        from torchvision.models import vit_b_16
        torch.manual_seed(0)
        model = vit_b_16()
        batch = (torch.randn(16, 3, 224, 224), torch.randint(0, 1000, (16,)))
        return model, batch, lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])

    def outside(r):  # NVML's figure for the rank and what it holds beyond reserved, its own GPU
        cuda = [d for d in (r.report.devices if r.report else ()) if d.device.startswith("cuda")]
        own = max(cuda, key=lambda d: d.peak_allocated_bytes, default=None)
        return None if own is None else [own.nvml_process_bytes, own.non_torch_bytes]

    worlds = tuple(int(w) for w in sys.argv[1].split(","))
    out = {"gpus": torch.cuda.device_count(), "cases": []}
    for name, build in (("gpt2", gpt2), ("vit_b_16", vit)):
        model, batch, loss = build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        trial = Trial(model, batch, loss, optimizer=opt, warmup=2, steps=2, device="cuda")
        for world in worlds:
            for parallel in ("ddp", "fsdp2"):
                config = Config(parallel=parallel, world_size=world)
                t0 = time.perf_counter()
                est = trial.estimate(config=config)
                est_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                res = trial.run(config)
                run_s = time.perf_counter() - t0
                case = {
                    "model": name, "parallel": parallel, "world_size": world,
                    "estimate_s": est_s, "run_s": run_s, "status": res.status,
                    "error": res.error, "notes": list(res.warnings), "reason": est.reason,
                    "ranks": [
                        {
                            "rank": r.rank,
                            "estimated": e.peak_bytes,
                            "measured": r.peak_allocated_bytes,
                            "own_max_allocated": r.own_peak_bytes,
                            "error_pct": e.error_pct(r.peak_allocated_bytes),
                            "estimated_breakdown": e.breakdown,
                            "measured_breakdown": r.breakdown,
                            "report_notes": list(r.report.notes) if r.report else None,
                            "outside": outside(r),
                            "estimated_outside": (e.context_bytes or 0)
                            + (e.verdict.communication_bytes if e.verdict else 0),
                            "verdict_needed": e.verdict.needed_bytes if e.verdict else None,
                        }
                        for r, e in zip(res.ranks, est.ranks)
                    ],
                }
                print(name, parallel, world, res.status, res.error, flush=True)
                print(res.vs_estimate, flush=True)
                out["cases"].append(case)
        del model, opt, trial
    out["kernel_cuda_initialized"] = torch.cuda.is_initialized()

    def touch(q):
        q.put(float(torch.ones(4, device="cuda").sum()))

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=touch, args=(q,))
    p.start(); p.join(120)
    out["plain_fork_after"] = p.exitcode == 0 and q.get(timeout=5) == 4.0
    print("RESULT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    pytest.importorskip("transformers")
    pytest.importorskip("torchvision")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(map(str, WORLD_SIZES))],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    print(done.stdout)
    line = next(li for li in done.stdout.splitlines() if li.startswith("RESULT "))
    out: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    target = os.environ.get("GPUMEM_OUT")
    if target:
        Path(target, "parallel_gpu.json").write_text(json.dumps(out, indent=1))
    return out


def test_every_rank_ran_and_was_estimated(figures: dict[str, Any]) -> None:
    assert len(figures["cases"]) == 2 * 2 * len(WORLD_SIZES)  # two models, two strategies
    for case in figures["cases"]:
        assert case["status"] == "ok", case["error"]
        assert case["reason"] is None
        assert [r["rank"] for r in case["ranks"]] == list(range(case["world_size"]))


def test_each_rank_estimate_is_within_5_percent(figures: dict[str, Any]) -> None:
    for case in figures["cases"]:
        for rank in case["ranks"]:
            label = f"{case['model']} {case['parallel']} x{case['world_size']} rank {rank['rank']}"
            assert abs(rank["error_pct"]) <= TOLERANCE_PCT, (label, rank)


def test_each_rank_peak_is_its_own_max_memory_allocated(figures: dict[str, Any]) -> None:
    for case in figures["cases"]:
        for rank in case["ranks"]:
            assert rank["measured"] == rank["own_max_allocated"], (case["model"], rank)


# Ranks sharing a GPU over gloo: gloo's worker threads stage FSDP2's CUDA tensors while the
# rank's window starts, so its layout read can disagree with its counters. The peak stays
# exact (the counters); the breakdown is left out, and the report says why.
RACED = "trace replay stopped: start layout holds"


def test_breakdowns_sum_to_the_peak_or_say_why_they_are_missing(figures: dict[str, Any]) -> None:
    shared = figures["gpus"] == 1
    for case in figures["cases"]:
        broken_down = 0
        for rank in case["ranks"]:
            measured = rank["measured_breakdown"]
            if measured is None:
                label = (case["model"], case["parallel"], case["world_size"], rank["rank"])
                assert shared and case["parallel"] == "fsdp2", (label, rank["report_notes"])
                assert any(RACED in note for note in rank["report_notes"]), (label, rank)
                continue
            broken_down += 1
            assert sum(measured.values()) == rank["measured"], (case["model"], rank)
        assert broken_down > 0, case


def test_shards_and_buckets_land_in_their_categories(figures: dict[str, Any]) -> None:
    for case in figures["cases"]:
        for rank in case["ranks"]:
            est, measured = rank["estimated_breakdown"], rank["measured_breakdown"]
            assert est["communication"] > 0, case  # FSDP2's gathers, DDP's buckets
            if case["parallel"] == "fsdp2" and measured is not None:
                # each rank holds its padded shard of the parameters, and no unsharded copy
                assert est["parameters"] == measured["parameters"], (case["model"], est, measured)
                assert measured["unattributed"] <= 0.02 * rank["measured"], (case, measured)


OUTSIDE_PCT = 5.0


def test_over_nccl_the_verdict_counts_what_each_rank_holds_outside_the_allocator(
    figures: dict[str, Any],
) -> None:
    """Each rank's CUDA context and NCCL's buffers (NVML's figure less reserved) are in its
    verdict, their sum within 5% of what the rank held outside the allocator."""
    over_nccl = [c for c in figures["cases"] if figures["gpus"] >= c["world_size"]]
    if not over_nccl:
        pytest.skip("fewer GPUs than ranks: the ranks share them over gloo, with no NCCL")
    for case in over_nccl:
        for rank in case["ranks"]:
            label = (case["model"], case["parallel"], case["world_size"], rank["rank"])
            nvml, outside = rank["outside"]
            assert outside > 0 and nvml > outside, label
            gap = 100 * (rank["estimated_outside"] / outside - 1)
            assert abs(gap) <= OUTSIDE_PCT, (label, rank["estimated_outside"], outside)
            assert rank["verdict_needed"] > rank["estimated"] + rank["estimated_outside"], label


def test_the_kernel_stays_free_to_fork(figures: dict[str, Any]) -> None:
    assert figures["kernel_cuda_initialized"] is False
    assert figures["plain_fork_after"] is True
