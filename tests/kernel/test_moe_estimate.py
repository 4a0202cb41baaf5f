"""Mixture-of-experts models on fake tensors: transformers' experts multiply through
``torch._grouped_mm``, whose fake kernel takes bf16 alone while the real kernels take fp32 too.

A meta model's estimate must equal, to the byte, the estimate of the same model with real
weights, and the peak measured on the CPU, in fp32, under bf16 autocast (the op is not
autocast-enabled, so the experts multiply in fp32) and in pure bf16.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.trial import Trial

transformers = pytest.importorskip("transformers")

TOLERANCE_PCT = 1.0
VOCAB = 256
PRECISIONS = ("fp32", "bf16-autocast", "bf16")
SIZES = {
    "vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2,
}  # fmt: skip
# model class, config class, the config's own sizes; a transformers without one skips it
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mixtral": (
        "MixtralForCausalLM", "MixtralConfig",
        {"intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "qwen2_moe": (
        "Qwen2MoeForCausalLM", "Qwen2MoeConfig",
        {"intermediate_size": 128, "moe_intermediate_size": 64, "num_experts": 4,
         "num_experts_per_tok": 2, "shared_expert_intermediate_size": 128},
    ),
    "qwen3_moe": (
        "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
        {"intermediate_size": 128, "moe_intermediate_size": 64, "num_experts": 4,
         "num_experts_per_tok": 2},
    ),
    "olmoe": (
        "OlmoeForCausalLM", "OlmoeConfig",
        {"intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2},
    ),
}  # fmt: skip


def _builder(name: str) -> Callable[[], nn.Module]:
    model_cls, config_cls, own = MODELS[name]
    if not hasattr(transformers, model_cls):
        pytest.skip(f"this transformers has no {model_cls}")
    config = getattr(transformers, config_cls)(**SIZES, **own)
    return lambda: getattr(transformers, model_cls)(config)


def _loss(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return m(input_ids=ids, labels=ids).loss


def _trial(build: Callable[[], nn.Module], built_on: str, **kwargs: Any) -> Trial:
    torch.manual_seed(0)
    with torch.device(built_on):
        model = build()
    ids = torch.randint(0, VOCAB, (2, 48), device=built_on)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Trial(model, ids, _loss, optimizer=opt, warmup=1, steps=1, **kwargs)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_moe_step_estimates_as_measured_in_each_precision(name: str) -> None:
    build = _builder(name)
    real, meta = _trial(build, "cpu"), _trial(build, "meta", device="cpu")
    for precision in PRECISIONS:
        config = Config(precision=precision)
        est = meta.estimate(config=config)
        assert est.peak_bytes is not None, (precision, est.reason)
        materialised = real.estimate(config=config)
        assert (est.peak_bytes, est.breakdown) == (materialised.peak_bytes, materialised.breakdown)
        result = real.run(config)
        assert result.status == "ok", result.error
        error = est.error_pct(result.peak_allocated_bytes)
        assert error is not None and abs(error) <= TOLERANCE_PCT, (
            precision, est.peak_bytes, result.peak_allocated_bytes,
        )  # fmt: skip
        report = result.report
        assert report is not None and report.main is not None
        assert est.phase == report.main.peak_phase, precision
    assert all(p.is_meta for p in meta.model.parameters())


GENERATE_SETUP = """
import torch, transformers
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
config = transformers.MixtralConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
    bos_token_id=0, eos_token_id=0,
)
model = transformers.MixtralForCausalLM(config).eval()
with torch.device("meta"):
    meta = transformers.MixtralForCausalLM(config).eval()
"""


def test_a_moe_generate_estimates_as_the_measured_cell(shell: InteractiveShell) -> None:
    from jupyter_gpumem import estimate_generate

    assert shell.run_cell(GENERATE_SETUP).success
    meta = shell.user_ns["meta"]
    kwargs = {"pad_token_id": 0, "min_new_tokens": 6}
    est = estimate_generate(
        meta, batch_size=2, prompt_tokens=8, max_new_tokens=6, device="cpu", **kwargs
    )
    assert est.peak_bytes is not None, est.reason
    assert all(p.is_meta for p in meta.parameters())
    shell.user_ns.update(kwargs=kwargs)
    prompts = "ids = torch.randint(1, 100, (2, 8)); mask = torch.ones_like(ids)"
    assert shell.run_cell(prompts).success
    run = "out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, **kwargs)"
    assert shell.run_cell(f"%%gpumem -o r --quiet\n{run}").success
    r = shell.user_ns["r"]
    assert shell.user_ns["out"].shape == (2, 14)
    assert est.peak_bytes == r.peak_allocated_bytes
    assert est.phase == r.peak_phase
    assert est.breakdown is not None and est.breakdown["kv_cache"] == r.breakdown["kv_cache"]
    assert est.breakdown["parameters"] == r.breakdown["parameters"]
