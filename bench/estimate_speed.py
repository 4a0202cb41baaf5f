"""How long one estimate takes, with repeated blocks replayed and with every block traced.

    python bench/estimate_speed.py [bench/results/estimate_speed_cpu.json] [--device=cuda] [--only=NAME,...]

Models from transformers' configs on the meta device (nothing materialised), estimated with
``device="cpu"`` (or the device named: ``cuda`` on a GPU machine) in this process: once as a
first estimate (``first_s``: what the case pays once, imports, CUDA and the probe process
included), then each way in turn (block_replay.ENABLED), several times; the median is kept. The figures of the two ways (peak, reserved, breakdown, phase, most held)
must be the same: ``equal`` says whether they are.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPEATS = 2
FIELDS = ("peak_bytes", "peak_reserved_bytes", "breakdown", "phase", "most_bytes")
# (name, transformers config class, its arguments, batch (n, tokens), settings, LoRA)
CASES: tuple[tuple[str, str, dict[str, Any], tuple[int, int], dict[str, Any], bool], ...] = (
    ("gpt2-24-layers-fp32", "GPT2Config",
     dict(n_layer=24, n_embd=1024, n_head=16, n_positions=1024), (4, 512), {}, False),
    ("llama-1.5b-28-layers-bf16-autocast", "LlamaConfig",
     dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
          num_key_value_heads=2, vocab_size=151936), (4, 1024),
     {"precision": "bf16-autocast"}, False),
    ("gpt2-24-layers-fp32-checkpointed", "GPT2Config",
     dict(n_layer=24, n_embd=1024, n_head=16, n_positions=1024), (4, 512),
     {"checkpoint": "blocks"}, False),
    ("llama-1.5b-28-layers-bf16-autocast-checkpointed", "LlamaConfig",
     dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
          num_key_value_heads=2, vocab_size=151936), (4, 1024),
     {"precision": "bf16-autocast", "checkpoint": "blocks"}, False),
    ("llama-7b-32-layers-lora-bf16", "LlamaConfig",
     dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
          num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
          torch_dtype="bfloat16"), (1, 2048), {}, True),
)  # fmt: skip


def _trial(
    config_name: str, dims: dict[str, Any], batch: tuple[int, int], lora: bool, device: str
) -> Any:
    import torch
    import transformers

    from jupyter_gpumem.tuner.trial import Trial

    config = getattr(transformers, config_name)(**dims)
    config._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if lora else torch.float32
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    if lora:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules="all-linear"))
    ids = torch.randint(0, 1000, batch, device="meta")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    return Trial(
        model, ids, lambda m, b: m(input_ids=b, labels=b).loss, optimizer=opt,
        warmup=1, steps=1, device=device,
    )  # fmt: skip


def one(case: tuple[Any, ...], device: str) -> dict[str, Any]:
    from jupyter_gpumem.tuner.estimation import block_replay

    name, config_name, dims, batch, settings, lora = case
    if lora:
        import importlib.util

        if importlib.util.find_spec("peft") is None:
            return {"case": name, "skipped": "needs peft"}
    trial = _trial(config_name, dims, batch, lora, device)
    row: dict[str, Any] = {"case": name, "settings": settings, "batch": list(batch)}
    t0 = time.perf_counter()  # the first estimate of a case: imports, CUDA, the probe process
    trial.estimate(**settings)
    row["first_s"] = time.perf_counter() - t0
    found = {}
    for enabled, key in ((True, "replayed"), (False, "traced")):
        block_replay.ENABLED = enabled
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            est = trial.estimate(**settings)
            times.append(time.perf_counter() - t0)
        block_replay.ENABLED = True
        found[key] = est
        row[f"{key}_s"] = statistics.median(times)
        row[f"{key}_notes"] = [n for n in est.notes if "block" in n]
        row[f"{key}_peak_bytes"] = est.peak_bytes
    row["equal"] = all(getattr(found["replayed"], f) == getattr(found["traced"], f) for f in FIELDS)
    row["speedup"] = row["traced_s"] / row["replayed_s"]
    return row


def main() -> None:
    import os

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    device = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--device=")), "cpu")
    only = next(
        (a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--only=")), None
    )
    out = Path(args[0] if args else "bench/results/estimate_speed_cpu.json")
    rows = []
    for case in CASES:
        if only is not None and case[0] not in only:
            continue
        row = one(case, device)
        print(json.dumps(row), flush=True)
        rows.append(row)
    meta = {
        "device": (
            device
            if device == "cpu"
            else torch.cuda.get_device_name()
            if torch.cuda.is_available()
            else "cuda, estimated without CUDA (the stand-in device, in a worker process)"
        ),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "repeats": REPEATS,
    }
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
