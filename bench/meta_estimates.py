"""Will it fit? Estimates from a meta model beside the same model measured with random weights.

    python bench/meta_estimates.py bench/results/meta_estimates_h100.json [--only CASE ...]

Each case runs in a process of its own, twice over: first the model is built on the meta
device (no weights anywhere) and ``Trial.estimate()`` predicts the peak of its training steps
on this GPU; then the same architecture is built on the GPU with random weights and
``Trial.run()`` measures it, ``torch.cuda.max_memory_allocated()`` and
``max_memory_reserved()`` read around it as a user would (the cache that building the random
weights left is emptied first, as loading them would leave none). Error = estimate / measured - 1.
Targets: peak allocated within 2%, peak reserved within 5%.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# A Llama-architecture model of about 1.5B parameters (1.47B), shared with bench/meta_ranks.py
LLAMA_1_5B = dict(
    vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=26,
    num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048,
)  # fmt: skip
CASES = (
    "llama-1.5b-full-bf16", "llama3-8b-lora", "llama3-8b-lora-ckpt", "llama3-8b-qlora",
    "vit-l16-fp32",
)  # fmt: skip


def build(case: str, device: str) -> tuple[Any, Any, Any, Any, Any]:
    """(model, optimizer, batch, loss_fn, config) of ``case``, built on ``device``."""
    import torch

    from jupyter_gpumem.techniques import Config

    torch.manual_seed(0)
    if case.startswith("vit"):
        import torchvision

        with torch.device(device):
            model = torchvision.models.vit_l_16()
            batch = (torch.randn(32, 3, 224, 224), torch.randint(0, 1000, (32,)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def vit_loss(m: Any, b: Any) -> Any:
            return torch.nn.functional.cross_entropy(m(b[0]), b[1])

        return model, opt, batch, vit_loss, Config()
    import transformers

    if case.startswith("llama-1.5b"):
        cfg = transformers.LlamaConfig(**LLAMA_1_5B)
        dtype, tokens, config = torch.float32, (4, 1024), Config(precision="bf16-autocast")
    else:
        cfg = transformers.LlamaConfig(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
            rope_theta=500000.0,
        )  # fmt: skip
        dtype, tokens, config = torch.bfloat16, (1, 2048), Config()
    cfg.attn_implementation = "sdpa"
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta" if "qlora" in case else device):
            model = transformers.LlamaForCausalLM(cfg)
        ids = torch.randint(0, cfg.vocab_size, tokens, device=device)
        if "qlora" in case:
            model = quantized(model, device)
    finally:
        torch.set_default_dtype(default)
    if "lora" in case:
        import peft

        if "qlora" in case:  # as QLoRA notebooks do: frozen, the rest cast to fp32, checkpointed
            model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        if case.endswith(("ckpt", "qlora")):
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
            model.enable_input_require_grads()
        lora = peft.LoraConfig(
            r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
        )
        model = peft.get_peft_model(model, lora)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)

    def lm_loss(m: Any, b: Any) -> Any:
        return m(input_ids=b, labels=b).loss

    return model, opt, ids, lm_loss, config


def quantized(model: Any, device: str) -> Any:
    """``model`` (on meta) with 4-bit NF4 linear layers as transformers loads it, on ``device``.

    On the meta device nothing is quantized, as between ``replace_with_bnb_linear`` and the
    loading of a checkpoint; on CUDA each weight is random, quantized as loading quantizes it.
    """
    import bitsandbytes as bnb
    import torch
    from transformers import BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    qc = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )  # fmt: skip
    model = replace_with_bnb_linear(
        model, modules_to_not_convert=["lm_head"], quantization_config=qc
    )
    if device == "meta":
        return model
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is None:
                continue
            data = torch.empty(p.shape, dtype=p.dtype, device=device).normal_(0, 0.02)
            if isinstance(m, bnb.nn.Linear4bit) and name == "weight":
                m._parameters[name] = bnb.nn.Params4bit(
                    data, requires_grad=False, compress_statistics=p.compress_statistics,
                    quant_type=p.quant_type, quant_storage=p.quant_storage, module=m,
                ).to(device)  # fmt: skip
            else:
                m._parameters[name] = torch.nn.Parameter(data, requires_grad=p.requires_grad)
            del data  # loaded and quantized one weight at a time
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = torch.zeros(b.shape, dtype=b.dtype, device=device)  # rotary
    return model


def one(case: str) -> dict[str, Any]:
    import torch

    from jupyter_gpumem.tuner.trial import Trial

    model, opt, batch, loss, config = build(case, "meta")
    trial = Trial(model, batch, loss, optimizer=opt, warmup=1, steps=2, device="cuda")
    t0 = time.perf_counter()
    est = trial.estimate(config=config)
    estimate_s = time.perf_counter() - t0
    assert est.peak_bytes is not None, est.reason
    small = trial.estimate(config=config, gpu="RTX-4090")
    nothing_made = all(p.is_meta for p in model.parameters())
    del model, opt, batch, trial
    model, opt, batch, loss, config = build(case, "cuda")
    trial = Trial(model, batch, loss, optimizer=opt, warmup=1, steps=2)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # as after loading weights: what building them left cached goes
    torch.cuda.reset_peak_memory_stats()
    result = trial.run(config)
    torch.cuda.synchronize()
    allocated = torch.cuda.max_memory_allocated()
    reserved = torch.cuda.max_memory_reserved()
    return {
        "case": case,
        "parameters": sum(p.numel() for p in model.parameters()),
        "config": str(config),
        "estimate_s": estimate_s,
        "nothing_materialised": nothing_made,
        "estimated_allocated": est.peak_bytes,
        "estimated_reserved": est.peak_reserved_bytes,
        "measured_allocated": allocated,
        "measured_reserved": reserved,
        "trial_status": result.status,
        "trial_allocated": result.peak_allocated_bytes,
        "trial_reserved": result.peak_reserved_bytes,
        "error_allocated_pct": 100 * (est.peak_bytes / allocated - 1),
        "error_reserved_pct": 100 * (est.peak_reserved_bytes / reserved - 1),
        "verdict": est.verdict.line(),
        "verdict_rtx_4090": small.verdict.line() if small.verdict else small.reason,
        "fits_here": est.verdict.fits,
        "fits_rtx_4090": small.verdict.fits if small.verdict else None,
        "measured_fits_rtx_4090": reserved + (est.context_bytes or 0) <= small.device_total_bytes,
        "context_bytes": est.context_bytes,
        "device_total_bytes": torch.cuda.get_device_properties(0).total_memory,
        "breakdown": est.breakdown,
        "phase": est.phase,
        "notes": list(est.notes),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--only", choices=CASES, action="append")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one, in this process
    args = parser.parse_args()
    if args.case:
        args.output.write_text(json.dumps(one(args.case), indent=1))
        return
    results = []
    for case in args.only or CASES:
        part = args.output.with_suffix(f".{case}.json")
        done = subprocess.run([sys.executable, __file__, str(part), "--case", case], text=True)
        if done.returncode or not part.exists():
            results.append({"case": case, "failed": done.returncode})
            print(f"{case}: failed ({done.returncode})", flush=True)
            continue
        r = json.loads(part.read_text())
        part.unlink()
        results.append(r)
        gib = 2**30
        print(
            f"{case:22s} estimated {r['estimated_allocated'] / gib:7.2f} GiB "
            f"(reserved {r['estimated_reserved'] / gib:7.2f})  measured {r['measured_allocated'] / gib:7.2f} "
            f"({r['measured_reserved'] / gib:7.2f})  error {r['error_allocated_pct']:+.2f}% "
            f"({r['error_reserved_pct']:+.2f}%)  in {r['estimate_s']:.1f} s\n    {r['verdict']}\n"
            f"    {r['verdict_rtx_4090']} (measured would fit: {r['measured_fits_rtx_4090']})",
            flush=True,
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"machine": platform.node(), "cases": results}, indent=1))


if __name__ == "__main__":
    main()
