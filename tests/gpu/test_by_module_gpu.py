"""The peak by module on a GPU: GPT-2 124M (HF) and a torchvision ViT-B, training steps.

Each block's activation bytes at the peak are checked against the bytes its forward saves
for backward, measured apart (``tests/support/saved_bytes.py``) on the same model and
batch: within 2%. The root's entry is the breakdown, exactly. The figures go to
``$GPUMEM_OUT/by_module_<model>.json`` (when set) before the checks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.support.saved_bytes import saved_bytes_by_module

GPT2 = """
import torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).cuda()
batch = torch.randint(0, 50257, (4, 512), device="cuda")
def step():
    return model(batch, labels=batch).loss
blocks = {f"transformer.h.{i}": b for i, b in enumerate(model.transformer.h)}
"""
VIT = """
import torch, torchvision
torch.manual_seed(0)
model = torchvision.models.vit_b_16().cuda()
batch = torch.randn(32, 3, 224, 224, device="cuda")
labels = torch.randint(0, 1000, (32,), device="cuda")
def step():
    return torch.nn.functional.cross_entropy(model(batch), labels)
blocks = dict(model.encoder.layers.named_children())
blocks = {f"encoder.layers.{name}": b for name, b in blocks.items()}
"""
TRAIN = """%%gpumem -o r --quiet
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
for _ in range(3):
    step().backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
"""


def _measure(shell: InteractiveShell, setup: str, name: str) -> dict[str, float]:
    """Train 3 steps under ``%%gpumem``; each block's relative error against its saved bytes,
    after the checks every model shares (exact peak, root = breakdown, nesting)."""
    import torch

    assert shell.run_cell(setup).success
    ns = shell.user_ns
    expected, loss = saved_bytes_by_module(ns["blocks"], ns["step"])
    del loss
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    assert shell.run_cell(TRAIN).success
    r = ns["r"]
    got = {
        path: sum(
            amounts.get("activations", 0)
            for label, amounts in r.by_module.items()
            if label == path or label.startswith(f"{path}#")
        )
        for path in expected
    }
    errors = {path: got[path] / expected[path] - 1 for path in expected}
    out = os.environ.get("GPUMEM_OUT")
    if out:
        figures = {
            "peak": r.peak_allocated_bytes,
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "phase": [r.peak_phase, r.peak_step],
            "breakdown": r.breakdown,
            "saved_by_block": expected,
            "activations_at_peak_by_block": got,
            "relative_error": errors,
            "largest_modules": [(m.path, m.own()) for m in r.module_tree.ranked()[:8]],
            "wall_s": r.wall_s,
        }
        Path(out, f"by_module_{name}.json").write_text(json.dumps(figures, indent=1))
    assert r.peak_allocated_bytes == torch.cuda.max_memory_allocated()
    assert r.breakdown["unattributed"] <= 0.02 * r.peak_allocated_bytes, r.notes
    assert r.by_module[""] == {k: v for k, v in r.breakdown.items() if v}
    assert min(expected.values()) > 0
    for module in r.module_tree.walk():  # a module holds at least its children's bytes
        assert all(n > 0 for n in module.own().values()), module.path
    return errors


def test_gpt2_blocks_at_the_peak_hold_what_their_forwards_saved(shell: InteractiveShell) -> None:
    pytest.importorskip("transformers")
    errors = _measure(shell, GPT2, "gpt2")
    assert len(errors) == 12 and all(abs(e) <= 0.02 for e in errors.values()), errors


def test_vit_blocks_at_the_peak_hold_what_their_forwards_saved(shell: InteractiveShell) -> None:
    pytest.importorskip("torchvision")
    errors = _measure(shell, VIT, "vit_b_16")
    assert len(errors) == 12 and all(abs(e) <= 0.02 for e in errors.values()), errors
