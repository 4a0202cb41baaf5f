"""Will it run? ``estimate_generate`` from a meta model beside ``generate`` measured with random weights.

    python bench/generate_estimates.py bench/results/generate_estimates_h100.json [--only CASE ...]

Each case runs in a process of its own: the model is built on the meta device and
``estimate_generate`` predicts the peak of one ``generate`` call; then the same architecture
is built on the GPU with random weights (bf16) and the call runs, ``max_memory_allocated()``
and ``max_memory_reserved()`` read around it after ``reset_peak_memory_stats()``. Every
sequence runs all its new tokens (``min_new_tokens``), as the estimate assumes; a static cache
runs eager (``disable_compile=True``), as the estimate models it. Target: within
2% of the allocated peak. ``batch-20gib`` asks ``max_generate_batch`` for a 20 GiB budget at
2048 + 256 tokens, then measures that batch and one more.
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

# A Llama-architecture model of about 1B parameters (1.1B), and Llama-3-8B's dimensions
LLAMA_1B = dict(
    vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
    num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=4096,
)  # fmt: skip
LLAMA3_8B = dict(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
    rope_theta=500000.0,
)  # fmt: skip
CASES = {
    f"1b-b{b}-p{p}-{cache}": ("1b", b, p, 256, cache)
    for b in (1, 8, 32)
    for p in (512, 2048)
    for cache in ("dynamic", "static")
}
CASES["8b-b8-p2048"] = ("8b", 8, 2048, 512, "dynamic")
# 4-bit NF4 weights (bitsandbytes), as transformers loads them, bf16 compute
CASES["1b-4bit-b8-p2048"] = ("1b-4bit", 8, 2048, 256, "dynamic")
CASES["8b-4bit-b8-p2048"] = ("8b-4bit", 8, 2048, 512, "dynamic")


def build(size: str, device: str) -> Any:
    import torch
    import transformers

    if size.endswith("-4bit"):
        sys.path.insert(0, str(Path(__file__).parent))
        from meta_estimates import quantized

        return quantized(build(size.removesuffix("-4bit"), "meta"), device)
    cfg = transformers.LlamaConfig(**(LLAMA_1B if size == "1b" else LLAMA3_8B))
    cfg.attn_implementation = "sdpa"
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            return transformers.LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)


def kwargs_of(new: int, cache: str) -> dict[str, Any]:
    # generate compiles a static cache's calls on CUDA, which the estimate refuses: both eager
    extra = {"cache_implementation": "static", "disable_compile": True} if cache == "static" else {}
    return {"do_sample": False, "pad_token_id": 0, "min_new_tokens": new, **extra}


def measure(model: Any, batch: int, prompt: int, new: int, cache: str) -> tuple[int, int]:
    import torch

    ids = torch.randint(1, 1000, (batch, prompt), device="cuda")
    mask = torch.ones_like(ids)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=new, **kwargs_of(new, cache)
        )
    torch.cuda.synchronize()
    assert out.shape == (batch, prompt + new), out.shape
    del out
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def one(name: str) -> dict[str, Any]:
    import torch

    from jupyter_gpumem import estimate_generate, max_generate_batch

    if name == "batch-20gib":
        meta = build("1b", "meta")
        t0 = time.perf_counter()
        found = max_generate_batch(
            meta, "20GiB", prompt_tokens=2048, max_new_tokens=256, **kwargs_of(256, "dynamic")
        )
        wall = time.perf_counter() - t0
        real = build("1b", "cuda")
        fits, over = (
            measure(real, n, 2048, 256, "dynamic") for n in (found.batch_size, found.batch_size + 1)
        )
        return {
            "case": name,
            "batch_size": found.batch_size,
            "search_s": wall,
            "tried": found.tried,
            "measured_at_batch": fits,
            "measured_one_more": over,
            "fits_measured": fits[0] <= 20 * 2**30 < over[0],
        }
    size, batch, prompt, new, cache = CASES[name]
    meta = build(size, "meta")
    t0 = time.perf_counter()
    est = estimate_generate(
        meta, batch_size=batch, prompt_tokens=prompt, max_new_tokens=new, **kwargs_of(new, cache)
    )
    wall = time.perf_counter() - t0
    assert est.peak_bytes is not None, est.reason
    del meta
    allocated, reserved = measure(build(size, "cuda"), batch, prompt, new, cache)
    return {
        "case": name,
        "estimate_s": wall,
        "estimated_allocated": est.peak_bytes,
        "estimated_reserved": est.peak_reserved_bytes,
        "measured_allocated": allocated,
        "measured_reserved": reserved,
        "error_allocated_pct": 100 * (est.peak_bytes / allocated - 1),
        "error_reserved_pct": 100 * ((est.peak_reserved_bytes or 0) / reserved - 1),
        "breakdown": est.breakdown,
        "phase": est.phase,
        "verdict": est.verdict.line() if est.verdict else est.reason,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }


def main() -> None:
    names = [*CASES, "batch-20gib"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--only", choices=names, action="append")
    parser.add_argument("--case", choices=names, help=argparse.SUPPRESS)  # one, in this process
    args = parser.parse_args()
    if args.case:
        args.output.write_text(json.dumps(one(args.case), indent=1))
        return
    results = []
    for name in args.only or names:
        part = args.output.with_suffix(f".{name}.json")
        done = subprocess.run([sys.executable, __file__, str(part), "--case", name], text=True)
        if done.returncode or not part.exists():
            results.append({"case": name, "failed": done.returncode})
            print(f"{name}: failed ({done.returncode})", flush=True)
            continue
        r = json.loads(part.read_text())
        part.unlink()
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "breakdown"}), flush=True)
        # after every case: a run cut short keeps what it measured
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"machine": platform.node(), "cases": results}, indent=1))


if __name__ == "__main__":
    main()
