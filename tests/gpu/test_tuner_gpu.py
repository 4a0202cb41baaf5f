"""Technique trials on a real GPU: GPT-2 124M against SPEC's reference figures, ResNet-152."""

from __future__ import annotations

import json
import os

import pytest

GiB = 2**30
# SPEC.md, H100 80GB, GPT-2 124M from config, batch 8 x 1024, fp32 AdamW.
REFERENCE_PEAK = {
    "baseline": 14.69 * GiB,
    "ckpt blocks": 6.86 * GiB,
    "bf16-autocast": 12.67 * GiB,
    "bf16": 14.69 * GiB * (1 - 0.33),
    "sgd": (14.69 - 0.46) * GiB,
}


def _table(results: list, baseline: object) -> str:
    lines = [
        "| configuration | peak | vs baseline | step | vs baseline |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        row = r.to_row(baseline)
        lines.append(
            f"| {r.label} | {r.peak_allocated_bytes / GiB:.2f} GiB | {row['delta_peak_pct']:+.1f}% "
            f"| {r.step_s * 1000:.0f} ms | {row['delta_step_pct']:+.1f}% |"
        )
    return "\n".join(lines)


def _save(name: str, text: str, data: object) -> None:
    out = os.environ.get("GPUMEM_OUT")
    print(text)
    if out:
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(data, f, indent=1, default=str)


def test_gpt2_trials_match_the_reference_figures() -> None:
    import torch

    transformers = pytest.importorskip("transformers")
    from jupyter_gpumem.techniques import Config
    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (8, 1024), device="cuda")
    trial = Trial(model, ids, lambda m, b: m(b, labels=b).loss, optimizer=opt, warmup=2, steps=5)
    configs = {
        "baseline": Config(),
        "ckpt blocks": Config(checkpoint="blocks"),
        "bf16-autocast": Config(precision="bf16-autocast"),
        "bf16": Config(precision="bf16"),
        "sgd": Config(optimizer="sgd"),
    }
    results = trial.compare(list(configs.values()))
    assert [r.status for r in results] == ["ok"] * 5, [(r.label, r.error) for r in results]
    table = _table(results, results[0])
    _save("tuner_gpt2", table, [r.to_row(results[0]) for r in results])
    for key, r in zip(configs, results, strict=True):
        expected = REFERENCE_PEAK[key]
        assert abs(r.peak_allocated_bytes - expected) <= 0.05 * expected, (
            key,
            r.peak_allocated_bytes / GiB,
        )
        assert sum(r.breakdown.values()) == r.peak_allocated_bytes


def test_resnet152_checkpointing_layer1_and_layer2_saves_about_a_third() -> None:
    import torch

    torchvision = pytest.importorskip("torchvision")
    from jupyter_gpumem.techniques import Config
    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    model = torchvision.models.resnet152().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images = torch.randn(64, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (64,), device="cuda")
    trial = Trial(
        model,
        (images, labels),
        lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
        optimizer=opt,
        steps=3,
    )
    results = trial.compare([Config(), Config(checkpoint=("layer1", "layer2"))])
    assert [r.status for r in results] == ["ok", "ok"], [(r.label, r.error) for r in results]
    base, ckpt = results
    assert any("BatchNorm" in w for w in ckpt.warnings)  # running stats update twice in a region
    saved = 1 - ckpt.peak_allocated_bytes / base.peak_allocated_bytes
    _save(
        "tuner_resnet152",
        _table(results, base) + f"\nsaved {saved:.1%} of the peak",
        [r.to_row(base) for r in results],
    )
    assert 0.25 <= saved <= 0.42, saved
