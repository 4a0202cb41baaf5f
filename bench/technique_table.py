"""Each technique alone on GPT-2 medium: estimated beside measured, and its change against the baseline.

    python bench/technique_table.py bench/results/techniques_gpt2_medium_h100.json [--only NAME ...]
    python bench/technique_table.py OUT.json --inference

GPT-2 medium (355M, batch 8 x 1024, fp32 AdamW, random weights) on the GPU present; with
``--inference``, an inference trial of its forward (the logits) instead. For each
configuration: the estimate's peak (fake tensors, no GPU memory), the peak and reserved bytes
``Trial.run`` measures, the error, the step time, and the peak and step-time change against the
measured baseline. A configuration whose estimate gives a reason instead of a figure keeps the
reason, and the estimate's notes are kept (the paged optimizer's say how much of its state pages
outside the allocator). The file is rewritten after each row, so a run cut short keeps what it
measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "accumulate 2": {"accumulate": 2},
    "accumulate 4": {"accumulate": 4},
    "offload blocks": {"offload": "blocks"},
    "offload model": {"offload": "model"},
    "lora r16": {"lora": 16},
    "adamw-8bit": {"optimizer": "adamw-8bit"},
    "adamw-paged-8bit": {"optimizer": "adamw-paged-8bit"},
    "fsdp2 x 1": {"parallel": "fsdp2", "world_size": 1},
    "state on cpu (fsdp2 x 1)": {"parallel": "fsdp2", "world_size": 1, "cpu_offload": True},
}
INFERENCE: dict[str, dict[str, Any]] = {
    "baseline": {},
    "inference mode": {"inference_mode": True},
    "inference mode, bf16-autocast": {"inference_mode": True, "precision": "bf16-autocast"},
}


def build(inference: bool) -> Any:
    import torch
    import transformers

    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=24, n_embd=1024, n_head=16)
    model = transformers.GPT2LMHeadModel(cfg).cuda()
    batch = torch.randint(0, cfg.vocab_size, (8, 1024), device="cuda")

    def lm_loss(m: Any, b: Any) -> Any:
        return m(input_ids=b, labels=b).loss

    if inference:
        return Trial(model, batch, lambda m, b: m(input_ids=b).logits, inference=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return Trial(model, batch, lm_loss, optimizer=opt, warmup=2, steps=5)


def row(trial: Any, name: str, settings: dict[str, Any]) -> dict[str, Any]:
    from jupyter_gpumem.techniques import Config

    t0 = time.perf_counter()
    try:
        est = trial.estimate(**settings)
        estimated, reason, notes = est.peak_bytes, est.reason, list(est.notes)
    except Exception as exc:  # an optional package missing: say so in the row
        estimated, reason, notes = None, f"{type(exc).__name__}: {exc}", []
    estimate_s = time.perf_counter() - t0
    result = trial.run(Config(**settings))
    measured = result.peak_allocated_bytes
    error = None
    if estimated is not None and measured:
        error = 100 * (estimated - measured) / measured
    return {
        "configuration": name, "settings": settings, "estimated_bytes": estimated,
        "reason": reason, "notes": notes, "estimate_s": estimate_s, "measured_bytes": measured,
        "measured_reserved_bytes": result.peak_reserved_bytes, "error_pct": error,
        "step_s": result.step_s, "status": result.status,
        "breakdown": result.breakdown, "error": result.error,
        "estimated_breakdown": None if estimated is None else est.breakdown,
        "estimated_reserved_bytes": None if estimated is None else est.peak_reserved_bytes,
    }  # fmt: skip


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--only", choices=(*CONFIGS, *INFERENCE), action="append")
    parser.add_argument("--inference", action="store_true", help="an inference trial")
    args = parser.parse_args()
    trial = build(args.inference)
    configs = INFERENCE if args.inference else CONFIGS
    names = ["baseline", *(n for n in args.only or configs if n != "baseline")]
    rows: list[dict[str, Any]] = []
    found = {
        "machine": platform.node(), "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "workload": "GPT-2 medium, batch 8 x 1024, "
        + ("forward passes (inference trial)" if args.inference else "fp32 AdamW"),
        "rows": rows,
    }  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        rows.append(row(trial, name, configs[name]))
        base = rows[0]
        if base["measured_bytes"] and rows[-1]["measured_bytes"]:
            rows[-1]["peak_change_pct"] = 100 * (
                rows[-1]["measured_bytes"] / base["measured_bytes"] - 1
            )
        if base["step_s"] and rows[-1]["step_s"]:
            rows[-1]["step_change_pct"] = 100 * (rows[-1]["step_s"] / base["step_s"] - 1)
        print(json.dumps(rows[-1], default=str), flush=True)
        args.output.write_text(json.dumps(found, indent=1, default=str))


if __name__ == "__main__":
    main()
