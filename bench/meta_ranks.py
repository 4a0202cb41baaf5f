"""Will it fit on N GPUs: per-rank estimates from a meta model, beside forked ranks measured.

    python bench/meta_ranks.py OUT.json [--skip-70b | --only-70b [--device cpu]]

1. A 70B-class Llama config (80 layers, hidden 8192, 64 heads, 8 KV heads, intermediate
   28672, vocab 128256) on the meta device, FSDP2 over 64 ranks, fp32 AdamW, batch 1 x 2048:
   each rank's sharded parameters, gradients (at their most, after the backward) and optimizer
   state beside the shard arithmetic (FSDP2 cuts dim 0 as ``torch.chunk`` does; each piece one
   storage, padded to the largest piece), and the estimate's wall time. The arithmetic is the
   same on any device: ``--device cpu`` runs it where no GPU is.
2. The Llama of about 1.5B parameters (bf16 autocast, AdamW, batch 4 x 1024 per rank) with
   DDP and FSDP2 over ``--world`` ranks (2 by default): estimated from a meta model, then measured by forked ranks of
   the same model with random weights (NCCL, one GPU each, where two GPUs are present; else
   gloo, sharing one). Each rank within 2% of its own ``max_memory_allocated``.

The estimates run before any rank, in a process whose CUDA is untouched so that ranks can fork.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.meta_estimates import LLAMA_1_5B


def llama(size: str, built_on: str) -> Any:
    import torch
    import transformers

    if size == "70b":
        cfg = transformers.LlamaConfig(
            vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
            num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192,
        )  # fmt: skip
    else:
        cfg = transformers.LlamaConfig(**LLAMA_1_5B)
    cfg.attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(built_on):
        return transformers.LlamaForCausalLM(cfg)


def lm_loss(m: Any, b: Any) -> Any:
    return m(input_ids=b, labels=b).loss


def shard_arithmetic(model: Any, world: int) -> int:
    """Bytes of one rank's parameter shards: each parameter's piece of its first dimension,
    padded to ceil(rows / world) rows."""
    total = 0
    for p in model.parameters():
        rows = p.shape[0]
        rest = p.numel() // rows
        total += -(-rows // world) * rest * p.element_size()
    return total


def seventy(out: dict[str, Any], device: str = "cuda") -> None:
    import torch

    from jupyter_gpumem.techniques import Config
    from jupyter_gpumem.tuner.trial import Trial

    model = llama("70b", "meta")
    ids = torch.zeros(1, 2048, dtype=torch.long, device="meta")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    trial = Trial(model, ids, lm_loss, optimizer=opt, warmup=1, steps=1, device=device)
    t0 = time.perf_counter()
    est = trial.estimate(config=Config(parallel="fsdp2", world_size=64))
    wall = time.perf_counter() - t0
    shard = shard_arithmetic(model, 64)
    padded = shard_arithmetic(model, 64)  # every dimension here divides by 64: own = padded
    steps = 4 * len(list(model.parameters())) if device == "cpu" else 0  # AdamW's step scalars
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    out["70b"] = {
        "device": device,
        "parameters": sum(p.numel() for p in model.parameters()),
        "estimate_s": wall,
        "reason": est.reason,
        "shard_bytes": shard,
        "buffer_bytes": buffers,
        "ranks": [
            {
                "rank": r.rank,
                "peak": r.peak_bytes,
                "breakdown": r.breakdown,
                "most": r.most_bytes,
                "phase": r.phase,
                # parameters: the pieces and the buffers; gradients at their most the pieces;
                # AdamW's two states twice the pieces (and its step scalars, on the CPU)
                "parameters_equal": (r.breakdown or {}).get("parameters") == padded + buffers,
                "gradients_equal": (r.most_bytes or {}).get("gradients") == padded,
                "optimizer_equal": (r.breakdown or {}).get("optimizer_state") == 2 * padded + steps,
            }
            for r in est.ranks
        ],
        "verdict": est.verdict.line() if est.verdict else None,
    }
    r0 = est.ranks[0].breakdown or {}
    most0 = est.ranks[0].most_bytes or {}
    print(
        f"70B fsdp2 x64 on {device}: {wall:.1f} s; rank 0 parameters {r0.get('parameters')} "
        f"gradients at most {most0.get('gradients')} optimizer {r0.get('optimizer_state')}; "
        f"shard arithmetic {shard} (x2 {2 * shard}), buffers {buffers}",
        flush=True,
    )


def per_rank(out: dict[str, Any], world: int) -> None:
    import torch

    from jupyter_gpumem.techniques import Config
    from jupyter_gpumem.tuner.trial import Trial

    meta = llama("1.5b", "meta")
    meta_opt = torch.optim.AdamW(meta.parameters(), lr=1e-4)
    meta_ids = torch.zeros(4, 1024, dtype=torch.long, device="meta")
    meta_trial = Trial(
        meta, meta_ids, lm_loss, optimizer=meta_opt, warmup=2, steps=2, device="cuda"
    )
    configs = [
        Config(parallel=p, world_size=world, precision="bf16-autocast") for p in ("ddp", "fsdp2")
    ]
    estimates = {}
    for config in configs:
        t0 = time.perf_counter()
        estimates[config] = (meta_trial.estimate(config=config), time.perf_counter() - t0)
    real = llama("1.5b", "cpu")
    opt = torch.optim.AdamW(real.parameters(), lr=1e-4)
    ids = torch.randint(0, 32000, (4, 1024))
    trial = Trial(real, ids, lm_loss, optimizer=opt, warmup=2, steps=2, device="cuda")
    out["cases"] = []
    for config in configs:
        est, est_s = estimates[config]
        res = trial.run(config)
        case = {
            "config": str(config),
            "gpus": torch.cuda.device_count(),
            "estimate_s": est_s,
            "status": res.status,
            "error": res.error,
            "reason": est.reason,
            "shard_bytes": shard_arithmetic(real, world) if config.parallel == "fsdp2" else None,
            "ranks": [
                {
                    "rank": r.rank,
                    "estimated": e.peak_bytes,
                    "measured": r.peak_allocated_bytes,
                    "own_max_allocated": r.own_peak_bytes,
                    "error_pct": e.error_pct(r.own_peak_bytes),
                    "estimated_reserved": e.peak_reserved_bytes,
                    "measured_reserved": r.peak_reserved_bytes,
                    "estimated_breakdown": e.breakdown,
                    "measured_breakdown": r.breakdown,
                }
                for r, e in zip(res.ranks, est.ranks, strict=False)
            ],
        }
        out["cases"].append(case)
        print(config, res.status, res.error, flush=True)
        print(res.vs_estimate, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--skip-70b", action="store_true")
    parser.add_argument("--only-70b", action="store_true")
    parser.add_argument("--device", default="cuda", help="where the 70B estimate runs")
    parser.add_argument("--world", type=int, default=2, help="ranks of the 1.5B cases")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    try:
        if not args.skip_70b:
            seventy(out, args.device)
        if not args.only_70b:
            per_rank(out, args.world)
    finally:
        args.output.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
