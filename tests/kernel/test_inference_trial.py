"""Inference trials: forward passes alone, and ``Config(inference_mode=True)`` (issue 38).

On the CPU the dispatch source counts exact storage bytes, so each estimate must equal its
measured peak to the byte; the GPU test (tests/gpu/test_inference_gpu.py) measures GPT-2.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.trial import Trial
from tests.kernel.test_estimate import TinyGPT, _gpt_batch

CONFIGS = [
    Config(inference_mode=True),
    Config(precision="bf16-autocast"),
    Config(precision="bf16-autocast", inference_mode=True),
    Config(precision="bf16", inference_mode=True),
    Config(checkpoint="blocks"),
]


def _logits(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    # tanh saves its own output for backward: a forward with no backward must still free it
    return m(ids[:, :-1]).tanh()


def _trial(**kwargs: Any) -> Trial:
    torch.manual_seed(0)
    model = TinyGPT()
    return Trial(model, _gpt_batch(8), _logits, inference=True, **kwargs)


def _state(model: nn.Module) -> dict[str, Any]:
    """What an inference trial could touch: weights, their grads, flags and random state."""
    return {
        "params": [
            (id(p), p.dtype, p.detach().clone(), p.requires_grad) for p in model.parameters()
        ],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "buffers": [(id(b), b.clone()) for b in model.buffers()],
        "training": [m.training for m in model.modules()],
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
    }


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for (i, dtype, value, grad), (j, dtype2, value2, grad2) in zip(
        a["params"], b["params"], strict=True
    ):
        assert (i, dtype, grad) == (j, dtype2, grad2) and torch.equal(value, value2)
    for x, y in zip(a["grads"], b["grads"], strict=True):
        assert (x is None and y is None) or torch.equal(x, y)
    for (i, x), (j, y) in zip(a["buffers"], b["buffers"], strict=True):
        assert i == j and torch.equal(x, y)
    assert a["training"] == b["training"]
    assert torch.equal(a["torch_rng"], b["torch_rng"]) and a["python_rng"] == b["python_rng"]
    np.testing.assert_equal(a["numpy_rng"], b["numpy_rng"])


def test_each_estimate_equals_the_measured_forward_peak() -> None:
    trial = _trial(warmup=1, steps=2)
    estimates = {c: trial.estimate(config=c) for c in [Config(), *CONFIGS]}
    results = trial.compare(CONFIGS)
    for result in results:
        assert result.status == "ok", result.error
        predicted = estimates[result.config]
        assert predicted.peak_bytes == result.peak_allocated_bytes, result.vs_estimate
        assert predicted.breakdown == result.breakdown, result.config
        assert result.breakdown["gradients"] == result.breakdown["optimizer_state"] == 0
    by = {r.config: r for r in results}
    # the user's forward keeps its graph: what it saves for backward is held at the peak
    assert by[Config()].breakdown["activations"] > 0
    saved = by[Config(inference_mode=True)]
    assert saved.breakdown["activations"] == 0
    assert saved.peak_allocated_bytes < by[Config()].peak_allocated_bytes
    assert (
        by[Config(checkpoint="blocks")].breakdown["activations"]
        < (by[Config()].breakdown["activations"])
    )


def test_the_forward_runs_under_inference_mode_and_nothing_of_the_model_changes() -> None:
    seen: list[tuple[bool, bool]] = []

    def forward(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        out = _logits(m, ids)
        seen.append((torch.is_inference_mode_enabled(), out.requires_grad))
        return out

    torch.manual_seed(0)
    model = TinyGPT()
    _logits(model, _gpt_batch(2)).sum().backward()  # the user's own gradients stay
    trial = Trial(model, _gpt_batch(4), forward, inference=True, warmup=1, steps=2)
    random.seed(3)
    before = _state(model)
    trial.run(Config())
    assert seen == [(False, True)] * (1 + 2 + 2)  # warm-up, measured and timed forwards
    seen.clear()
    result = trial.run(Config(inference_mode=True, precision="bf16"))
    assert result.status == "ok", result.error
    assert seen == [(True, False)] * (1 + 2 + 2)
    _assert_same(before, _state(model))


def test_what_an_inference_trial_cannot_do_is_refused_with_what_it_takes() -> None:
    trial = _trial()
    for config, named in (
        (Config(optimizer="adamw"), "optimizer changes"),
        (Config(accumulate=2), "accumulate changes"),
        (Config(lora=4, optimizer="adam"), "optimizer, lora change"),
        (Config(parallel="fsdp2", world_size=1, cpu_offload=True), "parallel, cpu_offload"),
    ):
        with pytest.raises(ValueError, match=named) as caught:
            trial.run(config)
        assert "it takes precision, checkpoint, every, offload and inference_mode" in str(
            caught.value
        )
        with pytest.raises(ValueError, match=named):
            trial.estimate(config=config)
    for planner in (lambda: trial.search("1MiB"), lambda: trial.plan("1MiB")):
        with pytest.raises(ValueError, match="plans training steps; for an inference trial"):
            planner()
    model = trial.model
    with pytest.raises(ValueError, match="no optimizer: pass optimizer=None"):
        Trial(model, _gpt_batch(2), _logits, inference=True,
              optimizer=torch.optim.SGD(model.parameters()))  # fmt: skip
    with pytest.raises(TypeError, match="inference is True or False"):
        Trial(model, _gpt_batch(2), _logits, inference="yes")
    with pytest.raises(ValueError, match="inference_mode is True or False"):
        Config(inference_mode=1)


def test_a_training_trial_refuses_inference_mode() -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    trial = Trial(model, _gpt_batch(2), lambda m, b: _logits(m, b).sum(),
                  optimizer=torch.optim.SGD(model.parameters()))  # fmt: skip
    with pytest.raises(
        ValueError, match=r"is for inference trials, Trial\(\.\.\., inference=True\)"
    ):
        trial.run(Config(inference_mode=True))
    with pytest.raises(ValueError, match="is for inference trials"):
        trial.estimate(inference_mode=True)


def test_what_the_fake_forward_saves_dies_with_its_outputs_when_no_backward_runs() -> None:
    """A saved output kept as itself would hold its own grad_fn in a cycle no collector sees:
    on a GPU the warm-up's whole graph stayed through the measured step, twice the peak."""
    import weakref

    from torch._subclasses.fake_tensor import FakeTensorMode

    from jupyter_gpumem.tuner.estimation.fake_step import _saved_tagged

    class Tags:
        def __init__(self) -> None:
            self.tagged: list[str] = []

        def tag(self, t: torch.Tensor, category: str) -> None:
            self.tagged.append(category)

    tags = Tags()
    with FakeTensorMode():
        w = torch.randn(64, 64, requires_grad=True)
        hidden = torch.randn(8, 64) @ w
        with _saved_tagged(torch, tags):  # type: ignore[arg-type]  # what the hooks call
            out = torch.tanh(hidden)  # tanh saves its own output
        alive = weakref.ref(out)
        del out
    assert tags.tagged == ["activations"] and alive() is None
