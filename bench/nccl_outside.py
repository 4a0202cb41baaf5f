"""What each rank holds outside PyTorch's allocator over NCCL, beside the estimate's verdict.

    python bench/nccl_outside.py OUT.json [--world 2 4]

GPT-2 124M (batch 4 x 512, fp32 AdamW) under DDP and FSDP2 on N ranks, one GPU each over NCCL:
``Trial.estimate`` gives each rank's verdict (reserved peak, CUDA context, NCCL's buffers, margin)
and ``Trial.run`` measures each rank: peak allocated and reserved, NVML's figure for the rank's
process, and what it holds beyond PyTorch's reserved bytes (CUDA context and NCCL). The CUDA
context alone is the estimate's, measured in a fresh process; NCCL's share is the rest.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--world", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from jupyter_gpumem.techniques import Config
    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())  # on the CPU: the kernel forks its ranks
    ids = torch.randint(0, 50257, (4, 512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def loss(m: Any, b: Any) -> Any:
        return m(input_ids=b, labels=b).loss

    trial = Trial(model, ids, loss, optimizer=opt, warmup=2, steps=2, device="cuda")
    cases = []
    for world in args.world:
        for parallel in ("ddp", "fsdp2"):
            config = Config(parallel=parallel, world_size=world)
            est = trial.estimate(config=config)
            res = trial.run(config)
            ranks = []
            for r, e in zip(res.ranks, est.ranks, strict=False):
                own = max(
                    (
                        d
                        for d in (r.report.devices if r.report else ())
                        if d.device.startswith("cuda")
                    ),
                    key=lambda d: d.peak_allocated_bytes,
                    default=None,
                )
                v = e.verdict
                ranks.append(
                    {
                        "rank": r.rank,
                        "estimated_peak": e.peak_bytes,
                        "estimated_reserved": e.peak_reserved_bytes,
                        "estimated_context": e.context_bytes,
                        "verdict_nccl": None if v is None else v.communication_bytes,
                        "verdict_needed": None if v is None else v.needed_bytes,
                        "verdict_line": None if v is None else v.line(),
                        "measured_peak": r.peak_allocated_bytes,
                        "measured_reserved": None if own is None else own.peak_reserved_bytes,
                        "nvml_process": None if own is None else own.nvml_process_bytes,
                        "outside_allocator": None if own is None else own.non_torch_bytes,
                        "device": None if own is None else own.device,
                    }
                )
            case = {"parallel": parallel, "world_size": world, "status": res.status,
                    "error": res.error, "ranks": ranks}  # fmt: skip
            print(json.dumps(case), flush=True)
            cases.append(case)
    out = {
        "machine": platform.node(), "gpus": torch.cuda.device_count(),
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())), "cases": cases,
    }  # fmt: skip
    args.output.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
