"""Will it fit on a card you do not have? Verdicts made without CUDA, beside an H100's measurement.

    python bench/laptop_verdicts.py bench/results/laptop_verdicts.json

The Llama-3-8B LoRA of ``bench/meta_estimates.py`` (bf16 weights, PEFT LoRA r=16 on the
attention projections, batch 1 x 2048, AdamW), built on the meta device and estimated from a
trial on ``device="cpu"`` for each card by name: what a laptop with the CPU build of torch
answers. The H100's row stands beside what the same configuration measured on an H100
(``bench/results/meta_estimates_h100.json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import meta_estimates

CARDS = ("RTX-4090", "A100-40GB", "H100-80GB")
MEASURED = Path(__file__).resolve().parent / "results" / "meta_estimates_h100.json"
CASE = "llama3-8b-lora"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output", type=Path)
    args = parser.parse_args()
    import torch
    import transformers

    from jupyter_gpumem.tuner.trial import Trial

    transformers.logging.set_verbosity_error()
    model, opt, ids, loss, config = meta_estimates.build(CASE, "meta")
    trial = Trial(model, ids, loss, optimizer=opt, device="cpu")
    measured = {r["case"]: r for r in json.loads(MEASURED.read_text())["cases"]}.get(CASE, {})
    rows = []
    for card in CARDS:
        t0 = time.perf_counter()
        found = trial.estimate(gpu=card, config=config)
        rows.append(
            {
                "card": card,
                "estimated_allocated": found.peak_bytes,
                "estimated_reserved": found.peak_reserved_bytes,
                "verdict": found.verdict.line() if found.verdict else found.reason,
                "notes": list(found.notes),
                "estimate_s": time.perf_counter() - t0,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    results = {
        "case": CASE,
        "machine": platform.machine(),
        "torch": torch.__version__,
        "cuda_built": torch.backends.cuda.is_built(),
        "transformers": transformers.__version__,
        "h100_measured_allocated": measured.get("measured_allocated"),
        "h100_measured_reserved": measured.get("measured_reserved"),
        "rows": rows,
    }
    args.output.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
