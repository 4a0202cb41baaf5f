"""Workflows users run, on a GPU: every byte of the peak has a name, and the peak is exact.

HF ``Trainer``'s optimizer held after training, a PEFT LoRA model's AdamW state, and
``torch.compile(mode="reduce-overhead")``'s CUDA graph pool. In each, what stays
unattributed is at most 2% of the peak; cuBLAS's workspaces are named as such.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem.report.build import graph_pool_note

MODEL = """
import torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=4, bos_token_id=0, eos_token_id=0)).cuda()
ids = torch.randint(1, 50000, (8, 128), device="cuda")
"""


def _named_to_within_two_percent(r: Any) -> None:
    import torch

    hooks = torch.nn.modules.module
    assert not hooks._global_forward_hooks and not hooks._global_forward_pre_hooks  # all removed
    assert r.peak_allocated_bytes == torch.cuda.max_memory_allocated()
    assert sum(r.breakdown.values()) == r.peak_allocated_bytes
    assert r.breakdown["unattributed"] <= 0.02 * r.peak_allocated_bytes, (r.breakdown, r.notes)


def _save(name: str, r: Any, **figures: Any) -> None:
    out = os.environ.get("GPUMEM_OUT")
    if out:
        figures.update(
            breakdown=r.breakdown, peak=r.peak_allocated_bytes, notes=list(r.notes), wall_s=r.wall_s
        )
        Path(out, f"workflow_{name}.json").write_text(json.dumps(figures, indent=1))


def _state_bytes(optimizer: Any) -> int:
    return sum(
        t.untyped_storage().nbytes()
        for state in optimizer.state.values()
        for t in state.values()
        if hasattr(t, "is_cuda") and t.is_cuda
    )


def test_a_trainers_optimizer_is_optimizer_state_in_a_cell_that_does_not_train(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    pytest.importorskip("accelerate")
    import torch

    assert shell.run_cell(MODEL).success
    train = f"""
from transformers import Trainer, TrainingArguments
rows = [{{"input_ids": ids[i].cpu(), "labels": ids[i].cpu()}} for i in range(8)]
args = TrainingArguments(output_dir={str(tmp_path)!r}, max_steps=3, per_device_train_batch_size=4,
                         gradient_accumulation_steps=2, bf16=True, report_to=[],
                         save_strategy="no", logging_strategy="no", disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=rows)
trainer.train()
"""
    assert shell.run_cell(train).success
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    assert shell.run_cell(
        "%%gpumem -o r --quiet\nwith torch.no_grad():\n    logits = model(ids[:2]).logits\n"
        "torch.cuda.synchronize()\n"
    ).success
    r = shell.user_ns["r"]
    expected = _state_bytes(shell.user_ns["trainer"].optimizer)
    assert expected > 0
    assert abs(r.breakdown["optimizer_state"] - expected) <= 0.01 * expected
    _named_to_within_two_percent(r)
    _save("trainer", r, optimizer_state_bytes=expected)


def test_lora_optimizer_state_is_eight_bytes_per_trainable_parameter(
    shell: InteractiveShell,
) -> None:
    pytest.importorskip("peft")
    import torch

    assert shell.run_cell(MODEL).success
    setup = """
from peft import LoraConfig, get_peft_model
lora = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"]))
opt = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-4)
trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
def step():
    loss = lora(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
step()
"""
    assert shell.run_cell(setup).success
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    assert shell.run_cell(
        "%%gpumem -o r --quiet\nfor _ in range(3):\n    step()\ntorch.cuda.synchronize()\n"
    ).success
    r = shell.user_ns["r"]
    trainable = shell.user_ns["trainable"]
    assert r.breakdown["optimizer_state"] == 8 * trainable
    _named_to_within_two_percent(r)
    _save("lora", r, trainable=trainable)


def test_reduce_overhead_cuda_graph_pool_is_named(shell: InteractiveShell) -> None:
    import torch

    setup = """
import torch
torch.manual_seed(0)
net = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
).cuda()
opt = torch.optim.SGD(net.parameters(), lr=1e-3)
compiled = torch.compile(net, mode="reduce-overhead")
x = torch.randn(256, 1024, device="cuda")
def step():
    torch.compiler.cudagraph_mark_step_begin()
    compiled(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
for _ in range(4):
    step()
torch.cuda.synchronize()
"""
    assert shell.run_cell(setup).success
    torch.cuda.reset_peak_memory_stats()
    assert shell.run_cell(
        "%%gpumem -o r --quiet\nfor _ in range(3):\n    step()\ntorch.cuda.synchronize()\n"
    ).success
    r = shell.user_ns["r"]
    pool = sum(
        s["total_size"]
        for s in torch.cuda.memory_snapshot()
        if tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0)
    )
    _save("reduce_overhead", r, pool_reserved=pool)
    # replays allocate nothing: the pool is reserved memory, its blocks allocated only
    # while a graph's output is alive
    assert pool > 0 and "cuda:0: " + graph_pool_note(pool) in r.notes
    assert r.breakdown["cuda_graph_pool"] <= pool
    _named_to_within_two_percent(r)
    # the compiled graphs hold the model's parameters: let them go for the tests that follow
    assert shell.run_cell("del compiled, net, opt, x, step\ntorch._dynamo.reset()").success
