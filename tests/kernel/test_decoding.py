"""Inference has words of its own: a KV cache, prefill and decode, on the CPU."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

pytest.importorskip("transformers")

SETUP = """
import torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config).eval()
ids = torch.randint(1, 100, (4, 8))
"""

GENERATE = """%%gpumem -o r --quiet
out = model.generate(ids, max_new_tokens={new}, do_sample=False, pad_token_id=0,
                     return_dict_in_generate=True{extra})
"""


@pytest.fixture
def ip(shell: InteractiveShell) -> Iterator[InteractiveShell]:
    assert shell.run_cell(SETUP).success
    yield shell


def cache_bytes(cache: object) -> tuple[int, int]:
    """The cache's bytes, and those of its largest tensor."""
    sizes = [
        t.untyped_storage().nbytes()
        for layer in cache.layers  # type: ignore[attr-defined]
        for t in (layer.keys, layer.values)
    ]
    return sum(sizes), max(sizes)


def test_a_dynamic_cache_is_kv_cache_and_the_peak_is_a_decode_step(ip: InteractiveShell) -> None:
    assert ip.run_cell(GENERATE.format(new=100, extra="")).success
    r = ip.user_ns["r"]
    total, largest = cache_bytes(ip.user_ns["out"].past_key_values)
    assert r.peak_phase == "decode" and r.peak_step == 99  # 1 prefill, 99 decode steps
    # Growing by concatenation, a layer's old keys (or values) live beside the new ones for a
    # moment: at the peak the cache holds its final bytes plus at most one such copy.
    assert total <= r.breakdown["kv_cache"] <= total + largest, (r.breakdown, total)
    assert sum(r.breakdown.values()) == r.peak_allocated_bytes
    assert r.breakdown["unattributed"] == 0
    assert r.breakdown["kv_cache"] > r.breakdown["parameters"] / 2  # the line users look for


def test_a_static_cache_is_kv_cache_to_the_byte(ip: InteractiveShell) -> None:
    extra = ', cache_implementation="static"'
    assert ip.run_cell(GENERATE.format(new=60, extra=extra)).success
    r = ip.user_ns["r"]
    total, _ = cache_bytes(ip.user_ns["out"].past_key_values)
    layers = len(ip.user_ns["out"].past_key_values.layers)
    extra_bytes = r.breakdown["kv_cache"] - total  # each layer's position counters
    assert 0 <= extra_bytes <= 64 * layers, (r.breakdown, total)
    assert r.peak_phase in ("prefill", "decode")


def test_the_timeline_has_prefill_and_decode_bands(ip: InteractiveShell) -> None:
    assert ip.run_cell(GENERATE.format(new=20, extra="")).success
    r = ip.user_ns["r"]
    phases = [b.phase for b in r.timeline.bands]
    assert phases.count("prefill") == 1 and phases.count("decode") >= 1
    assert phases.index("prefill") < phases.index("decode")


def test_a_training_forward_is_not_a_decode_step(ip: InteractiveShell) -> None:
    cell = (
        "%%gpumem -o r --quiet\nmodel.train()\nloss = model(ids, labels=ids).loss\nloss.backward()"
    )
    assert ip.run_cell(cell).success
    r = ip.user_ns["r"]
    assert r.breakdown["kv_cache"] == 0 and r.peak_phase in ("forward", "backward")


def test_the_logits_processing_belongs_to_the_decode_step_it_serves(
    shell: InteractiveShell,
) -> None:
    """With GPT-2's vocabulary and a one-token prompt, the peak falls after the last model call:
    generate copies its logits to float32 and picks the token. That is the last decode step
    (6 new tokens: 1 from the prefill, 5 decode steps), not work outside the generation."""
    setup = SETUP.replace("vocab_size=100, ", "").replace("(4, 8)", "(4, 1)")
    assert "vocab_size" not in setup and shell.run_cell(setup).success
    assert shell.run_cell(GENERATE.format(new=6, extra="")).success
    r = shell.user_ns["r"]
    vocab_row = 4 * shell.user_ns["config"].vocab_size * 4  # a batch's float32 logits
    assert (r.peak_phase, r.peak_step) == ("decode", 5)
    assert r.breakdown["temporary"] >= 2 * vocab_row  # the logits and their float32 copy


@pytest.mark.parametrize("extra", ["", ', cache_implementation="static"'])
def test_a_cache_held_by_an_output_is_named_layer_by_layer(
    ip: InteractiveShell, extra: str
) -> None:
    """What a later cell finds held from a generate, by the output or by a variable of its own."""
    from jupyter_gpumem.tracking.namespace import walk

    assert ip.run_cell(GENERATE.format(new=5, extra=extra)).success
    cache = ip.user_ns["out"].past_key_values
    held = {"out": ip.user_ns["out"], "kv": cache, "pair": (1, cache)}
    names: dict[int, list[str]] = {}
    for t, name, _ in walk(held):
        names.setdefault(id(t), []).append(name)
    attr = next(k for k, v in ip.user_ns["out"].items() if v is cache)
    for i, layer in enumerate(cache.layers):
        for kind in ("keys", "values"):
            t = getattr(layer, kind)
            assert names[id(t)] == [
                f"out.{attr}.layers[{i}].{kind}",
                f"kv.layers[{i}].{kind}",
                f"pair[1].layers[{i}].{kind}",
            ]


def test_a_cache_held_from_an_earlier_generate_is_named_at_the_peak(ip: InteractiveShell) -> None:
    """A second generate while the first one's output still holds its cache: those bytes are
    ``other``, and the report says what holds them."""
    assert ip.run_cell(GENERATE.format(new=5, extra="")).success
    assert ip.run_cell("first = out").success
    assert ip.run_cell(GENERATE.format(new=5, extra="")).success
    r = ip.user_ns["r"]
    cache = ip.user_ns["first"].past_key_values
    attr = next(k for k, v in ip.user_ns["first"].items() if v is cache)
    total, _ = cache_bytes(cache)
    assert r.breakdown["other"] >= total
    held = next(n for n in r.notes if "other at the peak, held by: " in n)
    assert f"first.{attr} " in held and f"({2 * len(cache.layers)} tensors)" in held, held
    assert r.breakdown["unattributed"] == 0
