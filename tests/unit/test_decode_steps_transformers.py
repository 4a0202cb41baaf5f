"""A long decode's skipped steps filled in for the allocator model: placed as every step's are.

On a GPU, ``estimate_generate`` hands the allocator model a growing cache's decode steps with
the ones it skipped on fake tensors filled in (:mod:`~jupyter_gpumem.tuner.estimation.decode_steps`).
Built on the CPU, the filled-in run of transformers' generate is the run of every step, event for
event, and the allocator model (from an empty device) gives it every step's peaks to the byte.
The stand-in cache alone, made fresh in blocks of its exact size, misses the slack of a cache
grown by ``torch.cat`` among the holes its predecessors left.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jupyter_gpumem.tuner.estimation.decode_steps import Unfollowed
from jupyter_gpumem.tuner.estimation.fake_peaks import Peaks, cpu_peaks, cuda_peaks
from jupyter_gpumem.tuner.estimation.fake_step import FakeRun
from tests.unit.test_decode_steps import told

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

# the Llama (4 layers 256 wide, 2 KV heads, 5000 words; 8 x 64 prompt + 200 new tokens)
# in half its layers, a wide batch and a short decode: its cache's blocks pass 1 MiB in a few
# steps, and the stand-in alone is placed 2.5% under every step's peak
WIDE = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 5000,
}
SMALL = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
MODELS: dict[str, tuple[Callable[[Any], Any], tuple[int, int, int], dict[str, Any]]] = {
    "llama-gqa": (lambda t: t.LlamaForCausalLM(t.LlamaConfig(**WIDE)), (128, 8, 20), {}),
    "gpt2-sampled": (lambda t: t.GPT2LMHeadModel(t.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=5000)),
                     (64, 8, 20), {"do_sample": True, "top_k": 50}),
    "qwen2-tied": (lambda t: t.Qwen2ForCausalLM(t.Qwen2Config(**WIDE, tie_word_embeddings=True)),
                   (128, 8, 16), {}),
    "mixtral-sampled": (lambda t: t.MixtralForCausalLM(t.MixtralConfig(
        **SMALL, vocab_size=256, intermediate_size=128, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2)), (2, 8, 8), {"do_sample": True}),
    "opt": (lambda t: t.OPTForCausalLM(t.OPTConfig(
        **SMALL, ffn_dim=128, vocab_size=1000, word_embed_proj_dim=64)), (2, 8, 12), {}),
}  # fmt: skip
SLACK = ("llama-gqa", "gpt2-sampled", "qwen2-tied")  # where the stand-in alone is placed otherwise


def _meta(name: str) -> Any:
    with torch.device("meta"):
        return MODELS[name][0](transformers).eval()


def _run(model: Any, sizes: tuple[int, int, int], kwargs: dict[str, Any], **how: Any) -> FakeRun:
    from jupyter_gpumem.tuner.estimation.generation import _run

    return _run(torch, model, torch.device("cpu"), *sizes, kwargs, **how)


def _placed(peaks: Peaks) -> tuple[int, int, dict[str, int], str | None]:
    return peaks.peak_bytes, peaks.peak_reserved_bytes, peaks.breakdown, peaks.phase


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_filled_in_decode_is_placed_as_every_step_is(name: str) -> None:
    _, sizes, extra = MODELS[name]
    model = _meta(name)
    kwargs = {"pad_token_id": 0, "min_new_tokens": sizes[2], **extra}
    every = _run(model, sizes, kwargs, skip=False)
    skipped = _run(model, sizes, kwargs, skip=True)
    filled = _run(model, sizes, kwargs, skip=True, fill_in=True)
    assert len(skipped.events) < len(every.events)  # the steps between were skipped
    assert told(filled) == told(every) and filled.marks == every.marks
    placed = _placed(cuda_peaks(filled, ()))
    assert placed == _placed(cuda_peaks(every, ()))
    if name in SLACK:  # under every step's peak, allocated and reserved, as in the issue
        stand_in = _placed(cuda_peaks(skipped, ()))
        assert placed[0] > stand_in[0] and placed[1] >= stand_in[1]
    # a CPU estimate's exact bytes are the skipped run's, as they were
    assert cpu_peaks(skipped).peak_bytes == cpu_peaks(every).peak_bytes


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"forced_eos_token_id": 0}, "consecutive decode steps allocate"),  # at the call's last
        ({"min_length": 18}, "the last decode step allocates"),  # ending between
    ],
    ids=["forced-eos", "min-length"],
)
def test_steps_that_change_are_not_filled_in(kwargs: dict[str, Any], why: str) -> None:
    with pytest.raises(Unfollowed, match=why):
        _run(_meta("opt"), (2, 8, 16), {"pad_token_id": 0, **kwargs}, skip=True, fill_in=True)


def test_a_count_from_the_prompt_ending_inside_the_call_takes_every_step() -> None:
    # the last steps' call would count min_new_tokens from its own prompt, the tokens so far
    model, kwargs = _meta("opt"), {"pad_token_id": 0, "min_new_tokens": 10}
    every = told(_run(model, (2, 8, 16), kwargs, skip=False))
    for how in ({}, {"fill_in": True}):
        assert told(_run(model, (2, 8, 16), kwargs, skip=True, **how)) == every
