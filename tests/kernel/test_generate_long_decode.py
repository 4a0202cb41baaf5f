"""A long decode on the default dynamic cache, where the cache holds the peak: ``estimate_generate``
skips the steps between the first and last ones and fills a stand-in cache, and still gives the
measured ``generate`` cell's peak to the byte, with the cache named ``kv_cache`` as the cell names it."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

pytest.importorskip("transformers")

SMALL = "num_hidden_layers=2, hidden_size=96, intermediate_size=128, num_attention_heads=4"
MODELS = {
    "gpt2": "GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=96, n_head=3, vocab_size=1000))",
    "llama": f"LlamaForCausalLM(LlamaConfig({SMALL}, num_key_value_heads=2, vocab_size=1000))",
    "qwen2-tied": (
        f"Qwen2ForCausalLM(Qwen2Config({SMALL}, num_key_value_heads=2, vocab_size=1000,"
        " tie_word_embeddings=True))"
    ),
}
SETUP = """
import torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers import Qwen2Config, Qwen2ForCausalLM
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
model = {made}.eval()
with torch.device("meta"):
    meta = {made}.eval()
"""


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_long_decode_is_the_measured_peak_with_the_cache_named(
    shell: InteractiveShell, name: str
) -> None:
    from jupyter_gpumem import estimate_generate

    batch, prompt, new = 4, 16, 100
    assert shell.run_cell(SETUP.format(made=MODELS[name])).success
    kwargs = {"pad_token_id": 0, "min_new_tokens": new}
    est = estimate_generate(
        shell.user_ns["meta"],
        batch_size=batch,
        prompt_tokens=prompt,
        max_new_tokens=new,
        device="cpu",
        **kwargs,
    )
    assert est.peak_bytes is not None and est.breakdown is not None, est.reason
    shell.user_ns.update(kwargs=kwargs, new=new)
    prompts = f"ids = torch.randint(1, 100, ({batch}, {prompt})); mask = torch.ones_like(ids)"
    assert shell.run_cell(prompts).success
    run = "out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, **kwargs)"
    assert shell.run_cell(f"%%gpumem -o r --quiet\n{run}").success
    r = shell.user_ns["r"]
    assert shell.user_ns["out"].shape == (batch, prompt + new)
    assert (est.phase, r.peak_phase, r.peak_step) == ("decode", "decode", new - 1)
    assert est.peak_bytes == r.peak_allocated_bytes
    assert est.breakdown["kv_cache"] == r.breakdown["kv_cache"]
    for breakdown in (est.breakdown, r.breakdown):  # the cache holds the peak
        held = {k: v for k, v in breakdown.items() if k != "parameters"}
        assert max(held, key=held.__getitem__) == "kv_cache"
