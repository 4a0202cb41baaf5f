"""Will it fit, on a real GPU: a meta model's estimate beside the same model measured, and the
verdict on the card present and on cards by name."""

from __future__ import annotations

from typing import Any

import pytest

GiB = 2**30


def _gpt2(built_on: str, layers: int = 4) -> tuple[Any, Any, Any]:
    import torch
    import transformers

    cfg = transformers.GPT2Config(n_layer=layers, n_embd=256, n_head=8, n_positions=512)
    torch.manual_seed(0)
    with torch.device(built_on):
        model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt, cfg


def _loss(m: Any, b: Any) -> Any:
    return m(input_ids=b, labels=b).loss


def _trial(built_on: str, batch: tuple[int, int], **kwargs: Any) -> Any:
    import torch

    from jupyter_gpumem.tuner.trial import Trial

    model, opt, _ = _gpt2(built_on)
    ids = torch.zeros(batch, dtype=torch.long, device=built_on)
    return Trial(model, ids, _loss, optimizer=opt, warmup=1, steps=2, **kwargs)


@pytest.mark.parametrize("precision", [None, "bf16-autocast"])
def test_a_meta_model_estimates_what_its_weights_measure(precision: str | None) -> None:
    import torch

    from jupyter_gpumem.techniques import Config

    config = Config(precision=precision)
    meta = _trial("meta", (8, 512), device="cuda")
    est = meta.estimate(config=config)
    assert est.peak_bytes is not None, est.reason
    assert all(p.is_meta for p in meta.model.parameters())
    real = _trial("cuda", (8, 512))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    result = real.run(config)
    allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    print(f"{config}: estimated {est.peak_bytes} / {est.peak_reserved_bytes}, "
          f"measured {allocated} / {reserved} (trial {result.peak_allocated_bytes})")  # fmt: skip
    assert abs(est.peak_bytes / allocated - 1) <= 0.02
    assert abs(est.peak_reserved_bytes / reserved - 1) <= 0.05
    assert est.verdict is not None and est.verdict.fits
    assert est.text().splitlines()[1].startswith("fits on ")


def test_the_verdict_on_the_card_present_and_on_cards_by_name() -> None:
    import torch

    from jupyter_gpumem.tuner.estimation.cards import card

    props = torch.cuda.get_device_properties(0)
    meta = _trial("meta", (48, 512), device="cuda")
    here = meta.estimate()
    assert here.verdict is not None
    assert here.verdict.card.total_bytes == props.total_memory
    if "H100" in props.name:  # the table's measured entry
        assert card("H100-80GB").total_bytes == props.total_memory
    assert here.verdict.fits
    t4 = meta.estimate(gpu="T4")
    assert t4.device_total_bytes == card("T4").total_bytes
    assert any("for the T4" in n for n in t4.notes)
    if t4.peak_reserved_bytes > card("T4").total_bytes:
        assert not t4.verdict.fits
        assert "does not fit on T4" in t4.text().splitlines()[1]
    refused = meta.estimate(gpu="T4", precision="bf16-autocast")
    assert refused.peak_bytes is None and "bfloat16" in refused.reason
    with pytest.raises(ValueError, match="known: H100-80GB"):
        meta.estimate(gpu="B300")
