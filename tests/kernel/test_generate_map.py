"""How far will generate go? The longest prompt at a batch, measured on the CPU, and the
batch x context map with its frontier."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

pytest.importorskip("transformers")

SETUP = """
import torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=256, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config).eval()
with torch.device("meta"):
    meta = GPT2LMHeadModel(config).eval()
"""
KWARGS = {"pad_token_id": 0, "min_new_tokens": 8}


def test_the_longest_prompt_runs_within_the_budget_and_one_token_more_does_not(
    shell: InteractiveShell,
) -> None:
    from jupyter_gpumem import estimate_generate, max_generate_context

    assert shell.run_cell(SETUP).success
    meta = shell.user_ns["meta"]
    short = estimate_generate(
        meta, batch_size=4, prompt_tokens=8, max_new_tokens=8, device="cpu", **KWARGS
    )
    assert short.peak_bytes is not None and short.breakdown is not None
    budget = short.peak_bytes + 40_000  # room for some more tokens, far from the 256 positions
    found = max_generate_context(
        meta, budget, batch_size=4, max_new_tokens=8, device="cpu", **KWARGS
    )
    assert 8 < found.prompt_tokens < 248 and found.context_tokens == found.prompt_tokens + 8
    assert found.limit == 256 and found.above is not None and len(found.tried) <= 10
    measured = {}
    for n in (found.prompt_tokens, found.prompt_tokens + 1):  # measured, as a user runs it
        shell.user_ns.update(kwargs=KWARGS, n=n)
        cell = (
            "ids = torch.randint(1, 100, (4, n))\n"
            "out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), "
            "max_new_tokens=8, **kwargs)"
        )
        assert shell.run_cell(f"%%gpumem -o r --quiet\n{cell}").success
        shell.run_cell("del out")
        measured[n] = shell.user_ns["r"].peak_allocated_bytes
    assert measured[found.prompt_tokens] <= budget < measured[found.prompt_tokens + 1]


def test_a_budget_past_the_model_limit_stops_at_the_limit() -> None:
    import torch
    import transformers

    from jupyter_gpumem import max_generate_context

    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64)
    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(config).eval()
    found = max_generate_context(
        meta, "1GiB", batch_size=1, max_new_tokens=8, device="cpu", pad_token_id=0
    )
    assert (found.prompt_tokens, found.context_tokens, found.above) == (56, 64, None)
    with pytest.raises(ValueError, match="leaves no room for a prompt in the model's 64"):
        max_generate_context(meta, "1GiB", batch_size=1, max_new_tokens=64, device="cpu")


def test_the_map_agrees_with_each_estimate_and_its_frontier_falls_with_the_batch() -> None:
    import torch
    import transformers

    from jupyter_gpumem import estimate_generate, generate_map

    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=512)
    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(config).eval()
    one = estimate_generate(
        meta, batch_size=4, prompt_tokens=56, max_new_tokens=8, device="cpu", **KWARGS
    )
    assert one.peak_bytes is not None
    contexts = (32, 64, 128, 256, 512, 1024)  # the last is past the model's 512 positions
    found = generate_map(
        meta, max_new_tokens=8, budget=one.peak_bytes, batch_sizes=(1, 4, 16),
        contexts=contexts, device="cpu", **KWARGS,
    )  # fmt: skip
    assert found.contexts == (32, 64, 128, 256, 512) and found.batch_sizes == (1, 4, 16)
    assert found.estimates[1][1] is not None and found.estimates[1][1].peak_bytes == one.peak_bytes
    frontier = found.frontier()
    assert frontier[1] == 64  # batch 4 fits up to this context and no further
    assert frontier[0] >= frontier[1] >= frontier[2]
    for i in range(3):
        for j in range(5):
            est = found.estimates[i][j]
            fits = found.fits(i, j)
            if est is None:  # left out: a smaller cell already did not fit
                assert fits is False and found.contexts[j] > frontier[i]
            else:
                assert est.peak_bytes is not None and fits == (est.peak_bytes <= one.peak_bytes)
    text = found.text()
    assert "within" in text and " x" in text and "batch \\ context" in text
    assert found.to_dict()["frontier"] == list(frontier)
    assert 'class="gpumem-map-over"' in found._repr_html_()


def test_the_map_says_what_it_takes() -> None:
    import torch
    import transformers

    from jupyter_gpumem import generate_map

    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2))
    with pytest.raises(ValueError, match=r"takes a budget .* or a gpu"):
        generate_map(meta, max_new_tokens=8)
    with pytest.raises(ValueError, match=r"batch_sizes is a list of whole numbers"):
        generate_map(meta, max_new_tokens=8, budget="1GiB", batch_sizes=(0,))
    with pytest.raises(ValueError, match="leaves room for a prompt"):
        generate_map(meta, max_new_tokens=8, budget="1GiB", contexts=(4, 8))
