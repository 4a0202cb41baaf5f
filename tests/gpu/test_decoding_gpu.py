"""`generate` on an H100: the KV cache has its own line, the peak is a decode step, exact."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

pytest.importorskip("transformers")

SETUP = """
import torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(bos_token_id=0, eos_token_id=0)).cuda().eval()
ids = torch.randint(1, 50000, (8, 64), device="cuda")
"""

GENERATE = """%%gpumem -o r --quiet
out = model.generate(ids, max_new_tokens=256, do_sample=False, pad_token_id=0,
                     return_dict_in_generate=True{extra})
torch.cuda.synchronize()
"""


@pytest.mark.parametrize(
    "extra", ["", ', cache_implementation="static"'], ids=["dynamic", "static"]
)
def test_generate_names_its_kv_cache(shell: InteractiveShell, extra: str) -> None:
    import torch

    assert shell.run_cell(SETUP).success
    assert shell.run_cell(GENERATE.format(extra=extra)).success  # warm-up: kernels, workspaces
    assert shell.run_cell("first = out").success  # and its cache, held through the next call
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    assert shell.run_cell(GENERATE.format(extra=extra)).success
    r = shell.user_ns["r"]
    cache = shell.user_ns["out"].past_key_values
    sizes = [
        t.untyped_storage().nbytes() for layer in cache.layers for t in (layer.keys, layer.values)
    ]
    total, largest = sum(sizes), max(sizes)
    assert r.peak_allocated_bytes == torch.cuda.max_memory_allocated()
    assert sum(r.breakdown.values()) == r.peak_allocated_bytes
    assert r.peak_phase in ("decode", "prefill")
    # at the peak the cache holds its final bytes, plus (growing by concatenation) at most one
    # layer's old keys or values beside the new ones
    assert 0.98 * total <= r.breakdown["kv_cache"] <= total + largest + 1024 * len(cache.layers)
    if not extra:  # a static cache compiles to CUDA graphs, whose pool holds the workspace
        assert r.breakdown["library_workspace"] > 0  # cuBLAS's, from the warm-up
    assert r.breakdown["unattributed"] <= 0.02 * r.peak_allocated_bytes, r.notes
    # the first call's output holds its cache through the second call: named, as ``other``
    # (unless generate reused that very cache, which makes it this call's)
    if shell.user_ns["first"].past_key_values is not cache:
        held = [n for n in r.notes if "other at the peak, held by: first." in n]
        assert held and r.breakdown["other"] >= 0.98 * total, (r.notes, r.breakdown)
    out = os.environ.get("GPUMEM_OUT")
    if out:
        figures = {
            "cache_bytes": total,
            "breakdown": r.breakdown,
            "peak": r.peak_allocated_bytes,
            "phase": r.peak_phase,
            "step": r.peak_step,
            "wall_s": r.wall_s,
            "notes": list(r.notes),
            "unattributed_share": r.breakdown["unattributed"] / r.peak_allocated_bytes,
        }
        name = "static" if extra else "dynamic"
        Path(out, f"generate_{name}.json").write_text(json.dumps(figures, indent=1))
