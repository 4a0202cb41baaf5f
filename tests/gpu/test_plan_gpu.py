"""Checkpointing plans on a real GPU: ViT-B/16 blocks, GPT-2 124M plans for 12, 10 and 9 GiB.

Every figure goes to ``$GPUMEM_OUT/plan_gpu.json`` (when set) before the checks, so a failing
run still leaves its numbers to read.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

GiB = 2**30
FOUND: dict[str, Any] = {}


def _save(key: str, value: Any) -> None:
    FOUND[key] = value
    print(json.dumps({key: value}, indent=1))
    out = os.environ.get("GPUMEM_OUT")
    if out:
        import torch

        FOUND["device"] = torch.cuda.get_device_name()
        FOUND["torch"] = torch.__version__
        with open(os.path.join(out, "plan_gpu.json"), "w") as f:
            json.dump(FOUND, f, indent=1)


def test_vit_b_16_blocks_lower_the_peak_by_a_third() -> None:
    import torch

    torchvision = pytest.importorskip("torchvision")
    from jupyter_gpumem.techniques import Config, blocks
    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    model = torchvision.models.vit_b_16().cuda()
    names = blocks(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(32, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (32,), device="cuda")
    trial = Trial(
        model,
        (images, labels),
        lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
        optimizer=opt,
        warmup=1,
        steps=3,
    )
    base, ckpt = trial.compare([Config(checkpoint="blocks")])
    _save(
        "vit_b_16",
        {
            "blocks": names,
            "runs": [r.to_row(base) for r in (base, ckpt)],
            "errors": [r.error for r in (base, ckpt)],
        },
    )
    assert names == [f"encoder.layers.encoder_layer_{i}" for i in range(12)]
    assert base.status == ckpt.status == "ok", (base.error, ckpt.error)
    assert ckpt.peak_allocated_bytes <= 0.7 * base.peak_allocated_bytes


@pytest.fixture(scope="module")
def gpt2() -> Any:
    import torch

    if not torch.cuda.is_available():  # module fixtures run before the autouse skip
        pytest.skip("needs a CUDA device")
    transformers = pytest.importorskip("transformers")
    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (8, 1024), device="cuda")
    trial = Trial(model, ids, lambda m, b: m(b, labels=b).loss, optimizer=opt, warmup=1, steps=3)
    yield trial
    del trial, model, opt, ids
    torch.cuda.empty_cache()


@pytest.mark.parametrize("budget_gib", [12, 10])
def test_gpt2_checkpoint_plans_are_strict_subsets_that_fit_as_measured(
    gpt2: Any, budget_gib: int
) -> None:
    """Step times beside checkpointing every block are the benchmark's (bench/results/plan_*):
    under a parallel test run they follow the load."""
    plan = gpt2.plan(budget_gib * GiB, techniques=("checkpoint",))
    plan.verify()
    _save(f"gpt2_checkpoint_{budget_gib}GiB", plan.to_dict())
    assert len(plan.blocks) == 12
    assert plan.fits and 0 < len(plan.checkpoint) < 12, plan.reasoning
    assert plan.measured_fits, plan.reasoning
    every = plan.all_checkpointed
    assert every is not None and every.step_s is not None
    assert plan.measured_step_s is not None


def test_gpt2_plan_with_every_technique_fits_9_gib(gpt2: Any) -> None:
    plan = gpt2.plan(9 * GiB)
    plan.verify()
    _save("gpt2_all_techniques_9GiB", plan.to_dict())
    assert plan.fits, plan.reasoning
    assert plan.measured_fits, plan.reasoning
