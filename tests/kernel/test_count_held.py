"""``count_held`` on the CPU: accepted by every estimate's entry point, checked, and moot there.

The dispatch source counts the model's, optimizer's and batch's storages only, so a real 2 GiB
tensor alive beside a meta model changes no CPU estimate, counted or not (what the GPU's
allocator model does with it: ``tests/unit/test_held_before.py``, ``tests/gpu/test_held_gpu.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from jupyter_gpumem.tuner.trial import Trial

transformers = pytest.importorskip("transformers")

GiB = 1 << 30


def _meta_gpt2() -> Any:
    config = transformers.GPT2Config(
        vocab_size=256, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(config).eval()


def _meta_trial() -> Trial:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10))
        opt = torch.optim.AdamW(model.parameters())
        batch = torch.zeros(8, 64)
    return Trial(model, batch, lambda m, b: m(b).sum(), optimizer=opt)


def test_a_cpu_estimate_leaves_a_real_tensor_of_the_process_out_either_way() -> None:
    from jupyter_gpumem import estimate_generate

    trial, meta = _meta_trial(), _meta_gpt2()
    sizes = {"batch_size": 2, "prompt_tokens": 8, "max_new_tokens": 3, "device": "cpu"}
    before = trial.estimate(), estimate_generate(meta, **sizes, pad_token_id=0)
    held = torch.empty(2 * GiB, dtype=torch.uint8)  # pages untouched: no host memory spent
    for count_held in (True, False):
        after = (
            trial.estimate(count_held=count_held),
            estimate_generate(meta, **sizes, pad_token_id=0, count_held=count_held),
        )
        for old, new in zip(before, after, strict=True):
            assert new.peak_bytes is not None, new.reason
            assert (new.peak_bytes, new.breakdown) == (old.peak_bytes, old.breakdown)
            assert new.held_bytes is None and not any("held" in n for n in new.notes)
    del held


@pytest.mark.parametrize("value", ["no", 0, None])
def test_count_held_is_checked_at_every_entry_point(value: Any) -> None:
    from jupyter_gpumem import estimate_generate
    from jupyter_gpumem.tuner.estimation.generate_map import generate_map, max_generate_context
    from jupyter_gpumem.tuner.estimation.generation import max_generate_batch

    trial, meta = _meta_trial(), _meta_gpt2()
    sizes: dict[str, Any] = {"prompt_tokens": 8, "max_new_tokens": 3, "device": "cpu"}
    calls = [
        lambda: trial.estimate(count_held=value),
        lambda: trial.max_batch_size("1GiB", lambda n: torch.zeros(n, 64), count_held=value),
        lambda: trial.search("1GiB", count_held=value),
        lambda: trial.plan("1GiB", count_held=value),
        lambda: estimate_generate(meta, batch_size=1, **sizes, count_held=value),
        lambda: max_generate_batch(meta, "1GiB", **sizes, count_held=value),
        lambda: max_generate_context(
            meta, "1GiB", batch_size=1, max_new_tokens=3, device="cpu", count_held=value
        ),
        lambda: generate_map(
            meta, max_new_tokens=3, budget="1GiB", contexts=(8,), device="cpu", count_held=value
        ),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=r"count_held must be True .* or False .*, got"):
            call()


def test_a_plan_that_measures_runs_refuses_to_leave_held_memory_out() -> None:
    model = nn.Sequential(nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trial = Trial(model, torch.zeros(4, 8), lambda m, b: m(b).sum(), optimizer=opt)
    with pytest.raises(ValueError, match="plan measures runs, which hold it too"):
        trial.plan("1GiB", count_held=False)
