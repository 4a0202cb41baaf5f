"""QLoRA and 8-bit optimizers on a real GPU: estimated from the meta device beside measured.

A small Llama with NF4 linear layers (double quantization, bf16 compute) prepared as QLoRA
notebooks prepare it: frozen, the rest in fp32, checkpointed, LoRA on the attention. 2 x 1024
tokens take bitsandbytes' dequantizing path; 1 x 512 its per-card choice.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("bitsandbytes")
pytest.importorskip("peft")


def _qlora(device: str) -> Any:
    import bitsandbytes as bnb
    import peft
    import torch
    import transformers
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    cfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=4, attn_implementation="sdpa",
    )  # fmt: skip
    qc = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )  # fmt: skip
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(cfg)
        model = replace_with_bnb_linear(
            model, modules_to_not_convert=["lm_head"], quantization_config=qc
        )
        if device != "meta":  # random weights, quantized as loading quantizes them
            for m in model.modules():
                for name, p in list(m._parameters.items()):
                    if p is None:
                        continue
                    data = torch.empty(p.shape, dtype=p.dtype, device=device).normal_(0, 0.02)
                    if isinstance(m, bnb.nn.Linear4bit) and name == "weight":
                        m._parameters[name] = bnb.nn.Params4bit(
                            data, requires_grad=False, quant_type="nf4", module=m
                        ).to(device)
                    else:
                        m._parameters[name] = torch.nn.Parameter(data)
                    del data  # loaded and quantized one weight at a time
                for name, b in list(m._buffers.items()):
                    m._buffers[name] = torch.zeros(b.shape, dtype=b.dtype, device=device)
    finally:
        torch.set_default_dtype(default)
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    lora = peft.LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    return peft.get_peft_model(model, lora)


def _measured(trial: Any) -> tuple[int, int, Any]:
    import torch

    from jupyter_gpumem.techniques import Config

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    result = trial.run(Config())
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), result


def _loss(m: Any, b: Any) -> Any:
    return m(input_ids=b, labels=b).loss


@pytest.mark.parametrize("tokens", [(2, 1024), (1, 512)])
def test_a_meta_qlora_model_estimates_what_its_4bit_weights_measure(
    tokens: tuple[int, int],
) -> None:
    import torch

    from jupyter_gpumem.tuner.trial import Trial

    meta = _qlora("meta")
    ids = torch.zeros(tokens, dtype=torch.long, device="meta")
    opt = torch.optim.AdamW([p for p in meta.parameters() if p.requires_grad], lr=1e-4)
    est = Trial(meta, ids, _loss, optimizer=opt, warmup=1, steps=2, device="cuda").estimate()
    assert est.peak_bytes is not None, est.reason
    assert all(p.is_meta for p in meta.parameters())
    del meta, opt
    real = _qlora("cuda")
    ids = torch.zeros(tokens, dtype=torch.long, device="cuda")
    opt = torch.optim.AdamW([p for p in real.parameters() if p.requires_grad], lr=1e-4)
    allocated, reserved, result = _measured(
        Trial(real, ids, _loss, optimizer=opt, warmup=1, steps=2)
    )
    print(f"QLoRA {tokens}: estimated {est.peak_bytes} / {est.peak_reserved_bytes}, measured "
          f"{allocated} / {reserved} (trial {result.peak_allocated_bytes}); {est.breakdown}")  # fmt: skip
    assert abs(est.peak_bytes / allocated - 1) <= 0.01
    assert abs(est.peak_reserved_bytes / reserved - 1) <= 0.05


@pytest.mark.parametrize("optimizer", ["AdamW8bit", "PagedAdamW8bit"])
@pytest.mark.parametrize("built_on", ["meta", "cuda"])
def test_an_8bit_optimizer_estimates_what_it_measures(built_on: str, optimizer: str) -> None:
    """A paged one's state outside the allocator is in neither figure, and the estimate says
    how much of it pages."""
    import bitsandbytes as bnb
    import torch
    import transformers

    from jupyter_gpumem.tuner.trial import Trial

    def gpt2(device: str) -> tuple[Any, Any]:
        torch.manual_seed(0)
        with torch.device(device):
            model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=4))
        return model, getattr(bnb.optim, optimizer)(model.parameters(), lr=1e-4)

    model, opt = gpt2(built_on)
    ids = torch.zeros(4, 512, dtype=torch.long, device=built_on)
    est = Trial(model, ids, _loss, optimizer=opt, warmup=1, steps=2, device="cuda").estimate()
    assert est.peak_bytes is not None, est.reason
    del model, opt
    model, opt = gpt2("cuda")
    ids = torch.zeros(4, 512, dtype=torch.long, device="cuda")
    allocated, reserved, _ = _measured(Trial(model, ids, _loss, optimizer=opt, warmup=1, steps=2))
    print(f"{optimizer} from {built_on}: estimated {est.peak_bytes} / {est.peak_reserved_bytes}, "
          f"measured {allocated} / {reserved}; {est.breakdown}")  # fmt: skip
    assert abs(est.peak_bytes / allocated - 1) <= 0.01
    assert abs(est.peak_reserved_bytes / reserved - 1) <= 0.05
    paged = [n for n in est.notes if "unified memory" in n]
    assert bool(paged) == (optimizer == "PagedAdamW8bit"), est.notes
