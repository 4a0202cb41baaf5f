"""How long the search takes before verification: GPT-2 medium and ViT-L/16 from the meta device.

    python bench/search_speed.py bench/results/search_speed_cpu.json [--device cpu|cuda]

Each model is built on the meta device with fp32 AdamW (GPT-2 medium, 355M, batch 8 x 1024;
ViT-L/16, batch 64); ``Trial.search`` at 40% of its estimated baseline composes every candidate
from its anchors and confirms the winner by its own estimate. Nothing runs for real (the model
holds no weights), so this is the search alone: the target is at least 500 candidates in under
60 s.
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


def trial_of(name: str, device: str) -> Any:
    import torch

    from jupyter_gpumem.tuner.trial import Trial

    with torch.device("meta"):
        if name == "vit-l16":
            import torchvision

            model = torchvision.models.vit_l_16()
            batch = (torch.randn(64, 3, 224, 224), torch.randint(0, 1000, (64,)))

            def loss(m: Any, b: Any) -> Any:
                return torch.nn.functional.cross_entropy(m(b[0]), b[1])
        else:
            import transformers

            model = transformers.GPT2LMHeadModel(
                transformers.GPT2Config(n_layer=24, n_embd=1024, n_head=16)
            )
            batch = torch.randint(0, 50257, (8, 1024))

            def loss(m: Any, b: Any) -> Any:
                return m(input_ids=b, labels=b).loss

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return Trial(model, batch, loss, optimizer=opt, warmup=1, steps=1, device=device)


def one(name: str, device: str) -> dict[str, Any]:
    trial = trial_of(name, device)
    base = trial.estimate()
    assert base.peak_bytes is not None, base.reason
    t0 = time.perf_counter()
    found = trial.search(int(0.4 * base.peak_bytes))
    wall = time.perf_counter() - t0
    return {
        "workload": name, "device": device, "baseline_estimate": base.peak_bytes,
        "search_s": wall, "candidates": found.candidates, "anchors": found.anchors,
        "confirmed": len(found.confirmed), "winner": str(found.config) if found.config else None,
        "winner_estimate": found.estimate.peak_bytes if found.estimate else None,
        "reasoning": list(found.reasoning),
    }  # fmt: skip


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", choices=("gpt2-medium", "vit-l16"), action="append")
    args = parser.parse_args()
    results = []
    for name in args.only or ("gpt2-medium", "vit-l16"):
        r = one(name, args.device)
        print(json.dumps({k: v for k, v in r.items() if k != "reasoning"}), flush=True)
        results.append(r)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    info = {
        "machine": platform.node(),
        "cpus": __import__("os").cpu_count(),
        "torch": torch.__version__,
    }
    args.output.write_text(json.dumps({**info, "workloads": results}, indent=1))


if __name__ == "__main__":
    main()
